"""The cached, prepared form every dataset takes before training.

A prepared dataset is one folder::

    meta.json                 name, task, sizes, vocab, description, extra facts
    {split}_x.npy             (N, L) int tokens, or (N, L, D) float features; retrieval: (N, 2, L)
    {split}_y.npy             (N,) int labels, or float targets (N,) / (N, L, D_out)
    {split}_lengths.npy       optional (N,) valid lengths (retrieval: (N, 2))
    {split}_t.npy             optional (N, L) observation times (irregular sampling)

Arrays are plain `.npy` so that loading is a memory map: preparation runs once, training
reads it trivially. The folder is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ._common import DatasetError, atomic_dir

__all__ = [
    "DIGEST",
    "PreparedDataset",
    "Split",
    "data_digest",
    "load_prepared",
    "save_prepared",
    "with_digest",
]

_FIELDS = ("x", "y", "lengths", "t")
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Split:
    """One split of a dataset: inputs, targets and optional lengths and observation times."""

    x: np.ndarray
    y: np.ndarray
    lengths: np.ndarray | None = None
    t: np.ndarray | None = None

    def __post_init__(self):
        n = len(self.x)
        for name in ("y", "lengths", "t"):
            arr = getattr(self, name)
            if arr is not None and len(arr) != n:
                raise DatasetError(
                    f"split field {name!r} has {len(arr)} rows but x has {n}; every field of a "
                    "split needs one row per example"
                )

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset ready for training.

    **Arguments:**
    - `name`: dataset name, e.g. `"listops"`.
    - `task`: `"classification"` or `"regression"`.
    - `splits`: mapping from split name (`"train"`, `"val"`, `"test"`, others) to `Split`.
    - `n_classes`: number of classes (classification), else 0.
    - `vocab_size`: number of token ids when `x` holds integer tokens, else `None`.
    - `meta`: extra JSON-serialisable facts (source path, preprocessing, counts...).
    """

    name: str
    task: str
    splits: dict[str, Split]
    n_classes: int = 0
    vocab_size: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in ("classification", "regression"):
            raise DatasetError(f"task must be 'classification' or 'regression', got {self.task!r}")
        for split_name, split in self.splits.items():
            if len(split) == 0:
                raise DatasetError(f"dataset {self.name!r}: split {split_name!r} is empty")


#: `meta` key of `with_digest`: the checksum of the examples as read, before normalisation.
DIGEST = "digest"


def data_digest(dataset: PreparedDataset) -> str:
    """A checksum of every split's examples (`x`, `y`, `lengths`, `t`: each array's shape,
    dtype and bytes, splits in name order), to tell whether a run's data changed between
    its start and a resume or an evaluation.

    CRC-32 (`zlib`, about 4 GB/s here): it detects changed data, not tampering. Taken on
    the data as read, before normalisation, whose float statistics may differ in their last
    bits from one host to another.
    """
    crc = 0
    for name in sorted(dataset.splits):
        split = dataset.splits[name]
        for key in _FIELDS:
            a = getattr(split, key)
            head = f"{name}.{key}:" + ("none" if a is None else f"{a.dtype.str}{a.shape}")
            crc = zlib.crc32(head.encode(), crc)
            if a is not None and a.size:
                crc = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), crc)
    return f"crc32:{crc:08x}"


def with_digest(dataset: PreparedDataset) -> PreparedDataset:
    """`dataset` with `meta["digest"]` (`data_digest`), which a run records in its
    data_spec.json."""
    return replace(dataset, meta={**dataset.meta, DIGEST: data_digest(dataset)})


def save_prepared(folder: str | os.PathLike, dataset: PreparedDataset) -> Path:
    """Write `dataset` to `folder` atomically (an existing folder is replaced)."""
    folder = Path(folder)
    meta = {
        "format_version": _FORMAT_VERSION,
        "name": dataset.name,
        "task": dataset.task,
        "n_classes": dataset.n_classes,
        "vocab_size": dataset.vocab_size,
        "splits": {},
        "meta": dataset.meta,
    }
    with atomic_dir(folder) as tmp:
        for split_name, split in dataset.splits.items():
            present = []
            for name in _FIELDS:
                arr = getattr(split, name)
                if arr is not None:
                    np.save(tmp / f"{split_name}_{name}.npy", np.asarray(arr))
                    present.append(name)
            meta["splits"][split_name] = {"n": len(split), "fields": present}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return folder


def load_prepared(folder: str | os.PathLike, *, mmap: bool = True) -> PreparedDataset:
    """Load a prepared dataset; arrays are memory-mapped unless `mmap=False`."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise DatasetError(
            f"{meta_path} not found: {folder} is not a prepared dataset "
            "(run `s5jax data prepare NAME` first)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError included
        raise DatasetError(f"{meta_path} cannot be read ({e}); prepare the dataset again") from None
    needed = ("name", "task", "splits", "n_classes", "vocab_size", "meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("splits"), dict):
        raise DatasetError(f"{meta_path} is not a prepared dataset's record; prepare it again")
    if missing := [key for key in needed if key not in meta]:
        raise DatasetError(f"{meta_path} lacks {', '.join(missing)}; prepare the dataset again")
    if meta.get("format_version") != _FORMAT_VERSION:
        raise DatasetError(
            f"{meta_path}: format_version {meta.get('format_version')!r} is not "
            f"{_FORMAT_VERSION}; prepare the dataset again"
        )
    splits = {}
    for split_name, info in meta["splits"].items():
        arrays = {}
        for name in info["fields"]:
            path = folder / f"{split_name}_{name}.npy"
            if not path.is_file():
                raise DatasetError(f"{path} is missing; prepare the dataset again")
            try:
                arrays[name] = np.load(path, mmap_mode="r" if mmap else None)
            except (OSError, ValueError) as e:  # cut short or overwritten
                raise DatasetError(
                    f"{path} cannot be read ({e}); prepare the dataset again"
                ) from None
        splits[split_name] = Split(**arrays)
    return PreparedDataset(
        name=meta["name"],
        task=meta["task"],
        splits=splits,
        n_classes=meta["n_classes"],
        vocab_size=meta["vocab_size"],
        meta=meta["meta"],
    )
