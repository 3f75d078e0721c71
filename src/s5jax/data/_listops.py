"""LRA ListOps: the generator, the reader of the release's TSV files, and preparation.

Spec: `datasets.md` §2.1 (and §2.0 for the release layout, §5 for the vocabulary).

An example is a nested expression over the digits 0-9 with the operators `[MIN`, `[MAX`,
`[MED` (median, truncated to an int) and `[SM` (sum mod 10), closed by `]`; its label is the
value (10 classes). The release stores it as the LRA generator's `to_string` output, e.g.
`( ( ( ( [MAX 4 ) 5 ) 3 ) ] )`, in `listops-1000/basic_{train,val,test}.tsv` with a
`Source<TAB>Target` header.

The S4/S5 tokenisation (reproduced here): `]` -> `X`, drop `(` and `)`, split on whitespace,
truncate to `l_max - 1 = 2047` tokens, append `<eos>`; vocabulary `<pad>`=0, `<unk>`=1,
`<eos>`=2, then the train tokens by descending count (ties: string order); 18 ids in all.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ._common import (
    ELSEWHERE,
    GENERATED_FILE,
    DatasetError,
    atomic_dir,
    data_root,
    read_generated,
)
from ._prepared import PreparedDataset, Split, load_prepared, save_prepared
from ._vocab import (
    Progress,
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

__all__ = [
    "LISTOPS_L_MAX",
    "LISTOPS_OPERATORS",
    "evaluate_listops",
    "find_listops",
    "generate_listops",
    "generate_listops_examples",
    "iter_listops_tsv",
    "listops_tokenize",
    "prepare_listops",
]

LISTOPS_L_MAX = 2048
LISTOPS_N_CLASSES = 10
LISTOPS_OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
_END = "]"
_VALUE_P = 0.25
_FOLDER = "listops-1000"
_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
_HEADER = ("Source", "Target")
_CANDIDATES = (
    "",
    _FOLDER,
    f"lra_release/{_FOLDER}",
    f"lra_release/lra_release/{_FOLDER}",
)
_PREPARER = "s5jax.listops/1"
_TRANSLATE = str.maketrans({"]": "X", "(": None, ")": None})


# ---------------------------------------------------------------------------------------
# Tokenisation and evaluation of the string form


def listops_tokenize(source: str) -> list[str]:
    """The S4/S5 `listops_tokenizer`: `]` -> `X`, delete `(` and `)`, split on whitespace."""
    return source.translate(_TRANSLATE).split()


def evaluate_listops(source: str) -> int:
    """The value of a ListOps expression in its string form (with or without parentheses).

    MIN and MAX as named; MED is `int(np.median(args))` (the mean of the two middle values,
    truncated, when the count is even); SM is the sum mod 10.
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in listops_tokenize(source):
        if result is not None:
            raise ValueError(f"trailing token {tok!r} after a complete expression")
        if tok in LISTOPS_OPERATORS:
            stack.append((tok, []))
        elif tok == "X":
            if not stack or not stack[-1][1]:
                raise ValueError("`]` without an operator and at least one argument")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok.isdigit() and len(tok) == 1:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r}")
    if result is None or stack:
        raise ValueError("incomplete ListOps expression")
    return result


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s = sorted(args)
        mid = len(s) // 2
        # np.median averages the two middle values; int() truncates (values are >= 0).
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


# ---------------------------------------------------------------------------------------
# The generator (LRA `lra_benchmarks/data/listops.py`, seeded with a numpy Generator)


