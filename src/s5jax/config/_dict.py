"""Converting configs to and from plain dicts, and dumping them as JSON.

`to_dict` gives nested JSON-ready dicts; `from_dict` is its strict inverse (an unknown key is an
error that lists the valid keys), so a resolved config dumped to a run directory loads back
identical. Missing keys take the dataclass defaults.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_text
from ._schema import (
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    OptimConfig,
    PaperResult,
    TrainConfig,
)
from ._types import ConfigError, FloatTable, did_you_mean, field_hints

log = logging.getLogger("s5jax")

__all__ = ["SECTIONS", "dump_json", "from_dict", "to_dict"]

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "paper": PaperResult,
}
"""The sections of an experiment config, by key."""


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as nested plain dicts (JSON-ready; tables become dicts).

    **Arguments:**
    - `cfg`: the experiment config.

    **Returns:** a dict with keys `name`, `description`, `model`, `optim`, `data`, `train`,
    `paper` (None when the config records no published figure).
    """
    return _plain(cfg)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        hints = field_hints(type(obj))
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            out[f.name] = dict(value) if hints[f.name] == FloatTable else _plain(value)
        return out
    return obj


#: Keys that earlier versions accepted but nothing read; a run directory's config.json from
#: then still loads (the key is dropped with a warning), while a new config naming one is an
#: error that says why.
REMOVED = {
    ("train", "eval_every"): "validation runs after every epoch",
    ("data", "pendulum_sample_rate"): "the pendulum keeps 50 of 100 frames, as the published data",
}


#: Settings added later whose default differs from what runs written before them did: a run
#: directory's `config.json` without the key gets the old behaviour (so its checkpoints
#: predict as they did), with an info line; a TOML config gets the new default.
ADDED = {
    ("model", "head_activation"): (
        "relu",
        "the Gaussian head used ReLU before it was a setting",
        lambda section: section.get("head") == "gaussian",
    ),
}


def _fill_added(key: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    missing = {k: v for (s, k), v in ADDED.items() if s == key and k not in raw}
    for k, (value, why, matters) in missing.items():
        if matters(raw):
            log.info("%s.%s = %r (absent from this config.json: %s)", key, k, value, why)
    return {**raw, **{k: value for k, (value, *_) in missing.items()}}


def _drop_removed(key: str, raw: Mapping[str, Any], source: str | None) -> Mapping[str, Any]:
    removed = [k for k in raw if (key, k) in REMOVED]
    if not removed:
        return raw
    if source != "json":
        k = removed[0]
        raise ConfigError(f"{key}.{k} was removed (it had no effect: {REMOVED[(key, k)]}); "
                          "delete it")  # fmt: skip
    for k in removed:
        log.warning("%s.%s is ignored: it had no effect (%s)", key, k, REMOVED[(key, k)])
    return {k: v for k, v in raw.items() if (key, k) not in REMOVED}


def _section(cls: type, key: str, raw: Any, source: str | None = None) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: expected a table of settings, got {raw!r}")
    raw = _drop_removed(key, raw, source)
    if source == "json":
        raw = _fill_added(key, raw)
    valid = list(field_hints(cls))
    unknown = [k for k in raw if k not in valid]
    if unknown:
        raise ConfigError(f"{key}: {unknown_key(key, unknown[0], qualified=False)}")
    return cls(**raw)


#: The config's derived values (properties of its sections), what each is made of, and so
#: which keys set it; `--set optim.lr=...` names them instead of "unknown key".
DERIVED = {
    "optim.lr": "optim.lr_factor * optim.ssm_lr (the authors' convention): set optim.lr_factor "
    "to the lr you want / optim.ssm_lr",
    "model.state_size": "the states stored: model.ssm_size / 2 with model.conj_sym, else "
    "model.ssm_size",
    "model.block_size": "model.ssm_size / model.blocks",
    "data.resolved_eval_batch_size": "data.eval_batch_size, or data.batch_size when that is none",
    "paper.scale": "the factor of paper.unit (0.01 for %)",
    "paper.raw_value": "paper.value times the factor of paper.unit",
}


def unknown_key(section: str, name: str, *, qualified: bool = True) -> str:
    """Why `section.name` is not a setting, and what to write: a derived value names the keys
    it comes from (`optim.lr`); a key of another section names that section (`train.batch_size`
    → `data.batch_size`); else the close names and the section's valid keys. The unknown key
    is named `section.name`, or `name` alone when not `qualified` (in a file's `[section]`)."""
    key = f"{section}.{name}"
    if key in DERIVED:
        return f"{key} is derived, not set: it is {DERIVED[key]}"
    valid = list(field_hints(SECTIONS[section]))
    elsewhere = [f"{other}.{name}" for other, cls in SECTIONS.items()
                 if other != section and name in field_hints(cls)]  # fmt: skip
    elsewhere += [k for k in DERIVED if k.endswith(f".{name}")]
    hint = f"did you mean {' or '.join(elsewhere)}? " if elsewhere else did_you_mean(name, valid)
    named = key if qualified else name
    return f"unknown key {named!r}; {hint}valid keys of [{section}]: {', '.join(valid)}"


def from_dict(raw: Mapping[str, Any], *, dumped: bool = False) -> ExperimentConfig:
    """Build and validate an `ExperimentConfig` from nested dicts (the inverse of `to_dict`).

    **Arguments:**
    - `raw`: a mapping with `name` and optionally `description`, the section tables `model`,
      `optim`, `data`, `train` and `paper` (None or absent: no published figure).
    - `dumped`: `raw` comes from a `config.json` that an earlier version wrote: keys removed
      since (`REMOVED`) are dropped with a warning instead of refused.

    **Returns:** the validated, frozen config.

    **Raises:** `ConfigError` for unknown keys (listing the valid ones), wrong types or values.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"an experiment config must be a table, got {raw!r}")
    valid = list(field_hints(ExperimentConfig))
    unknown = [k for k in raw if k not in valid]
    if unknown:
        raise ConfigError(f"unknown top-level key {unknown[0]!r}; valid keys: {', '.join(valid)}")
    if "name" not in raw:
        raise ConfigError("name: missing; every experiment config needs a name")
    kwargs: dict[str, Any] = {k: raw[k] for k in ("name", "description") if k in raw}
    for key, cls in SECTIONS.items():
        if key in raw and raw[key] is not None:
            kwargs[key] = _section(cls, key, raw[key], "json" if dumped else None)
    return ExperimentConfig(**kwargs)


def dump_json(cfg: ExperimentConfig, path: str | os.PathLike) -> Path:
    """Write the config as indented JSON, atomically (temporary sibling, then rename).

    **Arguments:**
    - `cfg`: the experiment config.
    - `path`: the file to write; its folder is created if needed.

    **Returns:** the path written.
    """
    path = Path(path)
    text = json.dumps(to_dict(cfg), indent=2) + "\n"
    atomic_write_text(path, text)
    return path
