"""The UEA/UCR time-series archives' `.ts` format, read directly.

A `.ts` file is a header of `@key value` lines, then `@data` and one example per line::

    # comments (also `%` lines, as some archive files have)
    @problemName BasicMotions
    @timeStamps false
    @missing false
    @univariate false
    @dimensions 6
    @equalLength true
    @seriesLength 100
    @classLabel true Standing Running Walking Badminton
    @data
    0.07,0.07,-0.9,...:0.3,0.1,...:...:Standing

Values are comma-separated, dimensions (channels) colon-separated, the label last; `?` (or
`NaN`) marks a missing value. `@classLabel false` with `@targetLabel true` (the UEA regression
archive) makes the last field a real-valued target. With `@timeStamps true` every value is a
`(time,value)` pair; times are numbers or dates (`2007-01-01 00:01:00`). Header keys are
matched case-insensitively (archive files write `@timeStamps` and `@timestamps`).

`load_ts("NAME_TRAIN.ts")` reads the training file and `NAME_TEST.ts` beside it and returns a
`PreparedDataset` in the same form as `load_user_npz` gives for an `.npz`:

- x (N, L, C) float32, zero-padded to the longest series of both files; `lengths` (N,) when
  any series is shorter. A channel shorter than the others of its example is zero-padded to
  the longest channel, and the example's length is that of its longest channel.
- classification: labels 0 .. K−1 in the sorted order of the `@classLabel` names (numeric
  order when every name is a number, so `1 2 ... 10` keeps its order); the names are kept in
  `meta["classes"]` (label i is `classes[i]`). Regression: float targets (N,).
- timestamps: `t` (N, L) float32, each series' times minus its first time, in units of the
  training file's median step (seconds for dates), so a regularly sampled series has steps
  of 1 (the model's Δ multipliers); every channel of an example must share its times.
- val: carved from the training file, stratified by class (each class with at least two
  examples gives `round(val_fraction · n)`, at least one, and keeps at least one), seeded by
  `val_seed`; regression draws `val_fraction` of the examples. `meta["val_split"]` says what
  was done. The test file stays the test split.
- missing values (`missing`): `"error"` (default) refuses them, naming the file and line;
  `"zero"` writes 0; `"ffill"` carries the last observed value forward (leading gaps take the
  first observed value); `"interpolate"` interpolates linearly in time between observed
  values (ends take the nearest observed value). A channel with no observed value becomes 0.
- values are stored as read: standardising channels (statistics from the training split
  only) is the training pipeline's job, shared with `.npz` data.

Hand-written rather than borrowed: the format is small, a reader of our own gives one-line
errors with file and line for every malformed input, and it keeps `sktime`/`aeon` (and
pandas) out of the dependencies. It gives exactly the values and labels of aeon 1.6.0's
`load_from_ts_file` on the TRAIN and TEST files of ACSF1, ArrowHead, BasicMotions, GunPoint,
ItalyPowerDemand, JapaneseVowels, OSULeaf, PLAID, PickupGestureWiimoteZ, Tecator,
Covid3Month, CardanoSentiment and UnitTest (checked by hand on 2026-11-25; aeon is not a
dependency, so no test repeats it).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from ._common import DatasetError
from ._prepared import PreparedDataset, Split

__all__ = [
    "MISSING_CHOICES",
    "TsFile",
    "announce_val_split",
    "convert_ts",
    "find_train_files",
    "load_ts",
    "npz_arrays",
    "read_ts",
    "ts_test_path",
]

log = logging.getLogger("s5jax.data")

MISSING_CHOICES = ("error", "zero", "ffill", "interpolate")
_BOOL_KEYS = ("timestamps", "missing", "univariate", "equallength", "targetlabel")
_INT_KEYS = ("dimensions", "serieslength")
_KEYS = (*_BOOL_KEYS, *_INT_KEYS, "problemname", "classlabel", "data")
_MISSING_TOKENS = ("?", "nan")
_PAIR = re.compile(r"\(([^()]*)\)")


@dataclass(frozen=True)
class TsFile:
    """One parsed `.ts` file.

    `values[i]` is example i as (C, L_i) float64 with NaN where a value is missing; `times[i]`
    its (L_i,) times (seconds for dates) or None; `labels[i]` the label text (classification),
    the float target (regression) or None (no labels); `lines[i]` its line number.
    """

    path: Path
    header: dict
    values: list[np.ndarray]
    times: list[np.ndarray | None]
    labels: list
    lines: list[int]

    @property
    def task(self) -> str | None:
        if self.header.get("classlabel"):
            return "classification"
        return "regression" if self.header.get("targetlabel") else None

    @property
    def channels(self) -> int:
        return self.values[0].shape[0]


def _error(path: Path, line: int | None, message: str) -> DatasetError:
    where = f"{path}" if line is None else f"{path}, line {line}"
    return DatasetError(f"{where}: {message}")


def _bool(path: Path, line: int, key: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise _error(path, line, f"@{key} must be true or false, got {value!r}")
    return value.lower() == "true"


def _parse_header(path: Path, lines: list[str]) -> tuple[dict, int]:
    """The header's keys (lower-cased) and the index of the first line after `@data`."""
    header: dict = {}
    for i, raw in enumerate(lines):
        line, lineno = raw.strip(), i + 1
        if not line or line[0] in "#%":
            continue
        if line[0] != "@":
            raise _error(
                path, lineno, f"{line[:40]!r} before @data; the header holds only @key value "
                "lines and # comments, and the examples follow a line @data"
            )  # fmt: skip
        tokens = line.split()
        key, values = tokens[0][1:].lower(), tokens[1:]
        if key == "data":
            if values:
                raise _error(path, lineno, "@data takes no value; put the examples on the "
                             "lines after it")  # fmt: skip
            return header, i + 1
        if key not in _KEYS:
            log.warning("%s, line %d: unknown header key %s ignored", path, lineno, tokens[0])
            continue
        if key == "problemname":  # informational; archive files repeat it (UnitTest_TEST.ts)
            header.setdefault(key, " ".join(values))
            continue
        if key == "classlabel":
            if not values:
                raise _error(path, lineno, "@classLabel needs true (and the class names) or false")
            on = _bool(path, lineno, "classLabel", values[0])
            if on and len(values) < 2:
                raise _error(path, lineno, "@classLabel true must list the class names, e.g. "
                             "@classLabel true 1 2 3")  # fmt: skip
            if len(set(values[1:])) != len(values[1:]):
                raise _error(path, lineno, "@classLabel lists a class name twice")
            value: object = values[1:] if on else False
        elif len(values) != 1:
            raise _error(path, lineno, f"@{tokens[0][1:]} takes one value, got {len(values)}")
        elif key in _BOOL_KEYS:
            value = _bool(path, lineno, tokens[0][1:], values[0])
        else:
            try:
                value = int(values[0])
            except ValueError:
                value = 0
            if value < 1:
                raise _error(path, lineno, f"@{tokens[0][1:]} must be a positive integer, got "
                             f"{values[0]!r}")  # fmt: skip
        if key in header and header[key] != value:
            raise _error(path, lineno, f"@{tokens[0][1:]} is given twice with different values")
        header[key] = value
    raise _error(path, None, "no @data line; the header must end with a line @data followed by "
                 "one example per line")  # fmt: skip


