"""Run-level entry points above the epoch loop: evaluating a finished run, training on a
user's own `.npz` with a sensible default model, and where each dataset comes from."""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import DataConfig, ExperimentConfig, apply_overrides, load_experiment
from ..config._overrides import parse_override
from ..data import PreparedDataset, data_root
from ..data._normalize import normalize_dataset
from ..data._prepared import with_digest
from ..data._uea import announce_val_split
from ._checkpoint import Checkpoints
from ._data_spec import DATA_SPEC, check_same_data, dataset_from_spec
from ._datasets import load_dataset, load_user_data
from ._defaults import N_LAYERS, _text, choose_defaults, inspect_data, uncarved
from ._engine import _Run
from ._rundir import run_order

__all__ = [
    "DATA_SOURCES",
    "data_status",
    "evaluate_run",
    "load_run",
    "user_data_config",
    "user_data_defaults",
]

#: Where each dataset comes from: generated here, or what to download and where to put it.
DATA_SOURCES: dict[str, str] = {
    "synthetic": "generated in memory",
    "pendulum": "generated here (`s5jax data prepare pendulum`)",
    "listops": "LRA release `lra_release.gz` → $S5JAX_DATA/lra_release/ (or generate: "
    "`s5jax data prepare listops --generate`)",
    "text": "Stanford `aclImdb_v1.tar.gz` → $S5JAX_DATA/aclImdb/",
    "retrieval": "LRA release `lra_release.gz` → $S5JAX_DATA/lra_release/ (tsv_data)",
    "image": "CIFAR-10 python `cifar-10-python.tar.gz` → $S5JAX_DATA/cifar/",
    "scifar": "CIFAR-10 python `cifar-10-python.tar.gz` → $S5JAX_DATA/cifar/",
    "smnist": "MNIST IDX files → $S5JAX_DATA/mnist/",
    "psmnist": "MNIST IDX files → $S5JAX_DATA/mnist/",
    "pathfinder": "LRA release `lra_release.gz` → $S5JAX_DATA/lra_release/ (pathfinder32) "
    "(or generate: `s5jax data prepare pathfinder --generate`)",
    "pathx": "LRA release `lra_release.gz` → $S5JAX_DATA/lra_release/ (pathfinder128) "
    "(or generate: `s5jax data prepare pathx --generate`)",
    "speech35": "Speech Commands v0.02 `speech_commands_v0.02.tar.gz` → "
    "$S5JAX_DATA/speech_commands/",
}


def data_status(dataset: str) -> str:
    """`"ready"` when prepared under the data root, `"generated"`, or `"missing"`."""
    if dataset == "synthetic":
        return "generated"
    if dataset == "pendulum":
        return (
            "ready"
            if (data_root() / "pendulum" / "pend_regression.npz").is_file()
            else ("generated on first use")
        )
    from ._datasets import PREPARED_FOLDERS

    folder = data_root() / "prepared" / PREPARED_FOLDERS.get(dataset, dataset)
    return "ready" if (folder / "meta.json").is_file() else "missing"


def prepared_note(dataset: str, seq_len: int | None = None) -> str:
    """What `s5jax list` adds to a prepared dataset's "ready": `"generated"` when it was
    generated here (not the release: results on it are not comparable with the paper's), and
    its length when that is not `seq_len` (training would stop at the length check), e.g.
    `"generated; L 250, not 2048"`; "" otherwise or when unread."""
    import json

    import numpy as np

    from ._datasets import PREPARED_FOLDERS

    folder = data_root() / "prepared" / PREPARED_FOLDERS.get(dataset, dataset)
    notes = []
    try:
        if json.loads((folder / "meta.json").read_text()).get("meta", {}).get("generated"):
            notes.append("generated")
        x = np.load(folder / "train_x.npy", mmap_mode="r")  # reads the header only
    except (OSError, ValueError, AttributeError):
        return "; ".join(notes)
    length = x.shape[-1] if np.issubdtype(x.dtype, np.integer) else x.shape[1]
    if seq_len is not None and length != seq_len:
        notes.append(f"L {length}, not {seq_len}")
    return "; ".join(notes)


def user_data_config(path: str | os.PathLike, overrides=()) -> tuple[ExperimentConfig, Any]:
    """A default experiment for a user's `.npz`, its settings chosen from the data.

    **Returns:** `(config, dataset)`, the dataset normalised as `config.data.normalize` says.
    See `user_data_defaults`, which also returns what was chosen and why.
    """
    config, dataset, _facts, _chosen = user_data_defaults(path, overrides)
    return config, dataset


