"""Writing a resolved config as TOML, in the layout of the packaged experiment files.

TOML has no null: a field that is `None` is written as a comment (`# key = none`), and since
every optional field defaults to `None`, the file loads back to the same config. Name → number
tables (`paper.extra`, `paper.table11`) become sub-tables. `load_experiment` reads the text back
to an equal config (a test checks this for every packaged experiment).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_text
from ._dict import SECTIONS
from ._schema import ExperimentConfig
from ._types import FloatTable, field_hints

__all__ = ["dump_toml", "to_toml"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _string(name)


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:  # control characters must be escaped in TOML
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # the schema rejects these; never reached from a config
            raise ValueError(f"TOML cannot hold the non-finite float {value!r} here")
        return repr(value)  # shortest round-tripping form; '1e-08' and '0.001' are TOML floats
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"no TOML form for {value!r}")


def _table(header: str, obj: Any) -> list[str]:
    """`[header]` with the scalar fields of dataclass `obj`, then its name → number tables."""
    lines, subtables = [f"[{header}]"], []
    for name, hint in field_hints(type(obj)).items():
        value = getattr(obj, name)
        if hint == FloatTable:
            subtables.append((name, value))
        elif value is None:
            lines.append(f"# {name} = none")
        else:
            lines.append(f"{_key(name)} = {_value(value)}")
    for name, pairs in subtables:
        lines += ["", f"[{header}.{_key(name)}]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in pairs]
    return lines


def to_toml(cfg: ExperimentConfig) -> str:
    """The config as TOML text that `load_experiment` reads back to an equal config.

    **Arguments:**
    - `cfg`: the experiment config (e.g. after overrides).

    **Returns:** the text: `name` and `description`, then one table per section
    (`[model]`, `[optim]`, `[data]`, `[train]`, and `[paper]` when the config has one).
    """
    lines = [f"name = {_string(cfg.name)}", f"description = {_string(cfg.description)}"]
    for key in SECTIONS:
        section = getattr(cfg, key)
        if section is None:  # only `paper` may be None: no published figure
            lines += ["", f"# [{key}]: none"]
        else:
            assert dataclasses.is_dataclass(section)
            lines += ["", *_table(key, section)]
    return "\n".join(lines) + "\n"


def dump_toml(cfg: ExperimentConfig, path: str | os.PathLike) -> Path:
    """Write the config as TOML, atomically (temporary sibling, then rename).

    **Arguments:**
    - `cfg`: the experiment config.
    - `path`: the file to write; its folder is created if needed.

    **Returns:** the path written.
    """
    path = Path(path)
    atomic_write_text(path, to_toml(cfg))
    return path
