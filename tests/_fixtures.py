"""Writers of tiny datasets in each real on-disk format, shared by the reader tests and the
paper-config tests (`test_paper_configs.py`).

Each writer lays its files out as the original archive unpacks (`shared/specs/datasets.md`):
ListOps and AAN as in `lra_release.gz` (§2.0), IMDB as `aclImdb/` (§2.3), CIFAR-10 as the python
pickles of `cifar-10-batches-py/` (§2.5), MNIST as IDX files (§4), Pathfinder as PNGs with text
metadata (§2.2) and Speech Commands as 16 kHz mono 16-bit wav files with the split lists (§3).
"""

from __future__ import annotations

import gzip
import pickle
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from s5jax.data import SPEECH_CLASSES

__all__ = [
    "idx_bytes",
    "write_aan",
    "write_cifar",
    "write_imdb",
    "write_listops",
    "write_mnist",
    "write_pathfinder",
    "write_speech",
    "write_wav",
]

# ---------------------------------------------------------------------------------------
# LRA text tasks: ListOps, IMDB (Text), AAN (Retrieval)


def write_listops(folder: Path, rows_by_split, *, header: str = "Source\tTarget") -> Path:
    """Write listops-1000/basic_{split}.tsv as LRA does (csv, CRLF line ends)."""
    d = folder / "listops-1000"
    d.mkdir(parents=True)
    for split, rows in rows_by_split.items():
        lines = [header] + [f"{src}\t{label}" for src, label in rows]
        (d / f"basic_{split}.tsv").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return d


def write_imdb(folder: Path, reviews) -> Path:
    """reviews: {(split, 'pos'|'neg'): {filename: text}}; writes folder/aclImdb/."""
    root = folder / "aclImdb"
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            (root / split / label).mkdir(parents=True)
    for (split, label), files in reviews.items():
        for name, text in files.items():
            (root / split / label / name).write_text(text, encoding="utf-8")
    return root


def write_aan(folder: Path, rows_by_split) -> Path:
    """rows_by_split: {split: [(label, id1, id2, text1, text2), ...]}; writes
    folder/lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv (no header)."""
    d = folder / "lra_release" / "tsv_data"
    d.mkdir(parents=True)
    names = {"train": "train", "val": "eval", "test": "test"}
    for split, rows in rows_by_split.items():
        text = "".join("\t".join(r) + "\n" for r in rows)
        (d / f"new_aan_pairs.{names[split]}.tsv").write_text(text, encoding="utf-8")
    return d


# ---------------------------------------------------------------------------------------
# CIFAR-10 python pickles (LRA Image, sCIFAR)


def write_cifar(folder: Path, per_batch: int = 4, n_test: int = 3, seed: int = 0) -> dict:
    """data_batch_1..5 (`per_batch` images each) and test_batch (`n_test`) in `folder`.

    **Returns:** {file name: (uint8 (n, 3072) data, (n,) labels)}.
    """
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    written = {}
    names = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = (data, np.asarray(labels))
    return written


