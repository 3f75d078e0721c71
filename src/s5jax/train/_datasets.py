"""From a config's `data.dataset` name to a `PreparedDataset`.

Paper datasets are prepared by `s5jax.data` from the user's local copy (or generated, for the
pendulum); a missing copy raises a `DatasetError` saying what to download and where to put it.
`synthetic` is generated in memory for smoke tests. A path ending in `.npz` is a user's own
data in the documented format.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import data as s5data
from ..data import PreparedDataset, Split

__all__ = ["DATASETS", "load_dataset", "prepare_named", "synthetic_dataset"]


def synthetic_dataset(
    *, seq_len: int = 32, n_train: int = 64, n_eval: int = 32, n_classes: int = 4, seed: int = 0
) -> PreparedDataset:
    """A small long-range classification task: the class is written only in the first steps.

    Each sequence is Gaussian noise (L, 1); its first min(8, L) steps hold one of `n_classes`
    fixed ±1 patterns. Deterministic in `seed`.
    """
    rng = np.random.default_rng(seed)
    marker = min(8, seq_len)
    patterns = rng.choice([-1.0, 1.0], size=(n_classes, marker))

    def split(n):
        y = rng.integers(0, n_classes, n).astype(np.int32)
        x = (0.5 * rng.standard_normal((n, seq_len, 1))).astype(np.float32)
        x[:, :marker, 0] = patterns[y]
        return Split(x=x, y=y)

    return PreparedDataset(
        name="synthetic",
        task="classification",
        splits={"train": split(n_train), "val": split(n_eval), "test": split(n_eval)},
        n_classes=n_classes,
        meta={"description": "class written in the first steps of noise", "seed": seed},
    )


def _prepare(fn: Callable, **kwargs) -> Callable:
    def load(data_cfg):
        return fn(data_cfg.root, **kwargs) if data_cfg.root else fn(**kwargs)

    return load


DATASETS: dict[str, Callable] = {
    "synthetic": lambda cfg: synthetic_dataset(
        seq_len=cfg.seq_len or 32, n_train=cfg.n_train or 64, n_eval=cfg.n_eval or 32
    ),
    "pendulum": _prepare(s5data.prepare_pendulum),
    "listops": _prepare(s5data.prepare_listops),
    "text": _prepare(s5data.prepare_text),
    "retrieval": _prepare(s5data.prepare_retrieval),
    "image": _prepare(s5data.prepare_image),
    "scifar": _prepare(s5data.prepare_scifar),
    "smnist": _prepare(s5data.prepare_smnist),
    "psmnist": _prepare(s5data.prepare_psmnist),
    "pathfinder": _prepare(s5data.prepare_pathfinder, resolution=32),
    "pathx": _prepare(s5data.prepare_pathfinder, resolution=128),
    "speech35": _prepare(s5data.prepare_speech_commands),
}


def load_dataset(data_cfg) -> PreparedDataset:
    """The dataset named by `data_cfg.dataset` (a registered name or a path to a `.npz`)."""
    name = data_cfg.dataset
    if name.endswith(".npz"):
        from ..data._npz import load_user_npz

        return load_user_npz(Path(name))
    if name not in DATASETS:
        raise ValueError(
            f"data.dataset must be one of {sorted(DATASETS)} or a path to a .npz file, got {name!r}"
        )
    return DATASETS[name](data_cfg)


def prepare_named(name: str, source=None) -> PreparedDataset:
    """Prepare the registered dataset `name` from `source` (default: under the data root)."""
    if name not in DATASETS or name == "synthetic":
        names = sorted(n for n in DATASETS if n != "synthetic")
        raise ValueError(f"dataset must be one of {names}, got {name!r}")

    class _Cfg:
        root = None if source is None else str(source)

    return DATASETS[name](_Cfg)
