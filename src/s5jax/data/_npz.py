"""Your own data: one `.npz` file, no code needed.

Save your arrays with `np.savez` under these keys (`{split}` is each of `train`, `val`, `test`;
without any val key, `load_user_npz` carves the val split from the training split):

| key               | shape                      | meaning                                        |
|-------------------|----------------------------|------------------------------------------------|
| `x_{split}`       | (N, L, D) float            | D features per step, L steps per sequence      |
|                   | (N, L) integer             | or token ids `0 .. vocab_size - 1`             |
| `y_{split}`       | (N,) integer               | classification: labels `0 .. n_classes - 1`    |
|                   | (N,) str                   | or class names (`"cat"`, `"dog"`, ...)         |
|                   | (N, L) integer or str      | classification per step (sequence labelling)   |
|                   | (N,) or (N, K) float       | regression: a target (vector) per sequence     |
|                   | (N, L) or (N, L, K) float  | regression: a target (vector) per step         |
| `lengths_{split}` | (N,) integer, optional     | valid steps of each padded sequence, 1 .. L    |
| `t_{split}`       | (N, L) float, optional     | observation times, strictly increasing over    |
|                   |                            | the valid steps (irregular sampling)           |
| `n_classes`       | int scalar, optional       | implies classification; default: max label + 1 |
| `classes`         | (C,) str, optional         | names of integer labels `0 .. C - 1`           |
| `vocab_size`      | int scalar, optional       | default: largest token + 1 over all splits     |
| `task`            | str scalar, optional       | `"classification"` or `"regression"` (default: |
|                   |                            | classification when `y_train` is integer)      |
| `per_step`        | bool scalar, optional      | float `y` of shape (N, L): per step (default), |
|                   |                            | or False for (N, K) per sequence with K == L   |

Class names, stored as the labels themselves or as `classes`, are carried into the run:
predictions name their classes (`classes[pred]`), and `s5jax predict --data` reads labels
by name. Names stored as labels are numbered in sorted order (numeric order when every name
is a number), over the names of all splits.

L and D must be the same in every split; N may differ. Inputs, targets and times must be
finite on every valid step. With `lengths_{split}`, the padding steps (`k >= lengths[i]`) may
hold anything: NaN and Inf in inputs and per-step targets, and any per-step label (−1, NaN,
an empty name), read as 0 there (no figure reads a padding target), and the padding's times
are replaced by times that go on from each example's last valid time in steps of the split's
median valid step. Per-step targets are stored as (N, L, K) (K = 1 for (N, L)). For example,
4-class classification of 3-feature sequences:

```python
import numpy as np
rng = np.random.default_rng(0)
sizes = {"train": 800, "val": 100, "test": 100}
arrays = {f"x_{s}": rng.normal(size=(n, 100, 3)).astype(np.float32) for s, n in sizes.items()}
arrays |= {f"y_{s}": rng.integers(0, 4, size=n) for s, n in sizes.items()}
np.savez("mydata.npz", **arrays)
```

`load_user_npz("mydata.npz")` checks the whole file before any training starts and names
the key and the fix for each problem; `describe` summarises what it found.
"""

from __future__ import annotations

import itertools
import logging
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ._common import DatasetError
from ._prepared import PreparedDataset, Split

__all__ = ["SPLITS", "describe", "load_user_npz"]

_log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
_PER_SPLIT = ("x", "y", "lengths", "t")
_SCALARS = ("n_classes", "vocab_size", "task", "per_step")
_TASKS = ("classification", "regression")


# What numpy, zipfile and zlib raise on a damaged or truncated file: a bad CRC or header
# (BadZipFile, ValueError), a broken deflate stream (zlib.error, EOFError), an unsupported
# compression method or zip feature read from flipped bits (NotImplementedError), a huge
# size field (MemoryError, OverflowError), bytes that are not text (UnicodeDecodeError is a
# ValueError), and read errors (OSError).
_CORRUPT = (
    OSError,
    ValueError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,  # zipfile: a member flagged as encrypted ("password required")
    MemoryError,
    OverflowError,
)