class _Uniforms:
    """Uniform [0, 1) draws from a numpy Generator, in blocks (scalar calls are slow)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16):
        self._rng, self._block = rng, block
        self._buf: list[float] = []
        self._i = 0

    def random(self) -> float:
        if self._i == len(self._buf):
            self._buf = self._rng.random(self._block).tolist()
            self._i = 0
        self._i += 1
        return self._buf[self._i - 1]

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        return int(self.random() * n)


class _TooLong(Exception):
    """The tree being drawn already has `max_length` tokens; it would be rejected."""


def _sample_tree(u: _Uniforms, depth: int, max_depth: int, max_args: int, count: list[int]):
    """LRA `generate_tree`: a leaf with probability 0.75 (always at `max_depth`), else an
    operator over 2..max_args subtrees, the operator drawn after its children. The tree is
    left-nested: `((((op, v1), v2), ..., vk), "]")`. `count = [tokens so far, limit]`."""
    r = u.random() if depth < max_depth else 1.0
    if r > _VALUE_P:
        count[0] += 1
        if count[0] >= count[1]:
            raise _TooLong
        return u.below(10)
    count[0] += 2
    if count[0] >= count[1]:
        raise _TooLong
    k = 2 + u.below(max_args - 1)
    values = [_sample_tree(u, depth + 1, max_depth, max_args, count) for _ in range(k)]
    op = LISTOPS_OPERATORS[u.below(len(LISTOPS_OPERATORS))]
    tree = (op, values[0])
    for v in values[1:]:
        tree = (tree, v)
    return (tree, _END)


def _to_string(tree) -> str:
    """LRA `to_string`: every tuple becomes `( left right )`."""
    if isinstance(tree, tuple):
        return f"( {_to_string(tree[0])} {_to_string(tree[1])} )"
    return str(tree)


def _to_value(tree):
    """LRA `to_value` on the left-nested tree (unsaturated functions are `(op, args)`)."""
    if not isinstance(tree, tuple):
        return tree
    left, right = _to_value(tree[0]), _to_value(tree[1])
    if isinstance(left, str):  # an operator: start its argument list
        return (left, [right])
    if right == _END:
        return _apply(left[0], left[1])
    return (left[0], [*left[1], right])


def generate_listops_examples(
    n: int,
    *,
    seed: int | np.random.Generator = 0,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 500,
    max_length: int = 2000,
    progress: bool = False,
) -> list[tuple[str, int]]:
    """`n` distinct ListOps examples `(source string, label)` drawn as LRA draws them.

    A tree is kept when `min_length < length < max_length` (tokens without parentheses,
    i.e. the S4/S5 sequence length before `<eos>`) and it is not a duplicate. Trees that
    reach `max_length` tokens are abandoned early: they would be rejected anyway, so the
    distribution of kept trees is unchanged. Order: first drawn first.
    """
    if max_args < 2 or max_depth < 1 or min_length >= max_length - 1:
        raise ValueError("need max_args >= 2, max_depth >= 1 and min_length < max_length - 1")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    u = _Uniforms(rng)
    kept: dict[str, int] = {}
    report = Progress("listops generate", n, enabled=progress, every=1000)
    while len(kept) < n:
        count = [0, max_length]
        try:
            tree = _sample_tree(u, 1, max_depth, max_args, count)
        except _TooLong:
            continue
        if count[0] <= min_length:
            continue
        text = _to_string(tree)
        if text not in kept:
            kept[text] = int(_to_value(tree))
            report.step(len(kept))
    return list(kept.items())


def generate_listops(
    out: str | os.PathLike,
    *,
    n_train: int = 96_000,
    n_val: int = 2_000,
    n_test: int = 2_000,
    seed: int = 0,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 500,
    max_length: int = 2000,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Generate ListOps and write it laid out like the LRA release.

    Writes `out/listops-1000/basic_{train,val,test}.tsv` (header `Source<TAB>Target`,
    `csv` rows ending in CRLF, as LRA's `write_to_file`), atomically. The first `n_train`
    distinct examples are train, the next `n_val` val, the last `n_test` test.
    `prepare_listops(out)` reads the result.

    **Returns:** the `listops-1000` folder.
    """
    folder = Path(out).expanduser() / _FOLDER
    if folder.exists() and not overwrite:
        raise DatasetError(
            f"{folder} already exists; refusing to replace it (it may be the LRA release). "
            "Pass overwrite=True (only a folder generated here is replaced) or choose another "
            "output folder"
        )
    if folder.exists() and read_generated(folder) is None:
        raise DatasetError(
            f"{folder} exists and was not generated here (no {GENERATED_FILE} marking it "
            "generated); it may be the LRA release, so it is not replaced. Choose another "
            "output folder"
        )
    examples = generate_listops_examples(
        n_train + n_val + n_test,
        seed=seed,
        max_depth=max_depth,
        max_args=max_args,
        min_length=min_length,
        max_length=max_length,
        progress=progress,
    )
    bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val)}
    bounds["test"] = (n_train + n_val, len(examples))
    with atomic_dir(folder) as tmp:
        for split, (start, stop) in bounds.items():
            with open(tmp / _FILES[split], "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f, delimiter="\t")
                writer.writerow(_HEADER)
                writer.writerows(examples[start:stop])
        provenance = {
            "generated": True,
            "generator": "s5jax.generate_listops/1",
            "algorithm": "LRA ListOps generator (listops.py), re-implemented; synthetic data, "
            "not comparable with published LRA numbers",
            "seed": seed,
            "sizes": {"train": n_train, "val": n_val, "test": len(examples) - n_train - n_val},
            "params": {
                "max_depth": max_depth,
                "max_args": max_args,
                "min_length": min_length,
                "max_length": max_length,
            },
        }
        (tmp / GENERATED_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return folder


# ---------------------------------------------------------------------------------------
# Reader


def _missing_message(source: Path) -> str:
    root = data_root()
    return (
        f"ListOps not found under {source} (looked for listops-1000/basic_train.tsv). "
        "Download the Long Range Arena release archive `lra_release.gz` and extract it into "
        f"{root}, so that {root / 'lra_release' / 'lra_release' / _FOLDER / _FILES['train']} "
        f"exists. {ELSEWHERE} Or generate a synthetic copy with `s5jax data prepare listops "
        "--generate` (`generate_listops` in Python; not comparable with published numbers)."
    )


def find_listops(source: str | os.PathLike | None = None) -> Path:
    """The folder holding `basic_{train,val,test}.tsv` under `source` (default: data root)."""
    source = Path(source).expanduser() if source is not None else data_root()
    folder = resolve_source(source, _CANDIDATES, _FILES["train"])
    if folder is None:
        raise DatasetError(_missing_message(source))
    for name in _FILES.values():
        if not (folder / name).is_file():
            raise DatasetError(
                f"{folder / name} is missing; the ListOps folder must hold "
                f"{', '.join(_FILES.values())} (re-extract `lra_release.gz`)"
            )
    return folder


def _unquote(field: str) -> str:
    if len(field) >= 2 and field[0] == field[-1] == '"':
        return field[1:-1].replace('""', '"')
    return field


def iter_listops_tsv(path: str | os.PathLike) -> Iterator[tuple[str, int]]:
    """`(source, label)` for each row of a ListOps TSV (header `Source<TAB>Target`).

    Blank lines are skipped (as pandas does); any other malformed line raises a
    `DatasetError` naming the file and line.
    """
    path = Path(path)
    lines = iter_lines(path)
    first = next(lines, None)
    header = tuple(first[1].split("\t")) if first else ()
    if header != _HEADER:
        raise DatasetError(
            f"{path}, line 1: expected the header 'Source<TAB>Target', got "
            f"{(first[1][:60] if first else '')!r}; is this a ListOps TSV from lra_release?"
        )
    for lineno, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DatasetError(
                f"{path}, line {lineno}: expected 2 tab-separated fields (Source, Target), "
                f"found {len(fields)}; the file is truncated or damaged"
            )
        label = fields[1].strip()
        if not (label.isascii() and label.isdigit() and int(label) < LISTOPS_N_CLASSES):
            raise DatasetError(
                f"{path}, line {lineno}: label {label[:20]!r} is not an integer 0-9; "
                "the file is truncated or damaged"
            )
        yield _unquote(fields[0]), int(label)


def _read_split(path: Path, scratch: Path, split: str, l_max: int, ids: dict, progress: bool):
    """Token keys (first-seen ids in `ids`), labels and lengths of one ListOps file."""
    n_max = max(count_lines(path) - 1, 0)
    x = scratch_array(scratch, split, (n_max, l_max))
    y = np.zeros(n_max, dtype=np.int32)
    lengths = np.zeros(n_max, dtype=np.int32)
    report = Progress(f"listops {split}", n_max, enabled=progress, every=10_000)
    n = 0
    for text, label in iter_listops_tsv(path):
        tokens = listops_tokenize(text)[: l_max - 1]
        try:
            keys = [ids[t] for t in tokens]
        except KeyError:
            keys = [ids.setdefault(t, len(ids)) for t in tokens]
        lengths[n] = write_row(x[n], np.asarray(keys, dtype=np.int32))
        y[n] = label
        n += 1
        report.step(n)
    if n == 0:
        raise DatasetError(
            f"{path}: the {split} split has no examples (only a header); the file is "
            "truncated, re-extract `lra_release.gz`"
        )
    report.done(n)
    return x[:n], y[:n], lengths[:n]


def prepare_listops(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    l_max: int = LISTOPS_L_MAX,
    force: bool = False,
    progress: bool = True,
) -> PreparedDataset:
    """Read ListOps from the LRA release (or a generated copy) into a cached dataset.

    **Arguments:**
    - `source`: the release root or the folder with `basic_*.tsv` (default: data root).
    - `out`: the cache folder (default: `<data root>/prepared/listops`).
    - `l_max`: sequence length incl. `<eos>` (2048 in the paper's runs).
    - `force`: rebuild even if `out` holds the same source and options.

    **Returns:** splits train/val/test with x (N, l_max) int32 token ids, y (N,) int32 and
    lengths (N,) int32 (incl. `<eos>`); `n_classes` 10; `vocab_size` 18 on the release.
    """
    folder = find_listops(source)
    out = Path(out).expanduser() if out is not None else data_root() / "prepared" / "listops"
    if l_max < 2:
        raise ValueError(f"l_max must be at least 2, got {l_max}")
    provenance = {"preparer": _PREPARER, "source": str(folder), "options": {"l_max": l_max}}
    if (generated := read_generated(folder)) is not None:
        provenance["generated"] = generated
    if not force and (cached := reuse_prepared(out, provenance)) is not None:
        return cached
    ids: dict[str, int] = {}
    with scratch_dir(out) as scratch:
        arrays = {
            split: _read_split(folder / name, scratch, split, l_max, ids, progress)
            for split, name in _FILES.items()
        }
        counts = count_keys(arrays["train"][0], len(ids))
        itos, table = vocab_from_keys(counts, list(ids).__getitem__)
        for x, _, _ in arrays.values():
            remap_in_place(x, table)
        dataset = PreparedDataset(
            name="listops",
            task="classification",
            splits={s: Split(x=x, y=y, lengths=n) for s, (x, y, n) in arrays.items()},
            n_classes=LISTOPS_N_CLASSES,
            vocab_size=len(itos),
            meta={
                **provenance,
                "vocab": itos,
                "sizes": {s: len(a[1]) for s, a in arrays.items()},
                "tokenizer": "']'->'X', drop '(' ')', split on whitespace; truncate to "
                "l_max-1, append <eos>; pad with <pad>=0",
                "reference": "datasets.md §2.1 (S4/S5 ListOps); S5 one-hot IN_DIM = 20",
                "one_hot_width": 20,  # the authors' one-hot input width (model parameter count)
            },
        )
        save_prepared(out, dataset)
        del arrays, dataset
    return load_prepared(out)