def _number(path: Path, lineno: int, dim: int, text: str) -> float:
    text = text.strip()
    if text.lower() in _MISSING_TOKENS:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise _error(
            path, lineno, f"dimension {dim + 1}: {text[:40]!r} is not a number (values are "
            "comma-separated numbers, ? for a missing one)"
        ) from None  # fmt: skip
    if not math.isfinite(value):
        raise _error(path, lineno, f"dimension {dim + 1}: value {text!r} is not finite; write "
                     "? for a missing value")  # fmt: skip
    return value


def _values(path: Path, lineno: int, dim: int, text: str) -> np.ndarray:
    if not text.strip():
        raise _error(path, lineno, f"dimension {dim + 1} has no values")
    parts = text.split(",")
    try:
        arr = np.array(parts, dtype=np.float64)
    except ValueError:  # a missing value, or an error to locate
        arr = np.array([_number(path, lineno, dim, p) for p in parts])
    if not np.isfinite(arr).all():
        arr = np.array([_number(path, lineno, dim, p) for p in parts])
    return arr


def _time(path: Path, lineno: int, dim: int, text: str) -> float | datetime:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise _error(path, lineno, f"dimension {dim + 1}: time {text[:40]!r} is neither a "
                     "number nor a date like 2007-01-01 00:01:00") from None  # fmt: skip