def user_data_defaults(path: str | os.PathLike, overrides=(), *, selects_by_val: bool = False):
    """A default experiment for a user's data file, with every unset setting chosen from the
    training split by the rules of `s5jax.train._defaults` (normalisation, direction and
    norm, timescales, width, batch, budget); `overrides` (`section.key=value`) always win.

    Classification: mean pooling (masked mean when lengths are given) and a classification
    head. Regression per step: no pooling; per sequence: mean pooling. Token inputs use the
    embedding encoder. 4 layers, pre-norm, half-GLU activation.

    A val split carved from a `.ts` training file that is too small to select with is not
    carved (`s5jax.train._defaults.uncarved`) unless `selects_by_val` (a sweep, which ranks
    its trials by their val figure, keeps it).

    **Returns:** `(config, dataset, facts, chosen)`: the resolved config, the dataset
    normalised as `config.data.normalize` says, the `DataFacts` measured and the list of
    `Choice`s (key, value, reason) the run prints first and records in run_info.json.
    """
    user = dict(parse_override(o) for o in overrides)
    raw = load_user_data(path, _data_options(overrides), announce=False)
    facts = inspect_data(raw)
    first = None if selects_by_val else uncarved(facts, user)
    if first is not None:
        options = [*overrides, f"data.val_fraction={first.value}"]
        raw = load_user_data(path, _data_options(options), announce=False)
        facts = inspect_data(raw)
    announce_val_split(raw)
    chosen = ([] if first is None else [first]) + choose_defaults(facts, user)
    train = raw.splits["train"]
    pooling = "none" if facts.per_step else (
        "masked_mean" if train.lengths is not None else "mean")  # fmt: skip
    base = load_experiment("synthetic")
    model = replace(
        base.model, n_layers=N_LAYERS, d_model=64, ssm_size=64, blocks=4, norm="layer",
        encoder="embedding" if raw.vocab_size is not None else "dense", pooling=pooling,
        head="classification" if raw.task == "classification" else "regression",
    )  # fmt: skip
    data = DataConfig(dataset=str(Path(path).resolve()), batch_size=32)
    train_cfg = replace(base.train, epochs=20, log_every=50)
    cfg = replace(base, name=Path(path).stem or "user-data", model=model, data=data,
                  train=train_cfg, description=f"user data {path}")  # fmt: skip
    settings = [f"{c.key}={_text(c.value)}" for c in chosen]
    cfg = apply_overrides(cfg, [*settings, *overrides])
    dataset = normalize_dataset(with_digest(raw), cfg.data.normalize, cfg.data.normalize_targets)
    return cfg, dataset, facts, chosen


def _data_options(overrides) -> DataConfig:
    """The `data.*` settings among `overrides` (how a `.ts` file is read: missing values,
    val split), applied before the data is read."""
    data = [o for o in overrides if o.strip().startswith("data.")]
    return apply_overrides(load_experiment("synthetic"), data).data


def _not_a_run(run_dir: Path) -> str:
    """Why `run_dir` (a folder without config.json) is no run; for a sweep or seeds directory,
    which of its runs to give instead (a sweep's selected trial, a seeds directory's first)."""
    runs = [d for d in run_dir.glob("*") if d.name.startswith(("trial-", "seed-"))]
    runs = sorted((d for d in runs if (d / "config.json").is_file()), key=run_order)
    if not runs:
        return f"{run_dir} is not an s5jax run directory"
    kind = "sweep" if runs[0].name.startswith("trial-") else "seeds"
    pick, why = runs[0], "e.g."
    if kind == "sweep":
        try:
            selected = json.loads((run_dir / "summary.json").read_text()).get("selected")
        except (OSError, ValueError, AttributeError):
            selected = None
        if isinstance(selected, str) and (run_dir / selected / "config.json").is_file():
            pick, why = run_dir / selected, "the selected trial:"
    return f"{run_dir} is a {kind} directory; give one of its runs ({why} {pick})"


def load_run(
    run_dir: str | os.PathLike,
    which: str = "best",
    *,
    dataset: PreparedDataset | None = None,
    examples: bool = True,
) -> _Run:
    """A finished run rebuilt from `run_dir/config.json`, with its `which` checkpoint loaded.

    The model's input width, vocabulary and outputs follow the run's training data, so
    `dataset` (default: the one `config.data` names) must be the data it was trained on.
    With `examples=False` (the caller needs the model, not the training examples: export,
    predictions on new data) a run's `data_spec.json` stands in for the data, which then
    need not be present (`s5jax.train._data_spec`).
    """
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not run_dir.exists():
        raise FileNotFoundError(
            f"{run_dir}: no such run directory (give the --workdir of an `s5jax train` run)"
        )
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: {_not_a_run(run_dir)}")
    config = load_experiment(config_path)
    if dataset is None:
        spec = run_dir / DATA_SPEC
        if not examples and spec.is_file():
            dataset = dataset_from_spec(spec, rows=config.data.batch_size)
        else:
            dataset = _training_data(config, run_dir)
            check_same_data(
                run_dir, dataset, "the figures are those of the data as they are now, not of "
                "the data the run trained on",
            )  # fmt: skip
    run = _Run(config, run_dir, dataset, io.StringIO())
    run.build()
    ckpt = Checkpoints(run_dir)
    try:
        tree, _ = ckpt.restore(which, run.train_state())
    finally:
        ckpt.close()
    run.load_train_state(tree)
    return run


def _training_data(config: ExperimentConfig, run_dir: Path) -> PreparedDataset:
    source = Path(config.data.dataset)
    if source.suffix.lower() in (".npz", ".ts") and not source.exists():
        spec = run_dir / DATA_SPEC
        without = (
            "; export and predict --data NEW work without it"
            if spec.is_file()
            else " (eval, predict and export rebuild the model's input width, classes and "
            "normalisation from the training data)"
        )
        raise FileNotFoundError(
            f"{run_dir} was trained on {source}, which is not there any more: put the file "
            f"back at that path{without}"
        )
    return load_dataset(config.data, announce=False)  # said when the run trained


def evaluate_run(
    run_dir: str | os.PathLike,
    *,
    split: str = "test",
    step_rescale: float = 1.0,
    which: str = "best",
    dataset: PreparedDataset | None = None,
) -> dict[str, float]:
    """Evaluate a run's `which` checkpoint ("best" or "latest") on `split`.

    `step_rescale` multiplies every Δ (e.g. 2 for 8 kHz audio on a 16 kHz model).
    """
    run = load_run(run_dir, which, dataset=dataset)
    if split not in run.dataset.splits:
        raise ValueError(
            f"--split {split!r}: the run's data has the splits "
            f"{', '.join(sorted(run.dataset.splits))}"
        )
    result = run.evaluate(split, step_rescale)
    return {"split": split, "step_rescale": step_rescale, "checkpoint": which, **result}
