"""1-nearest-neighbour Euclidean baseline on UEA/UCR `.ts` classification datasets.

For each `NAME_TRAIN.ts` given (its `NAME_TEST.ts` beside it, read with `s5jax.data._uea`),
every series is resampled by linear interpolation over its valid steps to a common length
(`--length`, default the longest training series), then each test series takes the label of
its nearest training series in squared Euclidean distance over all steps and channels (ties:
the first). The whole training file is the reference set (no val carve), as in the archives'
published 1-NN ED figures.

Three input scalings are reported, each computed before resampling:

- `none`: the values as stored;
- `channel`: each channel standardised with the mean and (population) std of the training
  file's valid steps: what `data.normalize = "channel"` does in training;
- `example`: each series standardised per channel over its own valid steps (the archives'
  z-normalisation; `data.normalize = "example"`).

A std below 1e-8 divides by 1. Missing values are refused (`--missing` fills them as
`data.missing` does). Results: `results/knn-baseline-cpu.json` with the command, versions
and host.

    python benchmarks/knn_baseline.py /data/uea/*/*_TRAIN.ts
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _common import device_info, write_json

from s5jax.data._uea import MISSING_CHOICES, _fill_missing, read_ts, ts_test_path

EPS = 1e-8
SCALINGS = ("none", "channel", "example")


def series(path: Path, missing: str) -> tuple[list[np.ndarray], list[str], dict]:
    """The (C, L_i) series of one file, missing values filled, and its labels."""
    f = read_ts(path)
    if f.task != "classification":
        raise ValueError(f"{path.name}: not a classification file")
    lengths = [v.shape[1] for v in f.values]
    return _fill_missing(f, missing, lengths), list(f.labels), f.header


def scale(xs: list[np.ndarray], how: str, train: list[np.ndarray]) -> list[np.ndarray]:
    if how == "none":
        return xs
    if how == "example":
        out = []
        for v in xs:
            std = v.std(axis=1, keepdims=True)
            out.append((v - v.mean(axis=1, keepdims=True)) / np.where(std < EPS, 1.0, std))
        return out
    steps = np.concatenate(train, axis=1)  # (C, all valid training steps)
    mean, std = steps.mean(axis=1, keepdims=True), steps.std(axis=1, keepdims=True)
    std = np.where(std < EPS, 1.0, std)
    return [(v - mean) / std for v in xs]


def resample(xs: list[np.ndarray], length: int) -> np.ndarray:
    """(N, C * length): each (C, L_i) series linearly interpolated to `length` steps."""
    out = np.empty((len(xs), xs[0].shape[0], length))
    for i, v in enumerate(xs):
        L = v.shape[1]
        if L == 1:
            out[i] = v[:, :1]
            continue
        where = np.linspace(0.0, L - 1.0, length)
        steps = np.arange(L, dtype=np.float64)
        for c in range(v.shape[0]):
            out[i, c] = np.interp(where, steps, v[c])
    return out.reshape(len(xs), -1)


def one_nn(train: np.ndarray, y_train: np.ndarray, test: np.ndarray) -> np.ndarray:
    d = (test**2).sum(1)[:, None] + (train**2).sum(1)[None, :] - 2.0 * test @ train.T
    return y_train[np.argmin(d, axis=1)]


def run(path: Path, length: int | None, missing: str) -> dict:
    tr, y_tr, header = series(path, missing)
    te, y_te, _ = series(ts_test_path(path), missing)
    T = length or max(v.shape[1] for v in tr)
    y_tr, y_te = np.array(y_tr), np.array(y_te)
    lens = [v.shape[1] for v in tr + te]
    result = {
        "dataset": path.name.removesuffix("_TRAIN.ts"),
        "n_train": len(tr),
        "n_test": len(te),
        "channels": tr[0].shape[0],
        "classes": len(header["classlabel"]),
        "lengths": [min(lens), max(lens)],
        "resampled_length": T,
    }
    for how in SCALINGS:
        a, b = resample(scale(tr, how, tr), T), resample(scale(te, how, tr), T)
        result[f"accuracy_{how}"] = float((one_nn(a, y_tr, b) == y_te).mean())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("train_files", nargs="+", type=Path, help="NAME_TRAIN.ts files")
    parser.add_argument("--length", type=int, help="common length (default: longest train)")
    parser.add_argument("--missing", choices=MISSING_CHOICES, default="error")
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args(argv)
    rows, skipped = [], []
    for path in args.train_files:
        if read_ts(path).task != "classification":
            skipped.append(path.name)
            continue
        t0 = time.perf_counter()
        row = run(path, args.length, args.missing)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(
            f"{row['dataset']:24s} L {row['lengths'][0]}-{row['lengths'][1]} -> "
            f"{row['resampled_length']:5d}  1-NN ED accuracy: none {row['accuracy_none']:.4f}"
            f"  channel {row['accuracy_channel']:.4f}  example {row['accuracy_example']:.4f}"
        )
    if skipped:
        print(f"skipped (not classification): {', '.join(skipped)}")
    if not args.no_save:
        payload = {
            "command": "python benchmarks/knn_baseline.py " + " ".join(sys.argv[1:]),
            "method": "1-NN, squared Euclidean distance, series linearly resampled to a common "
            "length; scalings computed before resampling (see the script's docstring)",
            "results": rows,
            "skipped": skipped,
            "host": device_info(),
        }
        print(f"wrote {write_json('knn-baseline', payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