def _timed_values(path: Path, lineno: int, dim: int, text: str) -> tuple[np.ndarray, list]:
    text = text.strip()
    pairs = _PAIR.findall(text)
    if not pairs or _PAIR.sub("", text).replace(",", "").strip():
        raise _error(path, lineno, f"dimension {dim + 1}: with @timeStamps true, values must be "
                     "(time,value) pairs separated by commas")  # fmt: skip
    times, values = [], []
    for pair in pairs:
        if pair.count(",") != 1:
            raise _error(path, lineno, f"dimension {dim + 1}: ({pair[:40]}) is not a "
                         "(time,value) pair")  # fmt: skip
        t, v = pair.split(",")
        times.append(_time(path, lineno, dim, t))
        values.append(_number(path, lineno, dim, v))
    return np.array(values), times


def _seconds(path: Path, lineno: int, times: list) -> np.ndarray:
    kinds = {isinstance(t, datetime) for t in times}
    if len(kinds) > 1:
        raise _error(path, lineno, "mixes numeric times and dates; use one kind")
    if kinds == {True}:
        if len({t.tzinfo is None for t in times}) > 1:
            raise _error(path, lineno, "mixes dates with and without a time zone")
        t0 = times[0]
        return np.array([(t - t0).total_seconds() for t in times])
    return np.asarray(times, dtype=np.float64)


def _split_line(line: str, timed: bool, labelled: bool) -> tuple[list[str], str | None]:
    if not timed:
        parts = line.split(":")
        return (parts[:-1], parts[-1]) if labelled else (parts, None)
    # Times may hold colons (12:00:00): a dimension ends at "):"
    parts = re.split(r"\)\s*:", line)
    if labelled:
        channels, label = parts[:-1], parts[-1]
    else:
        channels, label = parts, None
    channels = [c + ")" for c in channels[:-1]] + channels[-1:]
    if labelled and channels:
        channels[-1] += ")"
    return channels, label


