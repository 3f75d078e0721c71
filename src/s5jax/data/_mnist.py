"""MNIST from IDX files: sequential MNIST (sMNIST) and permuted sequential MNIST (psMNIST).

The IDX reader is hand-written: the format is four header fields and raw bytes, and a library
(torchvision) would bring PyTorch for 20 exact lines.

Source: the user's copy of the four MNIST files `train-images-idx3-ubyte`,
`train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte` (`datasets.md` §4),
each plain or gzipped (`.gz`, as distributed), found in the given folder, in its `MNIST/raw/`
(torchvision's layout) or in its `raw/`. IDX: big-endian magic 2051 (images) or 2049 (labels), then
one big-endian uint32 per dimension, then uint8 data.

Preprocessing follows S4/S5 (§4): ToTensor only (x = pixel / 255 in float32, **no** mean/std
normalisation), pixels row-major as (784, 1). psMNIST reorders every sequence with the fixed
bit-reversal permutation, x_perm[k] = x[p[k]]. Splits: the 60,000 training images go through
`random_split((54,000, 6,000), seed 42)`; the 10,000 t10k images are the test split. 10 classes.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from ._common import DatasetError
from ._prepared import PreparedDataset, Split
from .splits import random_split_indices, train_val_lengths
from .splits._build import (
    Scratch,
    default_out,
    missing_source,
    progress,
    resolve_source,
    reuse_prepared,
)

__all__ = ["bitreversal_permutation", "prepare_psmnist", "prepare_smnist", "read_idx"]

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DEFAULT_SOURCE = "mnist"
N_CLASSES = 10
LENGTH = 784
_MAGIC = {2051: 3, 2049: 1}  # magic → number of dimensions (uint8 data)
_VERSION = 1


def bitreversal_permutation(n: int) -> np.ndarray:
    """The S4/S5 psMNIST permutation: bit-reversals of 0..2**m − 1 (2**m ≥ n) that are < n."""
    bits = max(n - 1, 0).bit_length()
    idx = np.arange(1 << bits)
    rev = np.zeros_like(idx)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    return rev[rev < n]


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """A uint8 IDX file (images: magic 2051, labels: 2049), plain or gzipped, as an array."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as err:
        raise DatasetError(f"{path} could not be read ({err})") from err
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic not in _MAGIC:
        raise DatasetError(
            f"{path} is not an MNIST IDX file of uint8 data (magic {magic}, expected 2051 or 2049)"
        )
    ndim = _MAGIC[magic]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim))
    if len(raw) - header != int(np.prod(shape)):
        raise DatasetError(
            f"{path}: header announces shape {shape} ({int(np.prod(shape))} bytes) but the file "
            f"holds {len(raw) - header} data bytes"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _find(source: Path, base: str) -> Path | None:
    for folder in (source, source / "MNIST" / "raw", source / "raw"):
        for name in (base, base + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def _read_all(source: Path, default: Path) -> dict[str, np.ndarray]:
    found = {key: _find(source, base) for key, base in FILES.items()}
    missing = [FILES[key] for key, path in found.items() if path is None]
    if missing:
        raise DatasetError(
            missing_source(
                f"MNIST file(s) {', '.join(missing)}",
                source / "MNIST" / "raw",
                "Download the four MNIST files "
                + ", ".join(f"{base}.gz" for base in FILES.values())
                + f" yourself and put them into {source / 'MNIST' / 'raw'}, gzipped or not (the "
                "source folder itself and its raw/ are searched too).",
                default,
            )
        )
    progress("mnist", f"reading {', '.join(str(path) for path in found.values())}")
    arrays = {key: read_idx(path) for key, path in found.items()}
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.shape[1:] != (28, 28) or labels.ndim != 1:
            raise DatasetError(f"{found[f'{part}_images']}: images must be (n, 28, 28)")
        if len(images) != len(labels):
            raise DatasetError(
                f"{found[f'{part}_images']} holds {len(images)} images but "
                f"{found[f'{part}_labels']} holds {len(labels)} labels"
            )
        if len(labels) == 0:
            raise DatasetError(f"{found[f'{part}_images']} holds no images")
        if labels.max() >= N_CLASSES:
            raise DatasetError(f"{found[f'{part}_labels']}: labels must lie in 0..9")
    return arrays


def _prepare(name: str, source, out, *, permute: bool, force: bool) -> PreparedDataset:
    source = resolve_source(source, DEFAULT_SOURCE)
    out = default_out(out, name)
    options = {"version": _VERSION, "permute": "bitreversal" if permute else None}
    options |= {"val_split": 0.1, "seed": 42}
    if not force and (ready := reuse_prepared(out, name, source, options)) is not None:
        return ready
    arrays = _read_all(source, resolve_source(None, DEFAULT_SOURCE) / "MNIST" / "raw")
    train_images = arrays["train_images"].reshape(-1, LENGTH)
    train_labels = arrays["train_labels"].astype(np.int32)
    lengths = train_val_lengths(len(train_images))
    if min(lengths) == 0:
        raise DatasetError(
            f"{source}: {len(train_images)} training images give an empty split "
            f"(train/val {lengths[0]}/{lengths[1]})"
        )
    train_idx, val_idx = random_split_indices(len(train_images), lengths, seed=42)
    order = bitreversal_permutation(LENGTH) if permute else np.arange(LENGTH)

    with Scratch(out) as scratch:
        splits = {}
        for split, images, labels in (
            ("train", train_images[train_idx], train_labels[train_idx]),
            ("val", train_images[val_idx], train_labels[val_idx]),
            ("test", arrays["test_images"].reshape(-1, LENGTH), arrays["test_labels"]),
        ):
            x = scratch.array(f"{split}_x", (len(images), LENGTH, 1), np.float32)
            # ToTensor: uint8 → float32 / 255 (float32 arithmetic, as torch)
            x[:, :, 0] = images[:, order].astype(np.float32) / np.float32(255)
            splits[split] = Split(x=x, y=labels.astype(np.int32))
        meta = {
            "source": str(source.resolve()),
            "options": options,
            "description": (
                "psMNIST: MNIST pixels/255, bit-reversal permuted"
                if permute
                else "sMNIST: MNIST pixels/255, row-major"
            ),
            "sizes": {k: len(v) for k, v in splits.items()},
        }
        dataset = PreparedDataset(name, "classification", splits, N_CLASSES, None, meta)
        progress(name, f"writing {out}")
        return scratch.finish(dataset)


def prepare_smnist(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    force: bool = False,
) -> PreparedDataset:
    """Prepare sequential MNIST: x (N, 784, 1) float32 = pixel / 255, row-major.

    **Arguments:**
    - `source`: folder with the four IDX files (plain or `.gz`), directly or in `MNIST/raw/`
      (default `data_root() / "mnist"`).
    - `out`: output folder (default `data_root() / "prepared" / "smnist"`); reused when it was
      prepared from the same source with the same options, unless `force`.

    **Returns:** the `PreparedDataset` (train 54,000 / val 6,000 / test 10,000).
    """
    return _prepare("smnist", source, out, permute=False, force=force)


def prepare_psmnist(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    force: bool = False,
) -> PreparedDataset:
    """Prepare permuted sequential MNIST: sMNIST reordered by `bitreversal_permutation(784)`.

    Arguments and splits as `prepare_smnist`; the default output is
    `data_root() / "prepared" / "psmnist"`.
    """
    return _prepare("psmnist", source, out, permute=True, force=force)
