"""Typed, frozen experiment configs: the paper's experiments, overrides, validation, dumping.

Hand-written on purpose: frozen dataclasses and `tomllib` give strict validation with errors
that name the key and the fix, and no dependency; a config library (Hydra, ml_collections)
would add one and accept what this rejects.

One TOML file per experiment ships in `s5jax/config/experiments/` with the values of the paper's
Table 11 (P there is P_full), the task exceptions of its Appendix G.3, the authors' run-script
values where those differ (the Table 11 cell is kept in `paper.table11`), and the published
figure (`paper`). Typical use::

    from s5jax.config import apply_overrides, dump_json, load_experiment

    cfg = load_experiment("listops", overrides=["train.epochs=2", "model.d_model=64"])
    dump_json(cfg, run_dir / "config.json")      # loads back identical
    assert load_experiment(run_dir / "config.json") == cfg
    print(to_toml(cfg))                          # what `s5jax config listops` prints

Every invalid setting raises `ConfigError` (a `ValueError`) naming the key path and the valid
values. This package imports only the standard library (and `tomli` on Python 3.10).
"""

from ._dict import dump_json, from_dict, to_dict
from ._load import experiment_path, list_experiments, load_experiment
from ._overrides import apply_overrides, parse_override
from ._schema import (
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    OptimConfig,
    PaperResult,
    TrainConfig,
)
from ._toml import dump_toml, to_toml
from ._types import ConfigError

__all__ = [
    "ConfigError",
    "DataConfig",
    "ExperimentConfig",
    "ModelConfig",
    "OptimConfig",
    "PaperResult",
    "TrainConfig",
    "apply_overrides",
    "dump_json",
    "dump_toml",
    "experiment_path",
    "from_dict",
    "list_experiments",
    "load_experiment",
    "parse_override",
    "to_dict",
    "to_toml",
]