def read_ts(path: str | os.PathLike) -> TsFile:
    """Parse one `.ts` file (format: this module's docstring); missing values become NaN.

    Every problem raises `DatasetError` naming the file, the line and what to fix.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise _error(path, None, "file not found; give the path to a .ts file of the UEA/UCR "
                     "archives (NAME_TRAIN.ts)")  # fmt: skip
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _error(path, None, f"is not UTF-8 text ({e.reason} at byte {e.start}); is it a "
                     ".ts file?") from None  # fmt: skip
    except OSError as e:
        raise _error(path, None, f"cannot be read ({e.strerror})") from None
    lines = text.splitlines()
    header, start = _parse_header(path, lines)
    timed = bool(header.get("timestamps", False))
    classes = header.get("classlabel") or None
    regression = bool(header.get("targetlabel", False))
    if classes and regression:
        raise _error(path, None, "has both @classLabel true and @targetLabel true; a file is "
                     "either classification or regression")  # fmt: skip
    labelled = bool(classes) or regression
    n_dims = header.get("dimensions")
    if header.get("univariate") is True:
        if n_dims not in (None, 1):
            raise _error(path, None, f"says @univariate true but @dimensions {n_dims}")
        n_dims = 1
    equal = header.get("equallength")
    series_length = header.get("serieslength")
    class_set = set(classes or ())

    values, times, labels, linenos = [], [], [], []
    first_dims = None
    for i in range(start, len(lines)):
        line, lineno = lines[i].strip(), i + 1
        if not line or line[0] in "#%":
            continue
        if line[0] == "@":
            raise _error(path, lineno, f"header line {line.split()[0]} after @data; move it "
                         "above the @data line")  # fmt: skip
        chunks, label = _split_line(line, timed, labelled)
        if labelled and (label is None or not label.strip() or not chunks):
            raise _error(path, lineno, "no label: each example ends with :LABEL")
        expected = n_dims if n_dims is not None else first_dims
        if expected is not None and len(chunks) != expected:
            source = "@dimensions" if header.get("dimensions") else (
                "@univariate true" if n_dims == 1 and header.get("univariate") else
                "the first example")  # fmt: skip
            extra = " (is the label missing?)" if labelled and len(chunks) == expected - 1 else ""
            raise _error(path, lineno, f"has {len(chunks)} dimensions but {source} says "
                         f"{expected}{extra}")  # fmt: skip
        first_dims = len(chunks)
        if timed:
            parsed = [_timed_values(path, lineno, d, c) for d, c in enumerate(chunks)]
            chans = [v for v, _ in parsed]
            secs = [_seconds(path, lineno, t) for _, t in parsed]
            longest = max(range(len(secs)), key=lambda d: len(secs[d]))
            for d, s in enumerate(secs):
                if not np.array_equal(s, secs[longest][: len(s)]):
                    raise _error(path, lineno, f"dimension {d + 1} has other times than "
                                 f"dimension {longest + 1}; every dimension of an example must "
                                 "share its times")  # fmt: skip
            t = secs[longest]
            if len(t) > 1 and not (np.diff(t) > 0).all():
                j = int(np.flatnonzero(np.diff(t) <= 0)[0])
                raise _error(path, lineno, f"times are not strictly increasing (value {j + 2} "
                             f"is not after value {j + 1}); sort each series by time")  # fmt: skip
        else:
            chans = [_values(path, lineno, d, c) for d, c in enumerate(chunks)]
            t = None
        sizes = [len(c) for c in chans]
        if (
            series_length is not None
            and equal is not False
            and any(s != series_length for s in sizes)
        ):
            bad = next(d for d, s in enumerate(sizes) if s != series_length)
            raise _error(path, lineno, f"dimension {bad + 1} has {sizes[bad]} values but "
                         f"@seriesLength is {series_length}")  # fmt: skip
        if equal and values and max(sizes) != values[0].shape[1]:
            raise _error(path, lineno, f"has {max(sizes)} steps but the first example has "
                         f"{values[0].shape[1]} and @equalLength is true")  # fmt: skip
        arr = np.zeros((len(chans), max(sizes)))
        for d, c in enumerate(chans):
            arr[d, : len(c)] = c
        values.append(arr)
        times.append(t)
        linenos.append(lineno)
        if classes:
            label = label.strip()
            if label not in class_set:
                raise _error(path, lineno, f"label {label!r} is not in @classLabel "
                             f"({' '.join(classes)})")  # fmt: skip
            labels.append(label)
        elif regression:
            labels.append(_number(path, lineno, len(chunks), label))
            if math.isnan(labels[-1]):
                raise _error(path, lineno, "the regression target is missing (?); drop the "
                             "example or give its target")  # fmt: skip
        else:
            labels.append(None)
    if not values:
        raise _error(path, None, "no examples after @data")
    return TsFile(path, header, values, times, labels, linenos)


def ts_test_path(train_path: str | os.PathLike) -> Path:
    """`NAME_TEST.ts` beside `NAME_TRAIN.ts` (the archives' naming)."""
    train_path = Path(train_path).expanduser()
    m = re.fullmatch(r"(.*)_train\.ts", train_path.name, flags=re.IGNORECASE)
    if m is None:
        raise DatasetError(
            f"{train_path}: give the training file NAME_TRAIN.ts of a UEA/UCR dataset (its test "
            "file NAME_TEST.ts is read from the same folder)"
        )
    suffix = train_path.name[len(m.group(1)) :]
    test_name = m.group(1) + suffix.replace("TRAIN", "TEST").replace("train", "test")
    return train_path.with_name(test_name)


# --------------------------------------------------------------------------------------------
# Missing values


def _fill(values: np.ndarray, x_axis: np.ndarray, how: str) -> np.ndarray:
    """Fill the NaNs of one (C, L) example along its steps (`x_axis`: times or indices)."""
    out = values.copy()
    for c in range(out.shape[0]):
        row = out[c]
        miss = np.isnan(row)
        if not miss.any():
            continue
        seen = ~miss
        if how == "zero" or not seen.any():
            row[miss] = 0.0
        elif how == "ffill":
            idx = np.where(seen, np.arange(len(row)), -1)
            idx = np.maximum.accumulate(idx)
            first = int(np.flatnonzero(seen)[0])
            idx[idx < 0] = first
            out[c] = row[idx]
        else:
            row[miss] = np.interp(x_axis[miss], x_axis[seen], row[seen])
    return out


def _fill_missing(f: TsFile, missing: str, lengths: list[int]) -> list[np.ndarray]:
    out = []
    for i, (v, t) in enumerate(zip(f.values, f.times, strict=True)):
        v = v[:, : lengths[i]]
        if np.isnan(v).any():
            if missing == "error":
                c, j = (int(k) for k in np.argwhere(np.isnan(v))[0])
                raise _error(
                    f.path, f.lines[i], f"missing value (?) at dimension {c + 1}, step {j + 1}; "
                    "choose how to fill missing values: data.missing = zero, ffill or "
                    "interpolate (s5jax train --set data.missing=ffill; s5jax data prepare uea "
                    "--missing ffill)"
                )  # fmt: skip
            x_axis = np.arange(v.shape[1], dtype=np.float64) if t is None else t
            v = _fill(v, x_axis, missing)
        out.append(v)
    return out


# --------------------------------------------------------------------------------------------
# Assembly


def _class_order(names: list[str]) -> list[str]:
    """Numeric order when every name is a number (1 2 ... 10), else sorted text."""
    try:
        return sorted(names, key=float)
    except ValueError:
        return sorted(names)


def _val_indices(
    labels: np.ndarray,
    task: str,
    fraction: float,
    seed: int,
    own_split: str = "convert the data to .npz with a val split of your own",
) -> tuple[np.ndarray, str]:
    rng = np.random.default_rng(seed)
    n = len(labels)
    if task == "regression":
        k = min(max(1, round(fraction * n)), n - 1)
        picked = rng.permutation(n)[:k]
        how = f"{k} of {n} drawn at random"
    else:
        picked, skipped = [], []
        for c in np.unique(labels):
            members = np.flatnonzero(labels == c)
            if len(members) < 2:
                skipped.append(int(c))
                continue
            k = min(max(1, round(fraction * len(members))), len(members) - 1)
            picked.extend(rng.permutation(members)[:k])
        picked = np.asarray(picked, dtype=np.int64)
        how = f"{len(picked)} of {n}, stratified by class"
        if skipped:
            how += f" (classes {skipped} have one training example: none to spare)"
    if len(picked) == 0:
        raise DatasetError(
            f"too few training examples ({n}) to carve a validation split from; give more "
            f"examples, or {own_split}"
        )
    return np.sort(picked), f"{how}, seed {seed}, fraction {fraction:g}"


def _stack(
    f: TsFile, filled: list[np.ndarray], L: int, time_unit: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n, C = len(filled), filled[0].shape[0]
    x = np.zeros((n, L, C), np.float32)
    lengths = np.array([v.shape[1] for v in filled], np.int32)
    for i, v in enumerate(filled):
        x[i, : v.shape[1]] = v.T
    if time_unit is None:
        return x, lengths, None
    t = np.zeros((n, L), np.float64)
    for i, ti in enumerate(f.times):
        m = lengths[i]
        t[i, :m] = (ti[:m] - ti[0]) / time_unit
        # Padding continues the times by steps of 1 (never read: the lengths mask it).
        t[i, m:] = t[i, m - 1] + np.arange(1, L - m + 1)
    return x, lengths, t.astype(np.float32)


def load_ts(
    path: str | os.PathLike,
    *,
    missing: str = "error",
    val_fraction: float = 0.1,
    val_seed: int = 0,
    name: str | None = None,
    announce: bool = True,
) -> PreparedDataset:
    """Load a UEA/UCR dataset from `NAME_TRAIN.ts` and `NAME_TEST.ts` beside it.

    **Arguments:**
    - `path`: the training file (`NAME_TRAIN.ts`).
    - `missing`: what to do with missing values: one of `MISSING_CHOICES` (module docstring).
    - `val_fraction`: share of the training file carved off as the val split (stratified by
      class), in [0, 1); 0 carves none and the dataset has no val split.
    - `val_seed`: seed of that draw.
    - `name`: dataset name (default: the file name without `_TRAIN.ts`).
    - `announce`: log how the val split was carved (an INFO line of the `s5jax` logger).

    **Returns:** a `PreparedDataset` with train, val and test splits; its `meta` records the
    source files, the class names (`classes`), the val split and the missing-value choice.
    """
    if missing not in MISSING_CHOICES:
        raise DatasetError(
            f"data.missing must be one of {', '.join(MISSING_CHOICES)}, got {missing!r}"
        )
    if not 0 <= val_fraction < 1:
        raise DatasetError(f"data.val_fraction must be in [0, 1), got {val_fraction!r}")
    train_path = Path(path).expanduser()
    test_path = ts_test_path(train_path)
    train = read_ts(train_path)
    if not test_path.is_file():
        raise DatasetError(
            f"{test_path}: test file not found (looked beside {train_path.name}); put "
            f"{test_path.name} in {test_path.parent}"
        )
    test = read_ts(test_path)
    task = train.task
    if task is None:
        raise _error(train_path, None, "has no labels (@classLabel false, no @targetLabel "
                     "true); training needs class labels or regression targets")  # fmt: skip
    if test.task != task:
        raise _error(test_path, None, f"is {test.task or 'unlabelled'} but {train_path.name} "
                     f"is {task}; the two files must describe the same problem")  # fmt: skip
    if test.channels != train.channels:
        raise _error(test_path, test.lines[0], f"has {test.channels} dimensions but "
                     f"{train_path.name} has {train.channels}")  # fmt: skip
    if bool(test.header.get("timestamps")) != bool(train.header.get("timestamps")):
        raise _error(test_path, None, f"@timeStamps differs from {train_path.name}")

    files = (train, test)
    lengths = [[v.shape[1] for v in f.values] for f in files]
    filled = [_fill_missing(f, missing, n) for f, n in zip(files, lengths, strict=True)]
    L = max(max(n) for n in lengths)
    time_unit = None
    if train.header.get("timestamps"):
        steps = np.concatenate([np.diff(t) for t in train.times if len(t) > 1] or [np.ones(1)])
        time_unit = float(np.median(steps))

    meta: dict = {
        "source": str(train_path),
        "test_source": str(test_path),
        "format": "uea_ts",
        "problem_name": train.header.get("problemname"),
        "missing": missing,
        "in_dim": train.channels,
        "seq_len": L,
    }
    if time_unit is not None:
        meta["time_unit"] = time_unit  # of the file's times (seconds for dates)
    if task == "classification":
        classes = _class_order(list(train.header["classlabel"]))
        if test.header.get("classlabel") and set(test.header["classlabel"]) != set(classes):
            raise _error(test_path, None, f"@classLabel lists other classes than "
                         f"{train_path.name}: {' '.join(test.header['classlabel'])}")  # fmt: skip
        index = {c: i for i, c in enumerate(classes)}
        ys = [np.array([index[lab] for lab in f.labels], np.int32) for f in files]
        n_classes = len(classes)
        if n_classes < 2:
            raise _error(train_path, None, "@classLabel lists one class; classification needs "
                         "at least two")  # fmt: skip
        meta["classes"] = classes
    else:
        ys = [np.array(f.labels, np.float32) for f in files]
        n_classes = 0
        meta.update(per_step=False, target_dim=1)

    arrays = [_stack(f, v, L, time_unit) for f, v in zip(files, filled, strict=True)]
    padded = any(min(n) < L for n in lengths)
    if val_fraction == 0:
        val_idx = np.zeros(0, np.int64)
        meta["val_split"] = (
            f"no val split: all {len(ys[0])} examples of {train_path.name} train "
            "(data.val_fraction = 0)"
        )
    else:
        val_idx, how = _val_indices(ys[0], task, val_fraction, val_seed)
        meta["val_split"] = f"val carved from {train_path.name}: {how}"
        meta["val_carved"] = True  # ours to carve differently (`s5jax.train._defaults`)
    keep = np.setdiff1d(np.arange(len(ys[0])), val_idx)

    def split(k: int, rows=None) -> Split:
        x, n, t = arrays[k]
        y = ys[k]
        if rows is not None:
            x, n, y = x[rows], n[rows], y[rows]
            t = None if t is None else t[rows]
        return Split(x=x, y=y, lengths=n if padded else None, t=t)

    dataset_name = name or re.sub(r"_train\.ts$", "", train_path.name, flags=re.IGNORECASE)
    splits = {"train": split(0, keep), "val": split(0, val_idx), "test": split(1)}
    if val_fraction == 0:
        del splits["val"]
    dataset = PreparedDataset(
        name=dataset_name,
        task=task,
        splits=splits,
        n_classes=n_classes,
        meta=meta,
    )
    if announce:
        announce_val_split(dataset)
    return dataset


def announce_val_split(dataset: PreparedDataset) -> None:
    """Log how a `.ts` dataset's val split was made (an INFO line of the `s5jax` logger);
    nothing for other datasets."""
    if "val_split" in dataset.meta:
        log.info("%s: %s", dataset.name, dataset.meta["val_split"])


# --------------------------------------------------------------------------------------------
# Conversion to the `.npz` own-data format


def find_train_files(source: str | os.PathLike) -> list[Path]:
    """The `*_TRAIN.ts` files of `source`: the file itself, or every one under a folder."""
    source = Path(source).expanduser()
    if source.is_file():
        ts_test_path(source)  # checks the name
        return [source]
    if not source.is_dir():
        raise DatasetError(f"--source {source}: no such file or folder")
    found = sorted(
        p for p in source.rglob("*") if p.is_file() and re.search(r"_train\.ts$", p.name, re.I)
    )
    if not found:
        raise DatasetError(
            f"--source {source}: no NAME_TRAIN.ts file in this folder or below it; give a "
            "folder of UEA/UCR .ts files (NAME/NAME_TRAIN.ts and NAME_TEST.ts) or one file"
        )
    return found


def npz_arrays(dataset: PreparedDataset) -> dict[str, np.ndarray]:
    """The own-data `.npz` keys of `dataset` (see `load_user_npz`)."""
    arrays: dict[str, np.ndarray] = {}
    for s, split in dataset.splits.items():
        arrays[f"x_{s}"], arrays[f"y_{s}"] = split.x, split.y
        if split.lengths is not None:
            arrays[f"lengths_{s}"] = split.lengths
        if split.t is not None:
            arrays[f"t_{s}"] = split.t
    if dataset.task == "classification":
        arrays["n_classes"] = np.array(dataset.n_classes)
        if dataset.meta.get("classes"):  # label i is classes[i], as in the .ts file
            arrays["classes"] = np.array(dataset.meta["classes"], dtype=np.str_)
    else:
        arrays["task"] = np.array("regression")
    return arrays


def convert_ts(
    source: str | os.PathLike,
    out_folder: str | os.PathLike,
    *,
    missing: str = "error",
    val_fraction: float = 0.1,
    val_seed: int = 0,
) -> list[tuple[Path, PreparedDataset]]:
    """Convert `NAME_TRAIN.ts` (+ `NAME_TEST.ts`) files to `out_folder/NAME.npz`.

    Every file is read and checked before anything is written; each `.npz` is written
    atomically. **Returns:** `(npz path, dataset)` for each dataset, in name order.
    """
    from ._common import atomic_save_npz

    if val_fraction == 0:
        raise DatasetError(
            "data.val_fraction = 0: the conversion writes the carved val split into the .npz; "
            "give a fraction in (0, 1) to convert, or train on the .ts file directly"
        )
    options = {"missing": missing, "val_fraction": val_fraction, "val_seed": val_seed}
    files = find_train_files(source)
    names = [re.sub(r"_train\.ts$", "", f.name, flags=re.I) for f in files]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DatasetError(f"--source {source}: more than one {twice[0]}_TRAIN.ts below it")
    for f in files:  # check all first: nothing is written unless every file reads
        load_ts(f, **options, announce=False)
    out_folder = Path(out_folder)
    done = []
    for f, name in zip(files, names, strict=True):
        dataset = load_ts(f, **options, announce=False)
        out_folder.mkdir(parents=True, exist_ok=True)
        path = out_folder / f"{name}.npz"
        atomic_save_npz(path, **npz_arrays(dataset))
        done.append((path, dataset))
    return done
