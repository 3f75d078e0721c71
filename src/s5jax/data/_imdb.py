"""LRA Text (IMDB reviews, character level): the reader of `aclImdb` and preparation.

Spec: `datasets.md` §2.3 (S4/S5 pipeline) and §5 (vocabulary).

The raw data is Stanford's `aclImdb_v1.tar.gz`: `aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`,
12,500 reviews per folder (`train/unsup` is not used). S4/S5 read it through HuggingFace
`imdb`, which decodes each file as UTF-8 and keeps the text as is (no lowercasing, `<br />`
kept). Tokens are Unicode characters (code points, not bytes): truncate to `l_max - 1 = 4095`,
append `<eos>`; vocabulary `<pad>`=0, `<unk>`=1, `<eos>`=2, then the characters seen at least
`min_freq = 15` times in the truncated train reviews, by descending count (ties: code point
order); about 135 ids. Labels: neg = 0, pos = 1. There is no validation split: as in the
paper's runs the test split doubles as val (`val` holds the same examples as `test`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ._common import ELSEWHERE, DatasetError, data_root
from ._prepared import PreparedDataset, Split, load_prepared, save_prepared
from ._vocab import (
    N_CODEPOINTS,
    Progress,
    char_keys,
    count_keys,
    read_text_file,
    remap_in_place,
    resolve_source,
    reuse_prepared,
    scratch_array,
    scratch_dir,
    vocab_from_keys,
    write_row,
)

__all__ = ["IMDB_L_MAX", "IMDB_MIN_FREQ", "find_imdb", "list_imdb_files", "prepare_text"]

IMDB_L_MAX = 4096
IMDB_MIN_FREQ = 15
_LABELS = {"neg": 0, "pos": 1}
_SPLITS = ("train", "test")
_CANDIDATES = ("aclImdb", "")
_PREPARER = "s5jax.imdb/1"
_REVIEW_NAME = re.compile(r"(\d+)_(\d+)\.txt")


def _missing_message(source: Path) -> str:
    root = data_root()
    return (
        f"IMDB reviews not found under {source} (looked for aclImdb/train/pos). Download "
        "the Stanford Large Movie Review Dataset archive `aclImdb_v1.tar.gz` and extract it "
        f"into {root}, so that {root / 'aclImdb' / 'train' / 'pos'} exists. {ELSEWHERE}"
    )


def find_imdb(source: str | os.PathLike | None = None) -> Path:
    """The `aclImdb` folder under `source` (default: the data root)."""
    source = Path(source).expanduser() if source is not None else data_root()
    folder = resolve_source(source, _CANDIDATES, "train/pos")
    if folder is None:
        raise DatasetError(_missing_message(source))
    for split in _SPLITS:
        for label in _LABELS:
            if not (folder / split / label).is_dir():
                raise DatasetError(
                    f"{folder / split / label} is missing; aclImdb must hold "
                    "{train,test}/{neg,pos}/ (re-extract `aclImdb_v1.tar.gz`)"
                )
    return folder


def _review_order(path: Path) -> tuple:
    match = _REVIEW_NAME.fullmatch(path.name)
    return (0, int(match[1]), int(match[2])) if match else (1, 0, 0, path.name)


def list_imdb_files(folder: str | os.PathLike, split: str) -> list[tuple[Path, int]]:
    """`(review file, label)` for a split: all of `neg/` then all of `pos/`, by review id."""
    folder = Path(folder)
    files = []
    for name, label in _LABELS.items():
        sub = folder / split / name
        reviews = sorted(sub.glob("*.txt"), key=_review_order)
        if not reviews:
            raise DatasetError(
                f"{sub} holds no .txt reviews, so the {split} split is incomplete; "
                "re-extract `aclImdb_v1.tar.gz`"
            )
        files.extend((path, label) for path in reviews)
    return files


def _read_split(folder: Path, scratch: Path, split: str, l_max: int, progress: bool):
    files = list_imdb_files(folder, split)
    x = scratch_array(scratch, split, (len(files), l_max))
    y = np.array([label for _, label in files], dtype=np.int32)
    lengths = np.zeros(len(files), dtype=np.int32)
    report = Progress(f"imdb {split}", len(files), enabled=progress, every=5000)
    for i, (path, _) in enumerate(files):
        lengths[i] = write_row(x[i], char_keys(read_text_file(path), l_max - 1))
        report.step(i + 1)
    report.done(len(files))
    return x, y, lengths


def prepare_text(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    l_max: int = IMDB_L_MAX,
    min_freq: int = IMDB_MIN_FREQ,
    force: bool = False,
    progress: bool = True,
) -> PreparedDataset:
    """Read IMDB (`aclImdb`) into a cached character-level dataset (LRA Text).

    **Arguments:**
    - `source`: the `aclImdb` folder or a folder holding it (default: the data root).
    - `out`: the cache folder (default: `<data root>/prepared/text`).
    - `l_max`: sequence length incl. `<eos>` (4096 in the paper's runs).
    - `min_freq`: characters rarer than this in the train split become `<unk>`.
    - `force`: rebuild even if `out` holds the same source and options.

    **Returns:** splits train/val/test (val = test) with x (N, l_max) int32 token ids,
    y (N,) int32 (neg 0, pos 1) and lengths (N,) int32 incl. `<eos>`; `n_classes` 2.
    """
    folder = find_imdb(source)
    out = Path(out).expanduser() if out is not None else data_root() / "prepared" / "text"
    if l_max < 2:
        raise ValueError(f"l_max must be at least 2, got {l_max}")
    options = {"l_max": l_max, "min_freq": min_freq}
    provenance = {"preparer": _PREPARER, "source": str(folder), "options": options}
    if not force and (cached := reuse_prepared(out, provenance)) is not None:
        return cached
    with scratch_dir(out) as scratch:
        arrays = {s: _read_split(folder, scratch, s, l_max, progress) for s in _SPLITS}
        counts = count_keys(arrays["train"][0], N_CODEPOINTS)
        itos, table = vocab_from_keys(counts, chr, min_freq=min_freq)
        for x, _, _ in arrays.values():
            remap_in_place(x, table)
        splits = {s: Split(x=x, y=y, lengths=n) for s, (x, y, n) in arrays.items()}
        dataset = PreparedDataset(
            name="text",
            task="classification",
            splits={"train": splits["train"], "val": splits["test"], "test": splits["test"]},
            n_classes=len(_LABELS),
            vocab_size=len(itos),
            meta={
                **provenance,
                "vocab": itos,
                "labels": list(_LABELS),
                "val_is_test": True,
                "sizes": {s: len(a[1]) for s, a in arrays.items()},
                "tokenizer": "UTF-8 text, one token per character (code point); truncate to "
                "l_max-1, append <eos>; pad with <pad>=0",
                "reference": "datasets.md §2.3 (S4/S5 IMDB, char level); S5 one-hot IN_DIM = 135",
                "one_hot_width": 135,  # the authors' one-hot input width (model parameter count)
            },
        )
        save_prepared(out, dataset)
        del arrays, splits, dataset
    return load_prepared(out)
