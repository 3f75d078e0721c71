"""CIFAR-10 from the python pickles: LRA Image (grayscale) and sCIFAR (colour).

Hand-written on purpose: the restricted unpickler below is a security feature (a plain
`pickle.load`, as torchvision uses, runs whatever code a tampered file holds).

Source: the user's copy of `cifar-10-python.tar.gz`, extracted to `cifar-10-batches-py/` with
`data_batch_1..5` and `test_batch`: pickled dicts whose `b'data'` is uint8 (10000, 3072), each row
1024 R, then 1024 G, then 1024 B values in 32×32 row-major order, and `b'labels'` a list of ints
(`datasets.md` §2.5). The pickles are read with an unpickler that only rebuilds numpy arrays.

Both tasks follow the S4/S5 torchvision pipeline, in float32 as torch computes it:

- **LRA Image** (§2.5): Pillow's `convert("L")`, L = (19595 R + 38470 G + 7471 B + 32768) >> 16,
  then ToTensor (L / 255) and Normalize(122.6/255, 61.0/255), i.e. x ≈ (L − 122.6) / 61.0;
  x is (N, 1024, 1), row-major pixels.
- **sCIFAR** (§4): ToTensor then Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)) per
  channel; "c h w → (h w) c" gives x (N, 1024, 3).

Splits (§2.5): the 50,000 training images (batches 1..5 in order) go through
`random_split((45,000, 5,000), seed 42)`; `test_batch` is the test split. 10 classes.
"""

from __future__ import annotations

import codecs
import os
import pickle
from pathlib import Path
from typing import Any, ClassVar

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

__all__ = ["grayscale_l", "prepare_image", "prepare_scifar", "read_cifar_batch"]

FOLDER = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
DEFAULT_SOURCE = "cifar"
TRAIN_FILES = tuple(f"data_batch_{k}" for k in range(1, 6))
TEST_FILE = "test_batch"
N_CLASSES = 10
PIXELS = 1024

GRAY_MEAN = 122.6 / 255.0
GRAY_STD = 61.0 / 255.0
RGB_MEAN = (0.4914, 0.4822, 0.4465)
RGB_STD = (0.247, 0.243, 0.261)
_VERSION = 1