def _reason(error: BaseException) -> str:
    """The first line of an exception's message, for a one-line error."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _allowed_keys() -> list[str]:
    return [f"{f}_{s}" for s in SPLITS for f in _PER_SPLIT] + list(_SCALARS) + ["classes"]


def _is_label_key(key: str) -> bool:
    """Keys that may hold text: class labels (`y_{split}`, or `y` in a predict file) and the
    names of integer labels (`classes`)."""
    return key == "y" or key.startswith("y_") or key == "classes"


class _Reader:
    """Reads the arrays of one npz file and words errors with the file and key."""

    #: How training data is written, for the message of a file that is not an `.npz`.
    TRAINING = (
        "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...) (x_val, y_val "
        "optional), or give a UEA/UCR NAME_TRAIN.ts"
    )

    def __init__(self, path: Path, written: str = TRAINING):
        self.path = path
        self.splits = SPLITS  # the splits the file holds (`_check_keys`)
        if not path.exists():
            raise DatasetError(
                f"{path}: file not found; give the path to an .npz file written with np.savez"
            )
        if not path.is_file() or not zipfile.is_zipfile(path):
            raise DatasetError(f"{path}: not an .npz file; write your arrays with {written}")
        try:
            # Our own handle: np.load leaks the one it opens when the zip directory is bad.
            with path.open("rb") as f:
                npz = np.load(f, allow_pickle=False)
                if not isinstance(npz, np.lib.npyio.NpzFile):  # a damaged zip signature
                    raise DatasetError(f"{path}: not an .npz file; write it again with np.savez")
                with npz:
                    self.keys = list(npz.files)
                    self.arrays = {key: self._read(npz, key) for key in self.keys}
        except DatasetError:
            raise
        except _CORRUPT as e:
            raise DatasetError(
                f"{path}: cannot be read as an .npz file ({_reason(e)}); the file is damaged "
                "or not written with np.savez: write it again"
            ) from e

    def _read(self, npz, key: str) -> np.ndarray:
        try:
            arr = npz[key]
        except ValueError as e:
            if "allow_pickle" not in str(e):
                raise self.error(key, f"is corrupt ({_reason(e)}); write the file again") from e
            what = (
                "integer labels or class names (np.asarray(y, dtype=str), as a pandas column "
                "of strings needs)"
                if _is_label_key(key)
                else "a numeric numpy array"
            )
            message = f"cannot be loaded ({e}); store {what}, not Python objects"
            raise self.error(key, message) from e
        except _CORRUPT as e:
            raise self.error(key, f"is corrupt ({_reason(e)}); write the file again") from e
        if arr.dtype.kind in "US" and _is_label_key(key):
            return _as_text(self, key, arr)
        if arr.dtype.kind not in "biuf" and key != "task":
            allowed = (
                "integer labels or class names (np.asarray(y, dtype=str))"
                if _is_label_key(key)
                else "a numeric array (integer, bool or float)"
            )
            raise self.error(
                key,
                f"has dtype {arr.dtype}; store {allowed}, not objects or complex numbers",
            )
        return arr

    def name(self, key: str) -> str:
        """The file's own name of `key` (itself here; renamed keys in a predict file)."""
        return key

    def error(self, key: str, message: str) -> DatasetError:
        return DatasetError(f"{self.path}: key {key!r} {message}")


