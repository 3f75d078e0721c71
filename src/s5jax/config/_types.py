"""Type checking and coercion of config values against their dataclass type hints.

Every section of an experiment config is a frozen dataclass whose type hints are the schema:
`Literal[...]` for enumerations, `bool`, `int`, `float`, `str`, `X | None` for optional values,
`FloatTable` for a small name → number table, and nested section dataclasses. The functions here
check a value against such a hint (used by `__post_init__`) and parse the string of a
command-line override into one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any, Literal, Union

__all__ = [
    "ConfigError",
    "FloatTable",
    "check_fields",
    "coerce",
    "describe_type",
    "field_hints",
    "parse_string",
]

FloatTable = tuple[tuple[str, float], ...]
"""An ordered, immutable name → number table (a dict in TOML and JSON)."""

_NONE_WORDS = ("none", "null")


class ConfigError(ValueError):
    """An experiment config is invalid. The message names the key path and the valid values."""


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of the fields of dataclass `cls`, in field order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _optional_inner(hint: Any) -> Any | None:
    """`X` when `hint` is `X | None` (or `Optional[X]`), else None."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def did_you_mean(
    word: str, choices, *, n: int = 3, cutoff: float = 0.6, substrings: bool = False
) -> str:
    """`"did you mean a, b? "` for the names among `choices` close to a mistyped `word`
    (difflib's `n` best above `cutoff`; with `substrings`, also the names that contain a
    shortened `word` of 3 or more letters, e.g. `mnist` in `smnist`), or ""."""
    names = list(choices)
    close = difflib.get_close_matches(word, names, n=n, cutoff=cutoff)
    if substrings and len(word) >= 3:
        close += [c for c in names if word in c and c not in close]
    return f"did you mean {', '.join(close)}? " if close else ""


def describe_type(hint: Any) -> str:
    """A short human name for a type hint, e.g. `int`, `float or none`, `one of 'a', 'b'`."""
    inner = _optional_inner(hint)
    if inner is not None:
        return f"{describe_type(inner)} or none"
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if hint == FloatTable:
        return "table of name = number"
    if dataclasses.is_dataclass(hint):
        return f"table [{hint.__name__}]"
    return getattr(hint, "__name__", str(hint))


def _fail(path: str, value: Any, hint: Any) -> ConfigError:
    return ConfigError(f"{path} = {value!r}: expected {describe_type(hint)}")


def coerce(path: str, value: Any, hint: Any) -> Any:
    """Check `value` against `hint` and return it in canonical form.

    Ints are accepted for floats (and become floats); a dict or a sequence of pairs is accepted
    for a `FloatTable`. Nothing else is converted: a string is never a number here (use
    `parse_string` for command-line text).

    **Arguments:**
    - `path`: the key path named in error messages, e.g. `model.d_model`.
    - `value`: the value to check.
    - `hint`: the field's resolved type hint.

    **Returns:** the value, canonicalised.

    **Raises:** `ConfigError` naming `path`, the expected type and the value.
    """
    inner = _optional_inner(hint)
    if inner is not None:
        return None if value is None else coerce(path, value, inner)
    if typing.get_origin(hint) is Literal:
        if not isinstance(value, str) or value not in typing.get_args(hint):
            raise _fail(path, value, hint)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _fail(path, value, hint)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(path, value, hint)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, value, hint)
        if not math.isfinite(value):
            raise ConfigError(f"{path} = {value!r}: expected a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _fail(path, value, hint)
        return value
    if hint == FloatTable:
        return _coerce_table(path, value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise _fail(path, value, hint)
        return value
    raise TypeError(f"{path}: unsupported type hint {hint!r}")  # a schema bug, not a user error


def _coerce_table(path: str, value: Any) -> FloatTable:
    items = value.items() if isinstance(value, dict) else value
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise _fail(path, value, FloatTable) from None
    out = []
    for key, item in pairs:
        if not isinstance(key, str):
            raise _fail(path, value, FloatTable)
        out.append((key, coerce(f"{path}.{key}", item, float)))
    return tuple(out)


def check_fields(obj: Any, section: str) -> None:
    """Check and canonicalise every field of the frozen dataclass `obj` in place.

    **Arguments:**
    - `obj`: a dataclass instance (called from its `__post_init__`).
    - `section`: the key-path prefix for error messages (`"model"`), or "" at top level.
    """
    prefix = f"{section}." if section else ""
    for name, hint in field_hints(type(obj)).items():
        value = coerce(prefix + name, getattr(obj, name), hint)
        object.__setattr__(obj, name, value)


def _whole(text: str) -> int | None:
    """The whole number a float literal such as `1e3` or `64.0` spells, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def parse_string(path: str, text: str, hint: Any) -> Any:
    """Parse command-line text into a value of type `hint`.

    `true`/`false` for bools, Python int and float literals (`64`, `1e-3`), `none`/`null` for
    optional values, and plain text (optionally quoted) for strings and enumerations.

    **Arguments:**
    - `path`: the key path named in error messages.
    - `text`: the text after `=` in `section.key=value`.
    - `hint`: the field's resolved type hint.

    **Returns:** the parsed value (still to be validated by the dataclass).

    **Raises:** `ConfigError` naming `path`, the expected type and the text.
    """
    text = text.strip()
    inner = _optional_inner(hint)
    if inner is not None:
        if text.lower() in _NONE_WORDS:
            return None
        return parse_string(path, text, inner)
    if hint is str or typing.get_origin(hint) is Literal:
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        return text
    try:
        if hint is bool:
            lowered = text.lower()
            if lowered in ("true", "false"):
                return lowered == "true"
        elif hint is int:
            return int(text)
        elif hint is float:
            value = float(text)
            if math.isfinite(value):
                return value
            raise ConfigError(f"{path}={text!r}: expected a finite number")
    except ConfigError:
        raise
    except ValueError:
        pass
    if hint is int and _whole(text) is not None:
        raise ConfigError(f"{path}={text!r}: expected int; write it as {_whole(text)}")
    if hint in (bool, int, float):
        raise ConfigError(f"{path}={text!r}: expected {describe_type(hint)}")
    raise ConfigError(f"{path}: a {describe_type(hint)} cannot be set from the command line")
