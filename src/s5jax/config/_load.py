"""Loading experiment files: the packaged paper experiments, or the user's own TOML/JSON.

The paper's experiments ship inside the package as `experiments/<name>.toml`, one per
experiment. A file may say `base = "<name or path>"` to start from another experiment and
override some settings: the sections `model`, `optim`, `data` and `train` are merged key by key
(the file wins), `description` is inherited unless given, while `name` (default: the file's stem)
and the `[paper]` table (each file states its own published figure) are never inherited.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ._dict import SECTIONS, from_dict
from ._overrides import apply_overrides
from ._schema import ExperimentConfig
from ._types import ConfigError, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["experiment_path", "list_experiments", "load_experiment"]

_log = logging.getLogger(__name__)

_SUFFIXES = (".toml", ".json")
_MERGED = ("model", "optim", "data", "train")


def _packaged() -> Any:
    return resources.files("s5jax.config").joinpath("experiments")


def list_experiments() -> list[str]:
    """The names of the experiments shipped with the package, sorted.

    **Returns:** e.g. `["image", "listops", "listops-ablation-discrete-gaussian", ...]`.
    """
    return sorted(
        entry.name[: -len(".toml")]
        for entry in _packaged().iterdir()
        if entry.is_file() and entry.name.endswith(".toml")
    )


def experiment_path(name: str) -> Path:
    """The file of the packaged experiment `name` (for reading or copying as a template).

    **Arguments:**
    - `name`: a name from `list_experiments()`.

    **Returns:** the path of its TOML file.

    **Raises:** `ConfigError` when there is no such experiment (naming close matches).
    """
    if name not in list_experiments():
        raise _unknown(name)
    return Path(str(_packaged().joinpath(f"{name}.toml")))


def _unknown(name: str) -> ConfigError:
    names = list_experiments()
    hint = did_you_mean(name, names, n=5, cutoff=0.5)
    # The ablations (a `-ablation-` in the name) are counted, not listed: 55 names hide the rest.
    main = [n for n in names if "-ablation-" not in n]
    return ConfigError(
        f"unknown experiment {name!r}: {hint}known experiments: {', '.join(main)} and "
        f"{len(names) - len(main)} ablations (`s5jax list` shows all); or give the path of a "
        ".toml or .json file"
    )


def _looks_like_path(spec: str | os.PathLike) -> bool:
    text = os.fspath(spec)
    return isinstance(spec, os.PathLike) or text.endswith(_SUFFIXES) or os.sep in text


def _read(
    spec: str | os.PathLike, relative_to: Path | None
) -> tuple[dict[str, Any], str, Path | None]:
    """Read one file, unresolved: (raw dict, source label, folder for relative bases)."""
    if _looks_like_path(spec):
        path = Path(spec).expanduser()
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise ConfigError(
                f"{path}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                f"{e.start}); save the file as UTF-8"
            ) from None
        source, folder, stem, is_json = str(path), path.parent, path.stem, path.suffix == ".json"
    else:
        name = os.fspath(spec)
        if name not in list_experiments():
            raise _unknown(name)
        text = _packaged().joinpath(f"{name}.toml").read_text(encoding="utf-8")
        source, folder, stem, is_json = f"experiment {name!r}", None, name, False
    try:
        raw = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{source}: cannot parse: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a table of settings at the top level")
    raw.setdefault("name", stem)
    return raw, source, folder


def _resolve(
    spec: str | os.PathLike, relative_to: Path | None, seen: tuple[str, ...]
) -> tuple[dict[str, Any], str]:
    raw, source, folder = _read(spec, relative_to)
    if source in seen:
        raise ConfigError("circular base: " + " -> ".join((*seen, source)))
    base = raw.pop("base", None)
    if base is None:
        return raw, source
    if not isinstance(base, str):
        raise ConfigError(f"{source}: base = {base!r}: expected an experiment name or a path")
    # A packaged experiment's base is always a packaged name; a user's file may also name a
    # file relative to its own folder.
    if not _looks_like_path(base) and base not in list_experiments():
        raise ConfigError(f"{source}: base = {base!r}: {_unknown(base)}")
    parent, _ = _resolve(base, folder, (*seen, source))
    merged = dict(raw)
    for key in _MERGED:
        if key in parent or key in raw:
            for table in (parent.get(key), raw.get(key)):
                if table is not None and not isinstance(table, dict):
                    raise ConfigError(f"{source}: {key}: expected a table of settings")
            merged[key] = {**parent.get(key, {}), **raw.get(key, {})}
    if "description" not in raw and "description" in parent:
        merged["description"] = parent["description"]
    return merged, source


def load_experiment(
    name_or_path: str | os.PathLike, overrides: Sequence[str] = ()
) -> ExperimentConfig:
    """Load, resolve and validate an experiment config.

    **Arguments:**
    - `name_or_path`: a packaged experiment name (see `list_experiments()`), or the path of a
      `.toml` experiment file or of a `.json` config dumped by `dump_json`.
    - `overrides`: `section.key=value` strings applied after loading (see `apply_overrides`).

    **Returns:** the frozen, validated `ExperimentConfig`.

    **Raises:** `ConfigError` (a `ValueError`) naming the file, the key path and the problem.
    """
    raw, source = _resolve(name_or_path, None, ())
    unknown = [k for k in raw if k not in ("name", "description", *SECTIONS)]
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key {unknown[0]!r}; "
            f"{did_you_mean(unknown[0], ('name', 'description', 'base', *SECTIONS))}"
            f"valid keys: name, description, base, {', '.join(SECTIONS)}"
        )
    try:
        cfg = from_dict(raw, dumped=str(source).endswith(".json"))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    _log.debug("loaded %s; overrides: %s", source, ", ".join(overrides) or "none")
    return apply_overrides(cfg, overrides)
