"""LRA Retrieval (ACL Anthology Network document pairs): the reader and preparation.

Spec: `datasets.md` §2.4 (and §2.0 for the release layout, §5 for the vocabulary).

The release holds `tsv_data/new_aan_pairs.{train,eval,test}.tsv` (eval is our val): no
header, 5 tab-separated columns `label, id1, id2, text1, text2`; the label is 0/1 (read as a
number, so `1` and `1.0` both work). The text fields look like Python bytes literals
(`b'...'`); S4/S5 do not decode them and neither do we: every character of the raw field is
a token. Each document is truncated to `l_max - 1 = 3999` characters and gets `<eos>`
(`l_max = 4000` per document). Vocabulary: `<pad>`=0, `<unk>`=1, `<eos>`=2, then every
character of the truncated train documents (both columns), by descending count (ties: code
point order); 98 ids on the release (3 specials + printable ASCII).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ._common import ELSEWHERE, DatasetError, data_root
from ._prepared import PreparedDataset, Split, load_prepared, save_prepared
from ._vocab import (
    N_CODEPOINTS,
    Progress,
    char_keys,
    count_keys,
    count_lines,
    iter_lines,
    remap_in_place,
    resolve_source,
    reuse_prepared,
    scratch_array,
    scratch_dir,
    vocab_from_keys,
    write_row,
)

__all__ = ["AAN_L_MAX", "find_aan", "iter_aan_tsv", "prepare_retrieval"]

AAN_L_MAX = 4000
_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "val": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}
_CANDIDATES = ("", "tsv_data", "lra_release/tsv_data", "lra_release/lra_release/tsv_data")
_PREPARER = "s5jax.aan/1"


def _missing_message(source: Path) -> str:
    root = data_root()
    target = root / "lra_release" / "lra_release" / "tsv_data" / _FILES["train"]
    return (
        f"AAN retrieval data not found under {source} (looked for tsv_data/{_FILES['train']}). "
        "Download the Long Range Arena release archive `lra_release.gz` and extract it into "
        f"{root}, so that {target} exists. {ELSEWHERE}"
    )


def find_aan(source: str | os.PathLike | None = None) -> Path:
    """The folder holding `new_aan_pairs.*.tsv` under `source` (default: the data root)."""
    source = Path(source).expanduser() if source is not None else data_root()
    folder = resolve_source(source, _CANDIDATES, _FILES["train"])
    if folder is None:
        raise DatasetError(_missing_message(source))
    for name in _FILES.values():
        if not (folder / name).is_file():
            raise DatasetError(
                f"{folder / name} is missing; the tsv_data folder must hold "
                f"{', '.join(_FILES.values())} (re-extract `lra_release.gz`)"
            )
    return folder


def _parse_label(text: str) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value in (0.0, 1.0) else None


def iter_aan_tsv(path: str | os.PathLike) -> Iterator[tuple[int, str, str, str, str]]:
    """`(label, id1, id2, text1, text2)` for each row of an AAN pairs TSV (no header).

    Blank lines are skipped (as pandas does); any other malformed line raises a
    `DatasetError` naming the file and line.
    """
    path = Path(path)
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise DatasetError(
                f"{path}, line {lineno}: expected 5 tab-separated fields (label, id1, id2, "
                f"text1, text2), found {len(fields)}; the file is truncated or damaged"
            )
        label = _parse_label(fields[0])
        if label is None:
            raise DatasetError(
                f"{path}, line {lineno}: label {fields[0][:20]!r} is not 0 or 1; "
                "the file is truncated or damaged"
            )
        yield label, fields[1], fields[2], fields[3], fields[4]


def _read_split(path: Path, scratch: Path, split: str, l_max: int, progress: bool):
    n_max = count_lines(path)
    x = scratch_array(scratch, split, (n_max, 2, l_max))
    y = np.zeros(n_max, dtype=np.int32)
    lengths = np.zeros((n_max, 2), dtype=np.int32)
    report = Progress(f"aan {split}", n_max, enabled=progress, every=10_000)
    n = 0
    for label, _, _, text1, text2 in iter_aan_tsv(path):
        lengths[n, 0] = write_row(x[n, 0], char_keys(text1, l_max - 1))
        lengths[n, 1] = write_row(x[n, 1], char_keys(text2, l_max - 1))
        y[n] = label
        n += 1
        report.step(n)
    if n == 0:
        raise DatasetError(
            f"{path}: the {split} split has no examples; the file is empty or truncated, "
            "re-extract `lra_release.gz`"
        )
    report.done(n)
    return x[:n], y[:n], lengths[:n]


def prepare_retrieval(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    l_max: int = AAN_L_MAX,
    force: bool = False,
    progress: bool = True,
) -> PreparedDataset:
    """Read the AAN document pairs into a cached character-level dataset (LRA Retrieval).

    **Arguments:**
    - `source`: the release root or the `tsv_data` folder (default: the data root).
    - `out`: the cache folder (default: `<data root>/prepared/retrieval`).
    - `l_max`: length of each document incl. `<eos>` (4000 in the paper's runs).
    - `force`: rebuild even if `out` holds the same source and options.

    **Returns:** splits train/val/test with x (N, 2, l_max) int32 token ids (the two
    documents), y (N,) int32 and lengths (N, 2) int32 incl. `<eos>`; `n_classes` 2.
    """
    folder = find_aan(source)
    out = Path(out).expanduser() if out is not None else data_root() / "prepared" / "retrieval"
    if l_max < 2:
        raise ValueError(f"l_max must be at least 2, got {l_max}")
    provenance = {"preparer": _PREPARER, "source": str(folder), "options": {"l_max": l_max}}
    if not force and (cached := reuse_prepared(out, provenance)) is not None:
        return cached
    with scratch_dir(out) as scratch:
        arrays = {
            split: _read_split(folder / name, scratch, split, l_max, progress)
            for split, name in _FILES.items()
        }
        itos, table = vocab_from_keys(count_keys(arrays["train"][0], N_CODEPOINTS), chr)
        for x, _, _ in arrays.values():
            remap_in_place(x, table)
        dataset = PreparedDataset(
            name="retrieval",
            task="classification",
            splits={s: Split(x=x, y=y, lengths=n) for s, (x, y, n) in arrays.items()},
            n_classes=2,
            vocab_size=len(itos),
            meta={
                **provenance,
                "vocab": itos,
                "sizes": {s: len(a[1]) for s, a in arrays.items()},
                "tokenizer": "raw text field (bytes literal not decoded), one token per "
                "character; each document truncated to l_max-1, <eos> appended; "
                "pad with <pad>=0",
                "reference": "datasets.md §2.4 (S4/S5 AAN); S5 IN_DIM = len(vocab)",
            },
        )
        save_prepared(out, dataset)
        del arrays, dataset
    return load_prepared(out)
