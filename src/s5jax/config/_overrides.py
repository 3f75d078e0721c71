"""Command-line overrides: `section.key=value` strings applied to a config.

Values are parsed with the field's type (`true`/`false`, ints, floats such as `1e-3`, `none` for
optional values, plain text for strings and enumerations); all overrides are applied first and
the result is validated once, so related settings (say `model.ssm_size` and `model.blocks`) can
change together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._dict import SECTIONS, from_dict, to_dict, unknown_key
from ._schema import ExperimentConfig
from ._types import ConfigError, did_you_mean, field_hints, parse_string

__all__ = ["apply_overrides", "parse_override"]

_TOP_LEVEL = ("name", "description")


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one `section.key=value` string into its key path and typed value.

    **Arguments:**
    - `text`: e.g. `"model.d_model=64"`, `"optim.grad_clip=none"`, or `"name=my-run"`.

    **Returns:** `(key_path, value)`, e.g. `("model.d_model", 64)`.

    **Raises:** `ConfigError` for a malformed string, an unknown section or key (listing the valid
    ones), or a value that does not parse as the field's type.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected section.key=value, e.g. model.d_model=64")
    parts = key.split(".")
    if len(parts) == 1:
        if key not in _TOP_LEVEL:
            raise ConfigError(
                f"override {text!r}: unknown key {key!r}; use one of {', '.join(_TOP_LEVEL)} or "
                f"section.key with a section among {', '.join(SECTIONS)}"
            )
        return key, parse_string(key, value, str)
    if len(parts) != 2:
        raise ConfigError(f"override {text!r}: expected section.key=value (one dot)")
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(
            f"override {text!r}: unknown section {section!r}; {did_you_mean(section, SECTIONS)}"
            f"valid sections: {', '.join(SECTIONS)}"
        )
    hints = field_hints(SECTIONS[section])
    if name not in hints:
        raise ConfigError(f"override {text!r}: {unknown_key(section, name)}")
    return key, parse_string(key, value, hints[name])


def apply_overrides(cfg: ExperimentConfig, overrides: Iterable[str]) -> ExperimentConfig:
    """Return a copy of `cfg` with `section.key=value` overrides applied and validated.

    **Arguments:**
    - `cfg`: the config to start from.
    - `overrides`: strings such as `"model.d_model=64"`, `"optim.ssm_lr=1e-3"`,
      `"train.epochs=2"`, `"optim.grad_clip=none"`; a later one wins over an earlier one.

    **Returns:** the new, validated config (`cfg` itself when there are no overrides).

    **Raises:** `ConfigError` (a `ValueError`) naming the key, the expected type or valid
    values, and the offending value.
    """
    raw = to_dict(cfg)
    changed = False
    for text in overrides:
        path, value = parse_override(text)
        section, _, name = path.rpartition(".")
        if not section:
            raw[name] = value
        else:
            if raw[section] is None:
                raw[section] = {}
            raw[section][name] = value
        changed = True
    return from_dict(raw) if changed else cfg
