"""What a run's model needs to know about its training data, kept in the run directory.

The model's input width, vocabulary, classes, output width and the inputs' normalisation all
follow the training data. `s5jax train` writes them to `RUN/data_spec.json` when a run starts,
so that `s5jax export` and `s5jax predict --data NEW` work from the run directory alone: on
another machine, or after the training file has moved. (`s5jax eval`, and `predict` on the
run's own data, still read the data itself.)

`dataset_from_spec` rebuilds a stand-in `PreparedDataset`: one training split of zeros with
the training data's shapes and dtypes (as many rows as a training batch, so the run's step
count is defined), and the same task, classes, vocabulary and `meta` (normalisation included).
Everything `load_run` derives from the data is then what the real data gives; the tests
check that exports and predictions from it equal those made with the real data.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import atomic_write_json
from ..data import DatasetError, PreparedDataset, Split
from ..data._prepared import DIGEST

__all__ = [
    "DATA_SPEC",
    "SPEC_ONLY",
    "check_same_data",
    "data_spec",
    "dataset_from_spec",
    "write_data_spec",
]

DATA_SPEC = "data_spec.json"
FORMAT = 1
#: `meta` key marking a stand-in dataset: it holds shapes, not examples.
SPEC_ONLY = "spec_only"

_log = logging.getLogger(__name__)


def _array(a: np.ndarray) -> dict[str, Any]:
    return {"shape": list(a.shape[1:]), "dtype": a.dtype.name}


def data_spec(dataset: PreparedDataset) -> dict[str, Any]:
    """The JSON record of `dataset`'s training split shapes and model-facing facts."""
    train = dataset.splits["train"]
    return {
        "format": FORMAT,
        "name": dataset.name,
        "task": dataset.task,
        "n_classes": dataset.n_classes,
        "vocab_size": dataset.vocab_size,
        "train": {
            "x": _array(train.x),
            "y": _array(train.y),
            "lengths": None if train.lengths is None else _array(train.lengths),
            "t": None if train.t is None else _array(train.t),
        },
        "meta": dataset.meta,
    }


def write_data_spec(folder: str | os.PathLike, dataset: PreparedDataset) -> None:
    """Write `folder/data_spec.json` atomically (`meta` values JSON cannot hold as text)."""
    atomic_write_json(Path(folder) / DATA_SPEC, data_spec(dataset), default=str)


def check_same_data(folder: str | os.PathLike, dataset: PreparedDataset, consequence: str) -> bool:
    """Warn when `dataset`'s digest (`meta["digest"]`, `s5jax.data._prepared.data_digest`)
    differs from the one `folder/data_spec.json` recorded when the run last started or
    resumed (each rewrites it): regenerated or edited data under the same name.
    `consequence` says what that means for the caller. Returns whether they differ; a spec
    or dataset without a digest (a run from before digests, data given from Python) is not
    compared."""
    path = Path(folder) / DATA_SPEC
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["meta"].get(DIGEST)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    now = dataset.meta.get(DIGEST)
    if not (recorded and now) or recorded == now:
        return False
    _log.warning(
        "%s: the data differ from those the run last started or resumed on (its %s "
        "records %s, the data now give %s): %s", folder, DATA_SPEC, recorded, now, consequence,
    )  # fmt: skip
    return True


def dataset_from_spec(path: str | os.PathLike, rows: int) -> PreparedDataset:
    """A stand-in dataset from `data_spec.json`: `rows` training examples of zeros."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if spec["format"] != FORMAT:
            raise ValueError(f"format {spec['format']!r}, this s5jax reads {FORMAT}")
        train = spec["train"]

        def zeros(field: str) -> np.ndarray:
            return np.zeros((rows, *train[field]["shape"]), np.dtype(train[field]["dtype"]))

        x = zeros("x")
        # full-length examples: the steps of token ids (N, L) or (N, 2, L), or of (N, L, D)
        length = x.shape[-1] if np.issubdtype(x.dtype, np.integer) else x.shape[1]
        lengths = t = None
        if train["lengths"] is not None:
            lengths = zeros("lengths") + length
        if train["t"] is not None:
            t = zeros("t") + np.arange(train["t"]["shape"][-1], dtype=train["t"]["dtype"])
        split = Split(x=x, y=zeros("y"), lengths=lengths, t=t)
        return PreparedDataset(
            name=spec["name"],
            task=spec["task"],
            splits={"train": split},
            n_classes=int(spec["n_classes"]),
            vocab_size=spec["vocab_size"],
            meta={**spec["meta"], SPEC_ONLY: True},
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{path} is unreadable ({e}); it was written by s5jax train") from None