class _ArrayUnpickler(pickle.Unpickler):
    """Rebuilds plain numpy arrays and builtins only: a data file cannot run code."""

    _ALLOWED: ClassVar[dict[tuple[str, str], Any]] = {
        ("numpy.core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(1))[0],
        ("numpy._core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(1))[0],
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}") from None


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch file as (uint8 (n, 3072) pixels, int32 (n,) labels)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing from the CIFAR-10 copy") from None
    except Exception as err:
        raise DatasetError(
            f"{path} is not a readable CIFAR-10 python batch ({type(err).__name__}: {err}); "
            f"extract {ARCHIVE} again"
        ) from err
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DatasetError(f"{path}: expected a pickled dict with b'data' and b'labels'")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * PIXELS:
        raise DatasetError(
            f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 (n, 3072)"
        )
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{path}: b'labels' must hold one integer per image ({len(data)})")
    if len(labels) and (labels.min() < 0 or labels.max() >= N_CLASSES):
        raise DatasetError(f"{path}: labels must lie in 0..{N_CLASSES - 1}")
    return data, labels.astype(np.int32)


def grayscale_l(data: np.ndarray) -> np.ndarray:
    """Pillow's `convert("L")` of CIFAR rows (n, 3072) as uint8 (n, 1024), bit for bit."""
    rgb = data.reshape(len(data), 3, PIXELS).astype(np.uint32)
    luma = 19595 * rgb[:, 0] + 38470 * rgb[:, 1] + 7471 * rgb[:, 2] + 0x8000
    return (luma >> 16).astype(np.uint8)


def _to_tensor(values: np.ndarray) -> np.ndarray:
    # torchvision ToTensor: uint8 → float32, then divided by 255 in float32
    return values.astype(np.float32) / np.float32(255)


def _features_gray(data: np.ndarray) -> np.ndarray:
    x = (_to_tensor(grayscale_l(data)) - np.float32(GRAY_MEAN)) / np.float32(GRAY_STD)
    return x[:, :, None]


def _features_rgb(data: np.ndarray) -> np.ndarray:
    mean = np.asarray(RGB_MEAN, np.float32)[None, :, None]
    std = np.asarray(RGB_STD, np.float32)[None, :, None]
    x = (_to_tensor(data.reshape(len(data), 3, PIXELS)) - mean) / std
    return x.transpose(0, 2, 1)


def _locate(source: Path, default: Path) -> Path:
    for folder in (source, source / FOLDER):
        if (folder / TRAIN_FILES[0]).is_file():
            return folder
    expected = source if source.name == FOLDER else source / FOLDER
    raise DatasetError(
        missing_source(
            "CIFAR-10 (python version)",
            expected,
            f"Download the archive {ARCHIVE} yourself and extract it into {expected.parent}; it "
            f"unpacks to {FOLDER}/ holding data_batch_1..5 and test_batch.",
            default,
        )
    )


def _prepare(
    name: str, source, out, *, colour: bool, force: bool, description: str
) -> PreparedDataset:
    source = resolve_source(source, DEFAULT_SOURCE)
    out = default_out(out, name)
    options = {"version": _VERSION, "colour": colour, "val_split": 0.1, "seed": 42}
    if not force and (ready := reuse_prepared(out, name, source, options)) is not None:
        return ready
    root = _locate(source, resolve_source(None, DEFAULT_SOURCE) / FOLDER)
    features = _features_rgb if colour else _features_gray
    channels = 3 if colour else 1

    batches = []
    for k, file in enumerate((*TRAIN_FILES, TEST_FILE), start=1):
        progress(name, f"reading {root / file} ({k}/{len(TRAIN_FILES) + 1})")
        batches.append(read_cifar_batch(root / file))
    train_data = np.concatenate([b[0] for b in batches[:-1]])
    train_labels = np.concatenate([b[1] for b in batches[:-1]])
    test_data, test_labels = batches[-1]
    if len(test_data) == 0:
        raise DatasetError(f"{root / TEST_FILE} holds no images")
    lengths = train_val_lengths(len(train_data))
    if min(lengths) == 0:
        raise DatasetError(
            f"{root}: {len(train_data)} training images give an empty split "
            f"(train/val {lengths[0]}/{lengths[1]})"
        )
    train_idx, val_idx = random_split_indices(len(train_data), lengths, seed=42)

    with Scratch(out) as scratch:
        splits = {}
        for split, data, labels in (
            ("train", train_data[train_idx], train_labels[train_idx]),
            ("val", train_data[val_idx], train_labels[val_idx]),
            ("test", test_data, test_labels),
        ):
            x = scratch.array(f"{split}_x", (len(data), PIXELS, channels), np.float32)
            for start in range(0, len(data), 10_000):
                x[start : start + 10_000] = features(data[start : start + 10_000])
            splits[split] = Split(x=x, y=labels)
        meta = {
            "source": str(source.resolve()),
            "root": str(root.resolve()),
            "options": options,
            "description": description,
            "sizes": {k: len(v) for k, v in splits.items()},
        }
        dataset = PreparedDataset(name, "classification", splits, N_CLASSES, None, meta)
        progress(name, f"writing {out}")
        return scratch.finish(dataset)


def prepare_image(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    force: bool = False,
) -> PreparedDataset:
    """Prepare LRA Image: grayscale CIFAR-10, x (N, 1024, 1) float32 ≈ (L − 122.6) / 61.0.

    **Arguments:**
    - `source`: the `cifar-10-batches-py` folder or a folder holding it
      (default `data_root() / "cifar"`).
    - `out`: output folder (default `data_root() / "prepared" / "image"`); reused when it was
      prepared from the same source with the same options, unless `force`.

    **Returns:** the `PreparedDataset` (splits train 45,000 / val 5,000 / test 10,000).
    """
    return _prepare(
        "image",
        source,
        out,
        colour=False,
        force=force,
        description="LRA Image: CIFAR-10 grayscale (Pillow L), (L/255 - 122.6/255) / (61/255)",
    )


def prepare_scifar(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    force: bool = False,
) -> PreparedDataset:
    """Prepare sCIFAR: colour CIFAR-10, x (N, 1024, 3) float32, per-channel normalised.

    Arguments and splits as `prepare_image` (default output `data_root() / "prepared" / "scifar"`).
    """
    return _prepare(
        "scifar",
        source,
        out,
        colour=True,
        force=force,
        description="sCIFAR: CIFAR-10 colour, (h w) c pixels, per-channel mean/std normalised",
    )
