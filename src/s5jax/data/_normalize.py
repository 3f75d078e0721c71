"""Input normalisation of float feature sequences: `data.normalize`.

- `"none"`: the inputs as stored.
- `"channel"`: each feature (channel) standardised with the mean and standard deviation of
  the *training* split's valid steps (padding excluded); the same two vectors are applied to
  every split and to new data at `s5jax predict` / `s5jax export`. Causal: each step needs
  only itself.
- `"example"`: each sequence standardised on its own, per channel, over its valid steps
  (`lengths`). For data whose amplitudes differ by orders of magnitude between examples
  (the shape carries the class, not the scale). Not causal: a step's value depends on the
  whole sequence, so a model meant for online use (`model.causal = true`) refuses it.

Regression targets (`data.normalize_targets = "standard"`) are not transformed here: their
train-split mean and std per target are recorded in `meta["target_normalization"]`
(`{"mode", "mean", "std"}`), and the model's head maps its standardised outputs back to the
targets' units with them (`s5jax.nn.RegressionHead`), so that every metric and prediction
is in the targets' units; the training loss divides each target's squared error by its
variance (`s5jax.train._steps.per_example_loss`).

Padded steps (beyond `lengths`) are zero after normalisation, as before it. A standard
deviation below `EPS` (a constant channel) divides by 1 instead. Token inputs are never
normalised. The statistics are recorded in the dataset's `meta["normalization"]`
(`{"mode", "mean", "std"}`) so that new data is transformed with the training split's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ._common import DatasetError
from ._prepared import PreparedDataset

__all__ = [
    "EPS",
    "MODES",
    "TARGET_MODES",
    "apply_normalization",
    "channel_stats",
    "normalize_dataset",
    "normalize_inputs",
]

MODES = ("none", "channel", "example")
TARGET_MODES = ("none", "standard")
EPS = 1e-8


def _valid_mask(x: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """(N, L, 1) bool: which steps are valid."""
    n, L = x.shape[:2]
    if lengths is None:
        return np.ones((n, L, 1), bool)
    return (np.arange(L)[None, :] < np.asarray(lengths)[:, None])[..., None]


def channel_stats(x: np.ndarray, lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std over every valid step of `x` (N, L, D), in float64."""
    mask = _valid_mask(x, lengths)
    count = mask.sum()
    xd = np.asarray(x, np.float64)
    mean = (xd * mask).sum(axis=(0, 1)) / count
    var = (((xd - mean) * mask) ** 2).sum(axis=(0, 1)) / count
    return mean, np.sqrt(var)


def normalize_inputs(x: np.ndarray, lengths: np.ndarray | None, info: dict[str, Any] | None):
    """`x` (N, L, D) transformed as `info` (a dataset's `meta["normalization"]`) says.

    `info = None` or mode `"none"` returns `x` unchanged. Returns float32.
    """
    mode = "none" if info is None else info["mode"]
    if mode == "none" or x.ndim != 3:
        return x
    mask = _valid_mask(x, lengths)
    xd = np.asarray(x, np.float64)
    if mode == "channel":
        mean, std = np.asarray(info["mean"]), np.asarray(info["std"])
    elif mode == "example":
        count = mask.sum(axis=1, keepdims=True)
        mean = (xd * mask).sum(axis=1, keepdims=True) / count
        std = np.sqrt((((xd - mean) * mask) ** 2).sum(axis=1, keepdims=True) / count)
    else:
        raise DatasetError(f"data.normalize = {mode!r}: must be one of {', '.join(MODES)}")
    out = (xd - mean) / np.where(std < EPS, 1.0, std)
    return np.where(mask, out, 0.0).astype(np.float32)


def target_stats(y: np.ndarray, lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-target mean and std (float64) of regression targets `y`: (N,), (N, K), or per
    step (N, L, K) over the valid steps (`lengths`); a std below `EPS` reads as 1."""
    y = np.asarray(y, np.float64)
    if y.ndim == 3:
        y = y[_valid_mask(y, lengths)[..., 0]]  # (valid steps, K)
    y = y.reshape(len(y), -1)
    mean, std = y.mean(axis=0), y.std(axis=0)
    return mean, np.where(std < EPS, 1.0, std)


def _with_target_stats(dataset: PreparedDataset, mode: str) -> PreparedDataset:
    """`dataset` with `meta["target_normalization"]` for `mode` "standard" (train split)."""
    if mode not in TARGET_MODES:
        raise DatasetError(
            f"data.normalize_targets = {mode!r}: must be one of {', '.join(TARGET_MODES)}"
        )
    if mode == "none":
        return dataset
    train = dataset.splits.get("train")
    if dataset.task != "regression" or train is None:
        raise DatasetError(
            f"data.normalize_targets = {mode!r} standardises regression targets; dataset "
            f"{dataset.name!r} is {dataset.task}: set data.normalize_targets = none"
        )
    mean, std = target_stats(np.asarray(train.y), train.lengths)
    info = {"mode": mode, "mean": mean.tolist(), "std": std.tolist()}
    return replace(dataset, meta={**dataset.meta, "target_normalization": info})


def normalize_dataset(
    dataset: PreparedDataset, mode: str, targets: str = "none"
) -> PreparedDataset:
    """`dataset` with its float inputs normalised by `mode` (statistics from `train`), and
    its regression targets' statistics recorded for `targets = "standard"`.

    The result's `meta["normalization"]` records the mode and, for `"channel"`, the
    statistics, so that `apply_normalization` treats new data the same way;
    `meta["target_normalization"]` the targets' (module docstring).
    """
    dataset = _with_target_stats(dataset, targets)
    if mode not in MODES:
        raise DatasetError(f"data.normalize = {mode!r}: must be one of {', '.join(MODES)}")
    if mode == "none":
        return dataset
    train = dataset.splits.get("train")
    if train is None or dataset.vocab_size is not None or np.asarray(train.x).ndim != 3:
        raise DatasetError(
            f"data.normalize = {mode!r}: dataset {dataset.name!r} has token (integer) inputs or "
            "no train split; normalisation applies to float feature sequences (N, L, D) only: "
            "set data.normalize = none"
        )
    info: dict[str, Any] = {"mode": mode}
    if mode == "channel":
        mean, std = channel_stats(np.asarray(train.x), train.lengths)
        info |= {"mean": mean.tolist(), "std": std.tolist()}
    return apply_normalization(dataset, info)


def apply_normalization(dataset: PreparedDataset, info: dict[str, Any] | None) -> PreparedDataset:
    """`dataset` transformed with given statistics (another dataset's `meta["normalization"]`)."""
    if info is None or info["mode"] == "none":
        return dataset
    splits = {
        name: replace(s, x=normalize_inputs(np.asarray(s.x), s.lengths, info))
        for name, s in dataset.splits.items()
    }
    return replace(dataset, splits=splits, meta={**dataset.meta, "normalization": info})