# ---------------------------------------------------------------------------------------
# MNIST IDX files (sMNIST, psMNIST)


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An IDX file: big-endian magic, big-endian dimensions, then the uint8 data."""
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, *, gz: bool, n_train: int = 20, n_test: int = 5) -> dict:
    """The four MNIST IDX files in `folder` (gzipped when `gz`).

    **Returns:** {file name without .gz: array}.
    """
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True)
    arrays = {
        "train-images-idx3-ubyte": (rng.integers(0, 256, (n_train, 28, 28)), 2051),
        "train-labels-idx1-ubyte": (rng.integers(0, 10, n_train), 2049),
        "t10k-images-idx3-ubyte": (rng.integers(0, 256, (n_test, 28, 28)), 2051),
        "t10k-labels-idx1-ubyte": (rng.integers(0, 10, n_test), 2049),
    }
    for name, (array, magic) in arrays.items():
        raw = idx_bytes(array, magic)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)
    return {name: array for name, (array, _) in arrays.items()}


# ---------------------------------------------------------------------------------------
# LRA Pathfinder / Path-X


def write_pathfinder(
    base: Path, resolution: int = 32, difficulty: str = "curv_contour_length_14", n: int = 10
) -> tuple[Path, list[np.ndarray], list[int]]:
    """n PNGs in two metadata batches named 2 and 10 (integer order ≠ string order), under
    base/pathfinder{resolution}/{difficulty}/.

    **Returns:** (the difficulty folder, the images in metadata order, their labels).
    """
    rng = np.random.default_rng(3)
    root = base / f"pathfinder{resolution}" / difficulty
    (root / "metadata").mkdir(parents=True)
    images, labels = [], []
    for batch, count in (("2", n // 2), ("10", n - n // 2)):
        (root / "imgs" / batch).mkdir(parents=True)
        lines = []
        for k in range(count):
            pixels = rng.integers(0, 256, (resolution, resolution), dtype=np.uint8)
            pixels[0, :2] = (0, 255)
            Image.fromarray(pixels, "L").save(root / "imgs" / batch / f"sample_{k}.png")
            label = int(rng.integers(0, 2))
            lines.append(f"imgs/{batch} sample_{k}.png {k} {label} 1.0 14 4 2 0.5 1 1")
            images.append(pixels)
            labels.append(label)
        (root / "metadata" / f"{batch}.npy").write_text("\n".join(lines) + "\n")
    return root, images, labels


# ---------------------------------------------------------------------------------------
# Speech Commands v0.02 (SC35)


def write_wav(path: Path, samples: np.ndarray, rate: int = 16_000, channels: int = 1) -> None:
    """A 16-bit PCM wav file."""
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.asarray(samples, "<i2").tobytes())


def write_speech(
    root: Path,
    *,
    words: Sequence[str] = ("zero", "bed", "yes", "backward"),
    per_word: int = 3,
    validation: Sequence[str] = ("bed/spk1_nohash_0.wav", "yes/spk0_nohash_0.wav"),
    testing: Sequence[str] = ("zero/spk0_nohash_0.wav", "backward/spk1_nohash_0.wav"),
) -> dict[str, tuple[np.ndarray, int]]:
    """All 35 class folders (and `_background_noise_`) in `root`; `per_word` clips in each of
    `words`, `spk{k}_nohash_0.wav`, the first (k = 0) 12,345 samples long, the others 16,000;
    `validation_list.txt` and `testing_list.txt` list `validation` and `testing`.

    The defaults hold 12 clips: 8 train, 2 val (bed, yes) and 2 test (zero, backward).

    **Returns:** {"word/file.wav": (int16 samples, label)}.
    """
    rng = np.random.default_rng(4)
    for word in [*SPEECH_CLASSES, "_background_noise_"]:
        (root / word).mkdir(parents=True)
    clips = {}
    for word in words:
        for k in range(per_word):
            length = 16_000 if k else 12_345
            samples = rng.integers(-32768, 32768, length).astype(np.int16)
            write_wav(root / word / f"spk{k}_nohash_0.wav", samples)
            clips[f"{word}/spk{k}_nohash_0.wav"] = (samples, SPEECH_CLASSES.index(word))
    (root / "validation_list.txt").write_text("".join(f"{k}\n" for k in validation))
    (root / "testing_list.txt").write_text("".join(f"{k}\n" for k in testing))
    (root / "README.md").write_text("fixture")
    return clips


def read_npz(path) -> dict[str, np.ndarray]:
    """Every array of an `.npz` file, read with numpy and the file closed at once.

    `np.load(path)["key"]` leaves the closing to the garbage collector: when the NpzFile is
    caught in a reference cycle, its file handle can be finalised first, and the suite (which
    turns warnings into errors) fails some other test with a ResourceWarning.
    """
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}