def _is_int(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "biu"


def _is_text(arr: np.ndarray) -> bool:
    return arr.dtype.kind == "U"


def _as_text(r, key: str, arr: np.ndarray) -> np.ndarray:
    """A str array from text labels: bytes (`S`, as h5py and older numpy write) decoded as
    UTF-8, surrounding spaces stripped (as a `.ts` file's labels are), no empty name."""
    if arr.dtype.kind == "S":
        try:
            arr = np.char.decode(arr, "utf-8")
        except UnicodeDecodeError as e:
            raise r.error(key, f"holds bytes that are not UTF-8 text ({e.reason})") from None
    arr = np.char.strip(arr)
    if arr.ndim <= 1:  # a label per step may be empty on padding (`_named_labels`)
        _no_empty_name(r, key, arr, arr == "")
    return arr


def _no_empty_name(r, key: str, arr: np.ndarray, empty: np.ndarray) -> None:
    """An error at the first empty class name among `empty`'s entries of `arr`."""
    if empty.any():
        at = tuple(int(i) for i in np.argwhere(empty)[0])
        where = f"index {at[0]}" if arr.ndim <= 1 else f"(example, step) {at}"
        raise r.error(
            key,
            f"has an empty class name at {where} (a missing label?); drop the example or "
            "name its class",
        )


def _padding(lengths: np.ndarray, L: int, ndim: int) -> np.ndarray:
    """The padding steps (`k >= lengths[i]`) as a boolean mask broadcasting against an
    (N, L, ...) array of rank `ndim`."""
    pad = np.arange(L)[None, :] >= np.asarray(lengths)[:, None]
    return pad.reshape(pad.shape + (1,) * (ndim - 2))


def _lengths_formula(key: str, ndim: int) -> str:
    """Python that computes the valid lengths of `key`'s rows from its trailing NaN."""
    finite = f"np.isfinite({key})" + (".all(axis=2)" if ndim == 3 else "")
    return f"{finite}.sum(axis=1)"


def _check_finite(
    r: _Reader, key: str, arr: np.ndarray, lengths: np.ndarray | None = None, steps=False
) -> np.ndarray:
    """`arr` when it is finite; else a one-line error naming the first NaN or Inf.

    `steps`: `arr` is (N, L, ...), one row per step. Then with the split's `lengths`, NaN
    or Inf on padding steps (`k >= lengths[i]`, a common way to pad) are allowed and read as
    0 (the returned copy): padding that no figure reads. Without `lengths`, non-finite values
    that end every row (padding after each sequence's end) get the fix in the error: the
    lengths key, computed from them.
    """
    if arr.dtype.kind != "f":
        return arr
    bad = ~np.isfinite(arr)
    if not bad.any():
        return arr
    if steps and lengths is not None:
        pad = _padding(lengths, arr.shape[1], arr.ndim)
        if not (bad & ~pad).any():
            return np.where(bad, np.zeros((), arr.dtype), arr)
        bad &= ~pad
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    valid = steps and lengths is not None  # the first lies on a valid step
    where = f", a valid step of its {int(lengths[first[0]])}" if valid else ""
    fix = "replace them (pad with zeros, impute or drop the example)"
    if steps and lengths is None and arr.ndim >= 2:
        bad_step = bad.reshape(*bad.shape[:2], -1).any(axis=2)
        ends = np.diff(bad_step.astype(np.int8), axis=1) >= 0  # once bad, bad to the end
        if not bad_step[:, 0].any() and ends.all():
            name, length_key = r.name(key), r.name(key.replace(key.split("_")[0], "lengths", 1))
            fix = (
                f"they end the sequences, as padding does: give {length_key}, each example's "
                f"valid steps ({length_key} = {_lengths_formula(name, arr.ndim)}): NaN and Inf "
                "on the padding are then allowed"
            )
    raise r.error(key, f"contains NaN or Inf (first at index {first}{where}); {fix}")


def _scalar(r: _Reader, key: str, kind: str) -> Any:
    if key not in r.arrays:
        return None
    arr = r.arrays[key]
    if arr.ndim != 0 and arr.size != 1:
        raise r.error(key, f"must be a single value, got shape {arr.shape}")
    value = arr.reshape(()).item()
    if kind == "int":
        if not _is_int(arr) or isinstance(value, bool) or value < 1:
            raise r.error(key, f"must be a positive integer, got {value!r}")
        return int(value)
    if kind == "bool":
        if arr.dtype.kind not in "biu" or value not in (0, 1):
            raise r.error(key, f"must be True or False, got {value!r}")
        return bool(value)
    if arr.dtype.kind != "U" or value not in _TASKS:
        raise r.error(key, f"must be 'classification' or 'regression', got {value!r}")
    return value


def _check_keys(r: _Reader) -> None:
    allowed = _allowed_keys()
    unknown = [k for k in r.keys if k not in allowed]
    if unknown:
        raise DatasetError(
            f"{r.path}: unknown key(s) {', '.join(map(repr, unknown))}; allowed keys are "
            f"{', '.join(allowed)} (splits are named {', '.join(SPLITS)})"
        )
    # Without any val key, the val split is carved from the training split (`load_user_npz`).
    has_val = any(f"{f}_val" in r.arrays for f in _PER_SPLIT)
    r.splits = SPLITS if has_val else ("train", "test")
    missing = [f"{f}_{s}" for s in r.splits for f in ("x", "y") if f"{f}_{s}" not in r.arrays]
    if missing:
        raise DatasetError(
            f"{r.path}: missing required key(s) {', '.join(map(repr, missing))}; the file needs "
            "x_train, y_train, x_test and y_test, and x_val, y_val or none of the val keys "
            "(then the val split is carved from the training split)"
        )


def _check_inputs(r: _Reader) -> tuple[bool, int, int | None]:
    """Check x of every split; return (tokens, L, D or None)."""
    first = r.arrays["x_train"]
    tokens = first.ndim == 2 and _is_int(first)
    ref_l = ref_d = None
    for s in r.splits:
        key, x = f"x_{s}", r.arrays[f"x_{s}"]
        if x.ndim == 2 and not _is_int(x):
            raise r.error(
                key,
                f"is float of shape {x.shape} (rank 2); float inputs need shape (N, L, D): "
                f"for one feature per step save x[..., None]; integer (N, L) arrays are tokens",
            )
        if x.ndim not in (2, 3):
            raise r.error(
                key,
                f"has shape {x.shape} (rank {x.ndim}); inputs must be (N, L, D) float features "
                "or (N, L) integer tokens (flatten extra axes into D, e.g. images to (N, H*W, C))",
            )
        if (x.ndim == 2) != tokens:
            kind = "tokens (N, L) integer" if tokens else "features (N, L, D)"
            raise r.error(
                key,
                f"has shape {x.shape} {x.dtype} but x_train holds {kind}; every split needs the "
                "same kind of input",
            )
        if len(x) == 0:
            raise r.error(key, "has no examples (N = 0); every split needs at least one")
        _check_sizes(r, key, x)
        if ref_l is None:
            ref_l = x.shape[1]
            ref_d = None if tokens else x.shape[2]
        elif x.shape[1] != ref_l:
            raise r.error(
                key,
                f"has sequence length L = {x.shape[1]} but x_train has L = {ref_l}; pad every "
                "split to the same L (and give lengths_{split} for the valid steps)",
            )
        elif not tokens and x.shape[2] != ref_d:
            raise r.error(
                key,
                f"has D = {x.shape[2]} features per step but x_train has D = {ref_d}; every "
                "split needs the same features",
            )
        if tokens and x.min() < 0:
            raise r.error(
                key,
                f"has negative token id {int(x.min())}; tokens must be ids 0 .. vocab_size-1 "
                "(map your vocabulary to non-negative integers)",
            )
    return tokens, ref_l, ref_d


def _check_sizes(r: _Reader, key: str, x: np.ndarray) -> None:
    """At least one step per sequence and one feature per step (else nothing to train on)."""
    if x.shape[1] < 1:
        raise r.error(key, f"has shape {x.shape}: L = 0 steps; every sequence needs at least one")
    if x.ndim == 3 and x.shape[2] < 1:
        raise r.error(key, f"has shape {x.shape}: D = 0 features per step; give at least one")


def _check_rows(r: _Reader, s: str) -> None:
    n = len(r.arrays[f"x_{s}"])
    for f in ("y", "lengths", "t"):
        key = f"{f}_{s}"
        if key in r.arrays:
            arr = r.arrays[key]
            m = len(arr) if arr.ndim else 0
            if m != n:
                raise r.error(
                    key,
                    f"has {m} rows but x_{s} has {n} examples; give one row per example, in "
                    "the same order",
                )


def _check_lengths(r: _Reader, s: str, L: int) -> np.ndarray | None:
    key = f"lengths_{s}"
    if key not in r.arrays:
        return None
    lengths = r.arrays[key]
    if lengths.ndim != 1:
        raise r.error(key, f"has shape {lengths.shape}; lengths must be (N,), one per example")
    if not _is_int(lengths) or lengths.dtype.kind == "b":
        raise r.error(key, f"has dtype {lengths.dtype}; lengths must be integers")
    if lengths.min() < 1 or lengths.max() > L:
        bad = int(np.flatnonzero((lengths < 1) | (lengths > L))[0])
        raise r.error(
            key,
            f"has length {int(lengths[bad])} at example {bad}; every length must be between 1 "
            f"and L = {L} (the number of valid steps before the padding)",
        )
    return lengths.astype(np.int32)


def _check_times(r: _Reader, s: str, L: int, lengths: np.ndarray | None) -> np.ndarray | None:
    """The split's observation times, checked: finite and strictly increasing over the valid
    steps. With `lengths`, the padding's times (whatever the file holds there, NaN included)
    are replaced by times that go on from each example's last valid time in steps of the
    split's median valid step, as a `.ts` file's padding is: a bidirectional layer's reverse
    scan runs over the padding, and times padded with zeros (a step of −t_last) made its
    state grow by exp(|Re λ|·Δ·t_last), to inf on long series."""
    key = f"t_{s}"
    if key not in r.arrays:
        return None
    t = r.arrays[key]
    n = len(r.arrays[f"x_{s}"])
    if t.shape != (n, L):
        raise r.error(
            key,
            f"has shape {t.shape}; observation times must be (N, L) = {(n, L)}, one time per step",
        )
    t = _check_finite(r, key, t.astype(np.float32), lengths, steps=True)
    dt = np.diff(t, axis=1)
    bad = dt <= 0
    if lengths is not None:
        valid_steps = np.arange(1, L)[None, :] < lengths[:, None]
        bad &= valid_steps
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise r.error(
            key,
            f"is not strictly increasing: example {i} has t[{j}] = {t[i, j]} then "
            f"t[{j + 1}] = {t[i, j + 1]} (as float32); times must strictly increase over the "
            "valid steps (sort each sequence by time and drop duplicate times)",
        )
    if lengths is not None and (lengths < L).any():
        step = float(np.median(dt[valid_steps])) if valid_steps.any() else 1.0
        last = t[np.arange(n), lengths - 1].astype(np.float64)
        after = np.arange(L)[None, :] - (lengths[:, None] - 1)  # 1, 2, ... on the padding
        t = np.where(after > 0, last[:, None] + step * after, t).astype(np.float32)
    return t


def _infer_task(r: _Reader, n_classes: int | None) -> str:
    task = _scalar(r, "task", "str")
    if task == "regression" and n_classes is not None:
        raise r.error("n_classes", "is given but task is 'regression'; drop one of the two keys")
    named = [s for s in r.splits if _is_text(r.arrays[f"y_{s}"])]
    if named and task == "regression":
        raise r.error(
            f"y_{named[0]}", "holds class names but task is 'regression'; store float targets"
        )
    if task is not None:
        return task
    if n_classes is not None or _is_int(r.arrays["y_train"]) or named:
        return "classification"
    # float y_train means regression; an integer split beside it is most likely class labels
    # whose training split went through a float conversion (pandas with missing values)
    for s in r.splits[1:]:
        if _is_int(r.arrays[f"y_{s}"]):
            raise r.error(
                f"y_{s}",
                "is integer (class labels) but y_train is float (regression targets); store "
                "every split's targets with the same dtype, or add task='regression' or "
                "task='classification' to the file",
            )
    _warn_if_labels(r)
    return "regression"


#: Float targets with at most this many distinct whole-number values read as likely labels.
_LIKELY_LABELS = 20


def _warn_if_labels(r: _Reader) -> None:
    """Warn when float y_train (one target per example) holds only a few whole numbers, as
    class labels saved as floats do (pandas, a `float64` array): read as regression targets,
    they train a regression model without a word. A `task` key says which it is."""
    y = r.arrays["y_train"]
    if y.ndim != 1 or not y.size or not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
        return
    values = np.unique(y)
    if 2 <= len(values) <= _LIKELY_LABELS:
        shown = ", ".join(f"{v:g}" for v in values[:5]) + (", ..." if len(values) > 5 else "")
        _warn_once(
            "%s: y_train is float but holds only %d whole numbers (%s): read as regression "
            "targets; for class labels store integers (y.astype(int)) or add "
            "task='classification' (task='regression' keeps regression without this warning)",
            r.path, len(values), shown,
        )  # fmt: skip


_warned: set[str] = set()


def _warn_once(message: str, *args) -> None:
    """Log a warning about a file once per process, as Python's `warnings` do: `s5jax train
    --data` reads the file twice when it drops the val carve, and said each warning twice."""
    text = message % args
    if text not in _warned:
        _warned.add(text)
        _log.warning(text)


def _label_names(r: _Reader, n_classes: int | None) -> list[str] | None:
    """The `classes` key, checked: unique names of the labels 0 .. C-1, or None."""
    if "classes" not in r.arrays:
        return None
    names = r.arrays["classes"]
    if not _is_text(names) or names.ndim != 1:
        raise r.error(
            "classes",
            f"has shape {names.shape} and dtype {names.dtype}; give the class names as a 1-d "
            "str array, classes[i] naming label i",
        )
    found, counts = np.unique(names, return_counts=True)
    twice = found[counts > 1].tolist()
    if twice:
        raise r.error("classes", f"names class {twice[0]!r} more than once; names must differ")
    if n_classes is not None and n_classes != len(names):
        raise r.error(
            "classes",
            f"names {len(names)} classes but n_classes is {n_classes}; drop n_classes (the "
            "names give the count) or name every class",
        )
    return names.tolist()


def _first(bad: np.ndarray) -> str:
    """Where the first True of `bad` is: the example, or (example, step) per step."""
    first = np.argwhere(bad)[0]
    return str(int(first[0])) if bad.ndim == 1 else str(tuple(int(i) for i in first))


def _label_steps(
    r: _Reader, L: int, lengths: dict[str, np.ndarray | None]
) -> dict[str, np.ndarray] | None:
    """Where the labels are: None for one label per example ((N,) in every split), else,
    for one label per step ((N, L) in every split), each split's mask of its valid steps
    (all of them without `lengths_*`; a padding step's label is never read)."""
    shapes = {s: r.arrays[f"y_{s}"].shape for s in r.splits}
    steps = {s: len(shape) == 2 and shape[1] == L for s, shape in shapes.items()}
    for s, shape in shapes.items():
        if len(shape) != 1 and not steps[s]:
            fix = (
                f"store y_{s}.ravel()"
                if len(shape) == 2 and shape[1] == 1
                else "for vector targets, store float regression targets"
            )
            raise r.error(
                f"y_{s}",
                f"has shape {shape}; classification labels must be (N,), one per example, or "
                f"(N, L) = (N, {L}), one per step ({fix})",
            )
    if not any(steps.values()):
        return None
    if not all(steps.values()):
        one = next(s for s, step in steps.items() if not step)
        raise r.error(
            f"y_{one}",
            f"has shape {shapes[one]} (one label per example) but y_train has one per step "
            f"{shapes['train']}; store every split's labels the same way",
        )
    return {
        s: np.ones(shapes[s], bool) if n is None else ~_padding(n, L, 2) for s, n in lengths.items()
    }


def _named_labels(
    r: _Reader, valid: dict[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], list[str]] | None:
    """Labels stored as class names: the names numbered in sorted order (numeric order when
    every name is a number, as for a `.ts` file) over all splits, or None for numbers.
    Per-step names (`valid`: each split's valid steps) are numbered over the valid steps;
    a padding step reads as label 0."""
    from ._uea import _class_order

    named = [s for s in r.splits if _is_text(r.arrays[f"y_{s}"])]
    if not named:
        return None
    numbers = [s for s in r.splits if s not in named]
    if numbers:
        raise r.error(
            f"y_{numbers[0]}",
            f"holds numbers but y_{named[0]} holds class names; store every split's labels "
            "the same way",
        )
    for key in ("n_classes", "classes"):
        if key in r.arrays:
            raise r.error(
                key,
                "is given but the labels are class names, which give the classes and their "
                f"count; drop {key} (or store integer labels)",
            )

    def names_of(s: str) -> np.ndarray:
        y = r.arrays[f"y_{s}"]
        if valid is None:
            return y
        _no_empty_name(r, f"y_{s}", y, (y == "") & valid[s])
        return y[valid[s]]

    unique = {s: np.unique(names_of(s), return_inverse=True) for s in r.splits}
    names = _class_order(sorted(set().union(*(found.tolist() for found, _ in unique.values()))))
    index = {c: i for i, c in enumerate(names)}
    labels = {}
    for s, (found, inverse) in unique.items():
        numbered = np.array([index[c] for c in found.tolist()], np.int32)[inverse.reshape(-1)]
        if valid is not None:
            numbered, steps = np.zeros(valid[s].shape, np.int32), numbered
            numbered[valid[s]] = steps
        labels[s] = numbered
    return labels, names


def _check_labels(
    r: _Reader, n_classes: int | None, L: int, lengths: dict[str, np.ndarray | None]
) -> tuple[dict[str, np.ndarray], int, list[str] | None, bool]:
    """The labels of every split as int32 0 .. C-1, C, the class names (or None), and
    whether there is one label per step ((N, L); a padding step, beyond `lengths_*`, may
    hold anything, NaN or −1 say, and reads as 0: no figure reads it)."""
    valid = _label_steps(r, L, lengths)
    named = _named_labels(r, valid)
    if named is not None:
        labels, names = named
        labels = _check_classes(r, labels, len(names), names, None, valid)
        return labels, len(names), names, valid is not None
    names = _label_names(r, n_classes)
    if names is not None and n_classes is None:
        n_classes = len(names)
    labels = {}
    for s in r.splits:
        key, y = f"y_{s}", r.arrays[f"y_{s}"]
        mask = np.ones(y.shape, bool) if valid is None else valid[s]
        where = "example" if valid is None else "(example, step)"
        if not _is_int(y):
            y = _check_finite(r, key, y, lengths[s], steps=valid is not None)
            whole = y == np.round(y)
            if not whole[mask].all():
                first = f"{y[~whole & mask][0].item()!r} at {where} {_first(~whole & mask)}"
                raise r.error(
                    key,
                    f"has non-integer label {first}; "
                    "classification labels must be integers 0 .. n_classes-1 (for real-valued "
                    "targets use task='regression')",
                )
        y = np.where(mask, y, 0)  # padding steps: label 0, never read
        if y.size and y.min() < 0:
            first = f"{y.min().item()!r} at {where} {_first((y < 0) & mask)}"
            raise r.error(
                key,
                f"has negative label {first}; labels must be 0 .. n_classes-1 (map your "
                "classes to consecutive integers from 0)",
            )
        if y.size and y.max() > np.iinfo(np.int32).max:  # it would wrap around in int32
            raise r.error(
                key,
                f"has label {y.max().item()!r}; labels must be 0 .. n_classes-1 (map your "
                "classes to consecutive integers from 0)",
            )
        labels[s] = y.astype(np.int32)
    top = max(int(y.max()) for y in labels.values())
    given = n_classes
    if n_classes is None:
        n_classes = top + 1
    for s, y in labels.items():
        if y.max() >= n_classes:
            count, fix = (
                (f"classes names {n_classes} classes", "name every class in classes")
                if names
                else (f"n_classes is {n_classes}", "raise n_classes")
            )
            raise r.error(
                f"y_{s}",
                f"has label {int(y.max())} but {count}; labels must be 0 .. {n_classes - 1} "
                f"({fix} or fix the labels)",
            )
    labels = _check_classes(r, labels, n_classes, names, given, valid)
    return labels, n_classes, names, valid is not None


def _check_classes(
    r: _Reader,
    labels: dict[str, np.ndarray],
    n_classes: int,
    names: list[str] | None,
    given: int | None,
    valid: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """At least two classes; warn about classes the training split never shows, and about
    numbers 0 .. C-1 no split uses when C came from the largest label (1-based labels).
    Per-step labels count on their `valid` steps only."""

    def shown(classes) -> str:
        classes = [names[c] if names else str(c) for c in classes]
        return ", ".join(classes[:10]) + (" ..." if len(classes) > 10 else "")

    if n_classes < 2:
        raise r.error(
            "y_train",
            f"gives only {n_classes} class; classification needs at least 2 (set n_classes "
            "if some classes are missing from the data)",
        )
    read = labels if valid is None else {s: y[valid[s]] for s, y in labels.items()}
    used = set(np.unique(np.concatenate(list(read.values()))).tolist())
    unseen = sorted(used - set(np.unique(read["train"]).tolist()))
    if unseen:
        _warn_once(
            "%s: class(es) %s appear in y_val/y_test but never in y_train: the model cannot "
            "learn them, and those examples count as errors",
            r.path, shown(unseen),
        )  # fmt: skip
    missing = n_classes - len(used)  # labels are 0 .. n_classes-1 here
    if missing and given is None and names is None:
        # the first 11 unused numbers, in at most len(used) + 11 steps: n_classes may be 2e9
        unused = list(itertools.islice((c for c in range(n_classes) if c not in used), 11))
        fix = (
            "labels start at 1: subtract 1 (y - 1)"
            if missing == 1 and unused == [0]
            else "map your classes to consecutive integers from 0, or store their names"
        )
        _warn_once(
            "%s: no split has label(s) %s of 0 .. %d, so %s of the model's %s outputs are for "
            "classes without an example: %s (or add n_classes to the file to keep them)",
            r.path, shown(unused), n_classes - 1, f"{missing:,}", f"{n_classes:,}", fix,
        )  # fmt: skip
    return labels


def _check_targets(
    r: _Reader, L: int, lengths: dict[str, np.ndarray | None]
) -> tuple[dict[str, np.ndarray], bool, int, bool]:
    """Float targets of every split, whether they are per step, their width K, and whether
    the file gave one scalar per step ((N, L), stored here as (N, L, 1)). Per-step targets
    may be NaN on the padding steps of a split with lengths (read as 0, never a target)."""
    per_step_key = _scalar(r, "per_step", "bool")
    targets = {}
    shapes = set()
    per_step = scalar_steps = False
    for s in r.splits:
        key, y = f"y_{s}", r.arrays[f"y_{s}"]
        if y.ndim == 1:
            step = False
        elif y.ndim == 2:
            step = y.shape[1] == L if per_step_key is None else per_step_key
        elif y.ndim == 3:
            step = True
        else:
            raise r.error(
                key,
                f"has shape {y.shape} (rank {y.ndim}); regression targets must be (N,) or "
                "(N, K) per sequence, or (N, L) or (N, L, K) per step",
            )
        if step and y.shape[1] != L:
            raise r.error(
                key,
                f"has shape {y.shape} but per-step targets need y.shape[1] == L = {L}; "
                "give one target per step (or set per_step=False for (N, K) targets)",
            )
        y = _check_finite(r, key, y.astype(np.float32), lengths[s], steps=step)
        scalar_steps = step and y.ndim == 2
        if scalar_steps:
            y = y[:, :, None]
        targets[s] = y
        shapes.add(y.shape[1:])
        per_step = step
    if len(shapes) > 1:
        raise r.error(
            "y_val" if targets["val"].shape[1:] != targets["train"].shape[1:] else "y_test",
            f"has target shape {sorted(shapes)} across splits; every split needs the same "
            "target shape as y_train",
        )
    target_dim = int(np.prod(targets["train"].shape[2 if per_step else 1 :], dtype=np.int64))
    return targets, per_step, target_dim, scalar_steps


def load_user_npz(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    val_fraction: float = 0.1,
    val_seed: int = 0,
) -> PreparedDataset:
    """Load and check your own dataset from one `.npz` file (format: this module's docstring).

    The task (classification or regression), number of classes, vocabulary size and sizes are
    inferred; every problem found raises `DatasetError` naming the file, the key and the fix,
    before any training starts. Arrays are loaded into memory; save the result with
    `save_prepared` for a memory-mapped cache.

    A file without val keys gets its val split carved from the training split as a UEA/UCR
    `.ts` file does: `val_fraction` of it, stratified by class for classification, drawn with
    `val_seed`; `val_fraction = 0` carves none (the dataset has no val split).
    `meta["val_split"]` says which.

    **Arguments:**
    - `path`: the `.npz` file.
    - `name`: dataset name (default: the file name without `.npz`).
    - `val_fraction`, `val_seed`: the carve of a file without a val split.
    """
    if not 0 <= val_fraction < 1:
        raise DatasetError(f"data.val_fraction must be in [0, 1), got {val_fraction!r}")
    path = Path(path).expanduser()
    r = _Reader(path)
    _check_keys(r)
    tokens, L, D = _check_inputs(r)
    for s in r.splits:
        _check_rows(r, s)
    lengths = {s: _check_lengths(r, s, L) for s in r.splits}
    if not tokens:  # NaN padding (beyond lengths) reads as zeros
        for s in r.splits:
            r.arrays[f"x_{s}"] = _check_finite(r, f"x_{s}", r.arrays[f"x_{s}"], lengths[s], True)

    n_classes_key = _scalar(r, "n_classes", "int")
    vocab_key = _scalar(r, "vocab_size", "int")
    task = _infer_task(r, n_classes_key)

    vocab_size = None
    if tokens:
        top = max(int(r.arrays[f"x_{s}"].max()) for s in r.splits)
        vocab_size = top + 1 if vocab_key is None else vocab_key
        for s in r.splits:
            x = r.arrays[f"x_{s}"]
            if x.max() >= vocab_size:
                raise r.error(
                    f"x_{s}",
                    f"has token id {int(x.max())} but vocab_size is {vocab_size}; tokens must "
                    f"be 0 .. {vocab_size - 1} (raise vocab_size or fix the tokens)",
                )
    elif vocab_key is not None:
        raise r.error(
            "vocab_size", "is given but the inputs are float features, not integer tokens"
        )

    meta: dict[str, Any] = {"source": str(path), "format": "user_npz", "seq_len": L}
    if task == "classification":
        ys, n_classes, names, per_step = _check_labels(r, n_classes_key, L, lengths)
        if names is not None:
            meta["classes"] = names
        if per_step:
            meta["per_step"] = True
    else:
        if "classes" in r.arrays:
            raise r.error("classes", "is given but the task is regression; drop classes")
        ys, per_step, target_dim, scalar_steps = _check_targets(r, L, lengths)
        n_classes = 0
        meta.update(per_step=per_step, target_dim=target_dim)
        if scalar_steps:  # predictions of shape (N, L), as the file gave the targets
            meta["scalar_step_targets"] = True
    meta["in_dim"] = D

    splits = {}
    for s in r.splits:
        x = r.arrays[f"x_{s}"]
        x = x.astype(np.int32) if tokens else x.astype(np.float32)
        t = _check_times(r, s, L, lengths[s])
        splits[s] = Split(x=x, y=ys[s], lengths=lengths[s], t=t)
    if "val" not in r.splits:
        splits = _carve_val(splits, task, val_fraction, val_seed, path, meta)
    return PreparedDataset(
        name=path.name.removesuffix(".npz") if name is None else name,
        task=task,
        splits=splits,
        n_classes=n_classes,
        vocab_size=vocab_size,
        meta=meta,
    )


def _carve_val(splits, task, val_fraction, val_seed, path, meta) -> dict[str, Split]:
    """The splits with `val` carved from `train` (train, val, test order), or without val for
    `val_fraction = 0`; the carve is recorded in `meta` as a `.ts` file's is."""
    from ._uea import _val_indices

    train = splits["train"]
    n = len(train.x)
    if val_fraction == 0:
        meta["val_split"] = (
            f"no val split: all {n} training examples of {path.name} train (data.val_fraction = 0)"
        )
        return splits
    try:
        # labels per step: no class per example to stratify by, a random draw
        how_drawn = "regression" if meta.get("per_step") else task
        val_idx, how = _val_indices(
            np.asarray(train.y), how_drawn, val_fraction, val_seed,
            "add x_val and y_val to the file",
        )  # fmt: skip
    except DatasetError as e:
        raise DatasetError(f"{path}: {e}") from None
    meta["val_split"] = f"val carved from the training split of {path.name}: {how}"
    meta["val_carved"] = True  # ours to carve differently (`s5jax.train._defaults`)
    keep = np.setdiff1d(np.arange(n), val_idx)

    def rows(idx) -> Split:
        return Split(**{f: None if a is None else a[idx] for f, a in _fields(train).items()})

    return {"train": rows(keep), "val": rows(val_idx), "test": splits["test"]}


def _fields(split: Split) -> dict[str, Any]:
    return {"x": split.x, "y": split.y, "lengths": split.lengths, "t": split.t}


def describe(dataset: PreparedDataset) -> str:
    """A one-paragraph summary of `dataset` for printing: task, inputs, splits and sizes."""
    splits = list(dataset.splits.items())
    x0 = splits[0][1].x
    if dataset.task == "classification":
        task = f"classification into {dataset.n_classes} classes"
        if dataset.meta.get("per_step"):
            task += ", a label per step"
    else:
        y0 = splits[0][1].y
        per_step = dataset.meta.get("per_step", y0.ndim == 3)
        shape = y0.shape[2:] if per_step else y0.shape[1:]
        what = f"{int(np.prod(shape, dtype=np.int64))}-dim" if shape else "scalar"
        task = f"regression of a {what} target per {'step' if per_step else 'sequence'}"
    if dataset.vocab_size is not None and x0.ndim == 2:
        inputs = f"token sequences of length L = {x0.shape[1]} (vocab {dataset.vocab_size})"
    elif dataset.vocab_size is not None:
        inputs = f"token inputs of shape {x0.shape[1:]} each (vocab {dataset.vocab_size})"
    elif x0.ndim == 3:
        inputs = f"sequences of L = {x0.shape[1]} steps x D = {x0.shape[2]} features"
    else:
        inputs = f"inputs of shape {x0.shape[1:]} each ({x0.dtype})"
    parts = [f"{dataset.name}: {task}; {inputs}."]
    parts.append("Splits: " + ", ".join(f"{s} N = {len(sp)}" for s, sp in splits) + ".")
    if any(sp.lengths is not None for _, sp in splits):
        lo = min(int(np.min(sp.lengths)) for _, sp in splits if sp.lengths is not None)
        hi = max(int(np.max(sp.lengths)) for _, sp in splits if sp.lengths is not None)
        parts.append(f"Padded, with valid lengths {lo} .. {hi}.")
    if any(sp.t is not None for _, sp in splits):
        parts.append("Irregularly sampled, with observation times t.")
    return " ".join(parts)
