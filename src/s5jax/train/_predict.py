"""A trained run without code: predictions on new data (`predict_run`) and a serialised model
for JAX programs without s5jax (`export_run`).

Both rebuild the run as `evaluate_run` does (`load_run`: config.json, the training data's
shapes, the checkpoint). Predictions use the eval step's batching (the last batch padded and
masked) and its per-example loss, so the metric printed for a file with targets is the one
`s5jax eval` gives on the same split. With `stream=True` the data are fed one step at a time
through the model's online API instead; for causal models the outputs are the same.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._atomic import atomic_open
from ..data import DatasetError, PreparedDataset, Split
from ..data._batches import iterate_batches, num_batches
from ..data._normalize import EPS, apply_normalization, normalize_inputs
from ..data._npz import _check_finite, _check_lengths, _check_times, _padding, _Reader
from ._data_spec import SPEC_ONLY
from ._engine import _host_batch, _loss_scale, _model_inputs, _Run
from ._progress import Progress
from ._runs import load_run
from ._steps import per_example_loss

log = logging.getLogger("s5jax")

__all__ = ["predict_run"]

_FIELDS = ("x", "y", "lengths", "t")


# --------------------------------------------------------------------------------------------
# What the run's model reads and writes


@dataclass(frozen=True)
class _Expect:
    """The inputs and targets the run's model takes, from its training data."""

    head: str
    pooling: str
    tokens: bool
    d_input: int
    vocab_size: int | None
    n_classes: int
    classes: tuple[str, ...] | None = None  # the training data's class names

    @classmethod
    def of(cls, run: _Run) -> _Expect:
        inputs = _model_inputs(run.dataset, run.head)
        tokens = inputs["vocab"] is not None
        vocab = run.dataset.vocab_size if tokens else None
        return cls(
            head=run.head, pooling=run.config.model.pooling, tokens=tokens,
            d_input=inputs["d_input"], vocab_size=vocab, n_classes=run.dataset.n_classes,
            classes=tuple(run.dataset.meta.get("classes") or ()) or None,
        )  # fmt: skip

    def output_shapes(self, run: _Run, x: np.ndarray):
        """The shapes of one example's output (a tuple of two for the Gaussian head)."""
        model = eqx.combine(run.params, run.static)
        one = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
        if self.head == "retrieval" or self.pooling == "masked_mean":
            length = jax.ShapeDtypeStruct((2,) if self.head == "retrieval" else (), jnp.int32)
        else:
            length = None
        out = jax.eval_shape(
            lambda x, n: model(x, run.model_state, inference=True, lengths=n)[0], one, length
        )
        return jax.tree.map(lambda s: s.shape, out)


def _error_for(where: str):
    def error(field: str, message: str) -> DatasetError:
        return DatasetError(f"{where}: {field!r} {message}")

    return error


def _check_inputs(x: np.ndarray, expect: _Expect, error) -> np.ndarray:
    """x against the model: token ids in the run's vocabulary, or (N, L, d_input) features."""
    if expect.tokens:
        rank, shape = (3, "(N, 2, L)") if expect.head == "retrieval" else (2, "(N, L)")
        if x.dtype.kind not in "iu" or x.ndim != rank:
            return _raise(
                error(
                    "x",
                    f"has shape {x.shape} and dtype {x.dtype}; this run's model reads token ids "
                    f"{shape} integer (vocabulary 0 .. {expect.vocab_size - 1}): store the ids "
                    "as an integer array",
                )
            )
        if x.size and (x.min() < 0 or x.max() >= expect.vocab_size):
            bad = int(x.min()) if x.min() < 0 else int(x.max())
            return _raise(
                error(
                    "x",
                    f"has token id {bad} outside the run's vocabulary 0 .. "
                    f"{expect.vocab_size - 1}; map the tokens with the vocabulary the run was "
                    "trained with",
                )
            )
        x = x.astype(np.int32)
    else:
        if x.ndim == 2 and x.dtype.kind in "iu":
            return _raise(
                error(
                    "x",
                    f"holds integer token ids {x.shape} but this run's model reads float "
                    f"features (N, L, {expect.d_input}); give features, or use a token model",
                )
            )
        if x.ndim != 3 or x.shape[-1] != expect.d_input:
            return _raise(
                error(
                    "x",
                    f"has shape {x.shape}; this run's model reads (N, L, D) float features "
                    f"with D = {expect.d_input} (the training data's width): give every step "
                    f"the {expect.d_input} features it was trained on",
                )
            )
        x = x.astype(np.float32)
    if len(x) == 0 or x.shape[-1 if expect.tokens else 1] == 0:
        return _raise(error("x", f"has shape {x.shape}; give at least one example of one step"))
    return x


def _numbered_names(classes: tuple[str, ...] | None) -> dict[str, int] | None:
    """Class names that are whole numbers other than their indices (a `.ts` file's labels
    1 2 10, say): name → number, or None. Integer labels could then mean either."""
    if not classes:
        return None
    try:
        numbers = {c: int(c) for c in classes}
    except ValueError:
        return None
    return None if list(numbers.values()) == list(range(len(classes))) else numbers


def _label_indices(y: np.ndarray, expect: _Expect, error) -> np.ndarray:
    """Class names as the run's label indices (its training data's `classes`)."""
    if expect.classes is None:
        raise error(
            "y",
            f"holds class names but this run was trained on unnamed labels 0 .. "
            f"{expect.n_classes - 1}; give integer labels",
        )
    index = {c: i for i, c in enumerate(expect.classes)}
    found, inverse = np.unique(y, return_inverse=True)
    unknown = [c for c in found.tolist() if c not in index]
    if unknown:
        raise error(
            "y",
            f"has class name(s) {', '.join(map(repr, unknown[:5]))} that the run was not "
            f"trained on (its classes: {', '.join(expect.classes)})",
        )
    return np.array([index[c] for c in found.tolist()], np.int32)[inverse].reshape(y.shape)


def _raise(e: Exception):
    raise e


def _check_targets(
    y: np.ndarray, out_shape, expect: _Expect, error, lengths: np.ndarray | None = None
) -> np.ndarray:
    """y against the model's output: labels 0 .. C−1, or targets of the output's shape
    (per-step targets may be NaN on the padding steps when `lengths` are given: read as 0,
    never a target, as in training)."""
    n = len(y)
    if expect.head in ("classification", "retrieval"):
        want = (n, *out_shape[:-1])
        if lengths is not None and expect.pooling == "none" and y.shape == want:
            # a label per step: a padding step's label (−1, NaN, any name) is never read
            pad = _padding(lengths, y.shape[1], y.ndim)
            fill = expect.classes[0] if y.dtype.kind == "U" and expect.classes else 0
            y = np.where(pad, y.dtype.type(fill), y)
        if y.dtype.kind == "U":
            y = _label_indices(y, expect, error)
        integral = y.dtype.kind in "iu" or (
            y.dtype.kind == "f" and np.isfinite(y).all() and np.array_equal(y, np.round(y))
        )
        if y.shape != want or not integral:
            raise error(
                "y",
                f"has shape {y.shape} and dtype {y.dtype}; this run's model predicts "
                f"classes, so labels must be integers of shape {want}",
            )
        numbered = _numbered_names(expect.classes)
        if y.size and (y.min() < 0 or y.max() >= expect.n_classes):
            bad = y.min() if y.min() < 0 else y.max()
            names = (
                f"; its classes are named {', '.join(expect.classes)}: give a class by its "
                "index, or labels as names (np.asarray(y).astype(str))"
                if numbered
                else ""
            )
            raise error(
                "y",
                f"has label {bad.item()!r}; the run has {expect.n_classes} classes "
                f"(labels 0 .. {expect.n_classes - 1}){names}",
            )
        if numbered and set(np.unique(y).tolist()) <= set(numbered.values()):
            said = error(
                "y",
                f"holds integer labels, read as class indices (0 is class {expect.classes[0]!r}, "
                f"1 is {expect.classes[1]!r}, ...), but they are also names of the run's "
                f"classes ({', '.join(expect.classes)}); to give names, store them as strings "
                "(np.asarray(y).astype(str))",
            )
            log.warning("%s", said)
        return y.astype(np.int32)
    shape = out_shape[0] if expect.head == "gaussian" else out_shape
    want = (n, *shape)
    if y.ndim == len(want) - 1 and want[-1] == 1:
        y = y[..., None]
    if y.shape != want or y.dtype.kind not in "biuf":
        raise error(
            "y",
            f"has shape {y.shape}; this run's model predicts targets of shape {want} "
            "(one row per example)",
        )
    y = y.astype(np.float32)
    bad = ~np.isfinite(y)
    if lengths is not None and y.ndim >= 3 and expect.pooling == "none":  # per step
        bad &= ~_padding(lengths, y.shape[1], y.ndim)
        y = np.where(np.isfinite(y), y, np.float32(0))
    if bad.any():
        where = " at a valid step" if lengths is not None and expect.pooling == "none" else ""
        raise error("y", f"contains NaN or Inf{where}; drop those examples or their targets")
    return y


class _SplitView:
    """One split of an `.npz`, with its keys renamed `{field}_s` so that the training
    reader's checks apply; their errors name the file's own keys."""

    def __init__(self, r: _Reader, names: dict[str, str]):
        self.path, self._names = r.path, names
        self.arrays = {f"{f}_s": r.arrays[k] for f, k in names.items() if k in r.arrays}

    def name(self, key: str) -> str:
        return self._names.get(key.rsplit("_", 1)[0], key)

    def error(self, key: str, message: str) -> DatasetError:
        field = key.rsplit("_", 1)[0]
        return DatasetError(f"{self.path}: key {self._names.get(field, key)!r} {message}")


def _read_npz(path: Path, split: str, expect: _Expect) -> tuple[str | None, dict]:
    """The arrays of `split` (or of the x-only form) of an `.npz`, checked as training does."""
    r = _Reader(path, "np.savez(path, x=...), or with the split's keys (x_test=..., ...)")
    if "x" in r.arrays:
        names, where = {f: f for f in _FIELDS}, None
    elif f"x_{split}" in r.arrays:
        names, where = {f: f"{f}_{split}" for f in _FIELDS}, split
    else:
        splits = sorted(k[2:] for k in r.arrays if k.startswith("x_"))
        carved = (
            " (a file without val keys has its val split carved from the training split when "
            "it trains: `s5jax predict RUN --split val` without --data predicts on that)"
            if split == "val" and "train" in splits
            else ""
        )
        raise DatasetError(
            f"{path}: has no key 'x_{split}' (splits in the file: {', '.join(splits) or 'none'}); "
            f"pass --split NAME, or save the inputs as 'x' (with optional 'lengths', 't', 'y')"
            f"{carved}"
        )
    view = _SplitView(r, names)
    error = view.error
    x = _check_inputs(view.arrays["x_s"], expect, lambda f, m: error(f"{f}_s", m))
    n, L = len(x), x.shape[-1] if expect.tokens else x.shape[1]
    for f in ("y", "lengths", "t"):
        arr = view.arrays.get(f"{f}_s")
        if arr is not None and (arr.ndim == 0 or len(arr) != n):
            raise error(f"{f}_s", f"has {len(arr) if arr.ndim else 0} rows but x has {n}; give "
                        "one row per example, in the same order")  # fmt: skip
    if expect.head == "retrieval":
        raise DatasetError(f"{path}: the retrieval model predicts from a prepared dataset only")
    lengths = _check_lengths(view, "s", L)
    if not expect.tokens:  # NaN padding (beyond lengths) reads as zeros, as in training
        x = _check_finite(view, "x_s", x, lengths, steps=True)
    t = _check_times(view, "s", L, lengths)
    y = view.arrays.get("y_s")
    return where, {"x": x, "y": y, "lengths": lengths, "t": t}


def _read_ts(path: Path, run: _Run, expect: _Expect) -> dict:
    """The examples of one UEA/UCR `.ts` file, read as the run's training file was: missing
    values filled by its `data.missing`, times in its unit (the training file's median step),
    class labels by its class names; labels (or targets) are optional."""
    from ..data._uea import _fill_missing, _stack, read_ts

    if not path.is_file():
        raise FileNotFoundError(f"--data {path}: no such file")
    if expect.tokens:
        raise DatasetError(f"{path}: this run's model reads token ids; a .ts file holds values")
    f = read_ts(path)
    if not f.values:
        raise DatasetError(f"{path}: holds no series; give at least one")
    if f.channels != expect.d_input:
        raise DatasetError(
            f"{path}: has {f.channels} dimension{'s' if f.channels > 1 else ''} per step; this "
            f"run's model reads {expect.d_input} (the training data's width)"
        )
    meta = run.dataset.meta
    unit = meta.get("time_unit")
    if bool(f.header.get("timestamps")) != (unit is not None):
        has, was = ("has", "was not") if unit is None else ("has no", "was")
        raise DatasetError(
            f"{path}: {has} timestamps (@timeStamps) but the run {was} trained with times; "
            "give series sampled as the training file's were"
        )
    lengths = [v.shape[1] for v in f.values]
    filled = _fill_missing(f, run.config.data.missing, lengths)
    # Padded to the training data's length when that was padded, as the run's own splits
    # are: a bidirectional layer's reverse scan and BatchNorm see the padding (as in the
    # authors' model). Equal-length training data was not padded, nor is this file then.
    train = run.dataset.splits["train"]
    trained = train.x.shape[1] if train.lengths is not None else 0
    if trained == 0 and len(set(lengths)) > 1 and expect.pooling == "mean":
        log.warning(
            "%s: series of %d to %d steps are padded to %d, and this run's model (trained on "
            "series of one length) pools with a plain mean: the padding enters the "
            "predictions of the shorter series",
            path, min(lengths), max(lengths), max(lengths),
        )  # fmt: skip
    x, n, t = _stack(f, filled, max(*lengths, trained), unit)
    y = None
    if f.task is not None:
        if f.task != run.dataset.task:
            raise DatasetError(
                f"{path}: holds {f.task} labels but the run's model does {run.dataset.task}; "
                "give the file of the run's problem (or one without labels)"
            )
        if f.task == "classification":
            classes = meta.get("classes")
            if classes is None:  # a model trained on an .npz: its classes are 0 .. C-1
                classes = [str(i) for i in range(run.dataset.n_classes)]
            index = {c: i for i, c in enumerate(classes)}
            unknown = sorted({str(label) for label in f.labels} - set(index))
            if unknown:
                raise DatasetError(
                    f"{path}: has class label(s) {', '.join(unknown[:5])} that the run was not "
                    f"trained on (its classes: {', '.join(classes)})"
                )
            y = np.array([index[str(label)] for label in f.labels], np.int32)
        else:
            y = np.array(f.labels, np.float32)
    return {"x": x, "y": y, "lengths": n, "t": t}


def _check_split(dataset: PreparedDataset, split: str) -> None:
    if split not in dataset.splits:
        raise ValueError(
            f"--split {split!r}: {dataset.name} has the splits {', '.join(sorted(dataset.splits))}"
        )


def _read_source(run: _Run, expect: _Expect, data, split: str) -> tuple[str | None, dict, str]:
    """(split name or None for the x-only form, checked arrays, a name for messages)."""
    from ._datasets import DATASETS, load_dataset

    config = run.config
    name = None if data is None else str(data)
    if name is None or name == config.data.dataset:
        dataset = run.dataset
        if dataset.meta.get(SPEC_ONLY):  # the run's own data named by its full path
            dataset = load_dataset(config.data, announce=False)
    elif name.lower().endswith((".ts", ".npz")) or Path(name).expanduser().exists():
        path = Path(name).expanduser()
        if name.lower().endswith(".ts"):  # one split: --split does not apply
            where, arrays = None, _read_ts(path, run, expect)
        else:
            where, arrays = _read_npz(path, split, expect)
        # New data gets the training data's normalisation (data.normalize, train statistics).
        info = run.dataset.meta.get("normalization")
        arrays["x"] = normalize_inputs(arrays["x"], arrays["lengths"], info)
        return where, arrays, name
    elif name in DATASETS:
        raw = load_dataset(
            replace(config.data, dataset=name, normalize="none", normalize_targets="none")
        )
        # Checked before the run's normalisation, whose statistics have the run's width.
        _check_split(raw, split)
        error = _error_for(f"dataset {raw.name!r}, split {split!r}")
        _check_inputs(np.asarray(raw.splits[split].x), expect, error)
        dataset = apply_normalization(raw, run.dataset.meta.get("normalization"))
    else:
        raise FileNotFoundError(
            f"--data {name}: no such file; give an .npz or a UEA/UCR .ts file, or a dataset name "
            f"(one of {', '.join(sorted(DATASETS))})"
        )
    _check_split(dataset, split)
    s = dataset.splits[split]
    error = _error_for(f"dataset {dataset.name!r}, split {split!r}")
    arrays = {"x": _check_inputs(np.asarray(s.x), expect, error), "y": s.y,
              "lengths": s.lengths, "t": s.t}  # fmt: skip
    return split, arrays, dataset.name


# --------------------------------------------------------------------------------------------
# Forward passes


def _offline(static):
    """Batched inference-mode forward of the model (as the eval step runs it)."""

    def forward(params, state, batch, step_rescale):
        model = eqx.combine(params, static)

        def one(x, length, dt):
            out, _ = model(
                x, state, inference=True, lengths=length, dt=dt, step_rescale=step_rescale
            )
            return out

        lengths, dt = batch.get("lengths"), batch.get("dt")
        axes = (0, None if lengths is None else 0, None if dt is None else 0)
        return jax.vmap(one, axis_name="batch", in_axes=axes)(batch["x"], lengths, dt)

    return jax.jit(forward)


def _streamed(static, pooling: str):
    """The same outputs, one step at a time through the online API (causal models).

    A pooled head's prediction is its output after the last step the offline model pools:
    `lengths − 1` under masked-mean pooling, the last step otherwise.
    """

    def forward(params, state, batch, step_rescale):
        model = eqx.combine(params, static)
        start = model.init_state(state)

        def one(x, length, dt):
            _, outs = model.run_online(start, x, dt=dt, step_rescale=step_rescale)
            if pooling == "none":
                return outs
            last = x.shape[0] - 1 if length is None or pooling != "masked_mean" else length - 1
            return jax.tree.map(lambda o: o[last], outs)

        lengths, dt = batch.get("lengths"), batch.get("dt")
        axes = (0, None if lengths is None else 0, None if dt is None else 0)
        return jax.vmap(one, axis_name="batch", in_axes=axes)(batch["x"], lengths, dt)

    return jax.jit(forward)


def _losses(head: str, padded: bool, target_scale=None):
    """Per-example (loss, metric), jitted; `padded`: called with each example's length too
    (per-step losses then average over the valid steps, as in training); `target_scale`:
    a regression head's per-target std (the loss of standardised targets, as in training)."""
    if padded:
        return jax.jit(jax.vmap(lambda o, y, n: per_example_loss(head, o, y, n, target_scale)))
    return jax.jit(jax.vmap(lambda o, y: per_example_loss(head, o, y, None, target_scale)))


def _scalar_targets(dataset: PreparedDataset) -> bool:
    """Whether the training data gave one scalar target per sequence ((N,)) or per step
    ((N, L)): a regression model's output then has a last axis of 1 that `pred` drops, so
    that `pred - y` is elementwise (with (N, 1) it would broadcast to (N, N))."""
    if dataset.meta.get("per_step"):
        return bool(dataset.meta.get("scalar_step_targets"))
    return dataset.splits["train"].y.ndim == 1


def _named_outputs(head: str, out, classes=None, squeeze=False) -> dict[str, np.ndarray]:
    """The predictions file's arrays; `classes` (the training file's class names, label i is
    `classes[i]`) is stored with a classifier's predictions, so `classes[pred]` names them;
    `squeeze` drops a regression output's last axis of 1 (`_scalar_targets`)."""
    if head == "gaussian":
        mean, variance = out
        return {"mean": np.asarray(mean), "variance": np.asarray(variance)}
    out = np.asarray(out)
    if head in ("classification", "retrieval"):
        named = {"log_probs": out, "pred": np.argmax(out, axis=-1).astype(np.int32)}
        if classes:
            named["classes"] = np.array([str(c) for c in classes], dtype=np.str_)
        return named
    return {"pred": out[..., 0] if squeeze and out.shape[-1] == 1 else out}


#: Every array name a predictions file can hold (`_named_outputs`, for any head).
PREDICTION_KEYS = frozenset({"log_probs", "pred", "classes", "mean", "variance"})


def _is_predictions(path: Path) -> bool:
    """Whether `path` is an `.npz` (read with numpy) holding only prediction arrays."""
    try:
        with np.load(path, allow_pickle=False) as f:
            names = set(f.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False
    return bool(names) and names <= PREDICTION_KEYS


def _check_out(out: Path, data: str | os.PathLike | None) -> None:
    """Refuse, before any work, an `out` that is a folder, not an `.npz` name (it could
    replace a run's config.json or metrics), the `data` file itself, or an existing file
    that is not an earlier predictions file (a user's data under another name)."""
    if out.is_dir():
        raise ValueError(
            f"--out {out} is a folder; give the predictions file's name, e.g. {out / 'pred.npz'}"
        )
    if out.suffix.lower() != ".npz":
        raise ValueError(f"--out {out}: give a file name ending in .npz (e.g. pred.npz)")
    if data is not None and out.exists() and Path(data).exists() and out.samefile(data):
        raise ValueError(
            f"--out {out} is the --data file; writing the predictions would replace the data "
            "(give another name, e.g. pred.npz)"
        )
    if out.exists() and not _is_predictions(out):
        raise ValueError(
            f"--out {out} exists and is not an s5jax predictions file (one holding only "
            f"{', '.join(sorted(PREDICTION_KEYS))}); give another name or move it away"
        )


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`np.savez` through the one atomic writer: no half-written file under `path`."""
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


# --------------------------------------------------------------------------------------------
# predict_run


def predict_run(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    data: str | os.PathLike | None = None,
    split: str = "test",
    which: str = "best",
    stream: bool = False,
    batch_size: int | None = None,
    progress: bool = True,
    dataset: PreparedDataset | None = None,
    messages=None,
) -> dict[str, Any]:
    """Predict with a run's checkpoint and write the predictions to `out` (an `.npz`).

    **Arguments:**
    - `run_dir`: a run directory written by `s5jax train`.
    - `out`: the predictions file, written atomically: `log_probs` (N, C) and `pred` (N,)
      for classification ((N, L, C) and (N, L) per step), with `classes` (C,) when the
      training data named its classes (a `.ts` file's labels, Speech Commands' words:
      `classes[pred]` are the predicted names), `pred` for regression in the shape of the
      training data's targets ((N,), (N, K), (N, L) or (N, L, K), with this data's N and
      L), `mean` and `variance` (N, L, D) for the Gaussian head.
    - `data`: an `.npz` (own-data format: split `x_{split}`, or only `x` with optional
      `lengths`, `t`, `y`), a UEA/UCR `.ts` file (labels optional; missing values, times
      and class names as the run's training file had them; padded to the training length
      when the training data was padded) or
      a prepared dataset's name; default the run's own data.
    - `split`: which split of `data` (not used for a `.ts` file, which is one split).
    - `which`: the checkpoint, `"best"` or `"latest"`.
    - `stream`: feed the data step by step through the online API (causal models only).
    - `batch_size`: examples per batch (default the run's `data.eval_batch_size`).
    - `progress`: show a progress bar on `messages` (default stderr).
    - `dataset`: the run's training data, when not the one its config names.

    **Returns:** `{"split", "n", "out"}`, plus `"loss"` and the run's metric (`"accuracy"` or
    `"mse"`, as `s5jax eval` computes them) when the data hold targets, and for a classifier
    `"balanced_accuracy"` (`balanced_accuracy`: the mean of the classes' recalls).
    """
    out = Path(out)
    _check_out(out, data)
    run = load_run(run_dir, which, dataset=dataset, examples=data is None)
    expect = _Expect.of(run)
    model = eqx.combine(run.params, run.static)
    if stream:
        model.check_online()
    where, arrays, source = _read_source(run, expect, data, split)
    x = arrays["x"]
    shapes = expect.output_shapes(run, x)
    has_targets = arrays["y"] is not None
    if has_targets:
        error = _error_for(source if where is None else f"{source}, split {where!r}")
        y = np.asarray(arrays["y"])
        arrays["y"] = _check_targets(y, shapes, expect, error, arrays["lengths"])
    else:
        arrays["y"] = np.zeros(len(x), np.int32)  # a placeholder the batches carry
    if expect.pooling == "masked_mean" and arrays["lengths"] is None:
        arrays["lengths"] = np.full(len(x), x.shape[1], np.int32)  # every step is valid
    size = run.eval_batch_size if batch_size is None else int(batch_size)
    if size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {size}")
    run.parallel.check_batch_size(size, "--batch-size")

    forward = _streamed(run.static, expect.pooling) if stream else _offline(run.static)
    scale = _loss_scale(_model_inputs(run.dataset, run.head)["targets"], run.head)
    losses = _losses(run.head, arrays["lengths"] is not None, scale)
    split_obj = Split(**arrays)
    bar = (
        Progress(num_batches(len(x), size), "predict", messages or sys.stderr, unit="batch")
        if progress
        else None
    )
    parts, sums = [], {"loss": 0.0, "metric": 0.0}
    for batch in iterate_batches(split_obj, size, shuffle=False, pad_last=True):
        host = _host_batch(batch, run.head)
        if not has_targets:
            host.pop("y")
        outputs = forward(run.params, run.model_state, run.parallel.shard(host), 1.0)
        mask = batch["mask"]
        parts.append(jax.tree.map(lambda o, m=mask: np.asarray(o)[m], outputs))
        if has_targets:
            valid = (host["lengths"],) if "lengths" in host else ()
            loss, metric = losses(outputs, host["y"], *valid)
            sums["loss"] += float(np.sum(np.asarray(loss, np.float64)[mask]))
            sums["metric"] += float(np.sum(np.asarray(metric, np.float64)[mask]))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    outputs = jax.tree.map(lambda *p: np.concatenate(p), *parts)
    squeeze = run.head == "regression" and _scalar_targets(run.dataset)
    classes = run.dataset.meta.get("classes")
    _write_npz(out, _named_outputs(run.head, outputs, classes, squeeze))
    result: dict[str, Any] = {"split": where, "n": len(x)}
    if has_targets:
        result |= {"loss": sums["loss"] / len(x), run.metric: sums["metric"] / len(x)}
        if run.head in ("classification", "retrieval"):
            result["balanced_accuracy"] = balanced_accuracy(
                np.argmax(outputs, axis=-1), np.asarray(arrays["y"]), arrays["lengths"]
            )
    return result | {"out": str(out)}


def balanced_accuracy(pred: np.ndarray, y: np.ndarray, lengths: np.ndarray | None = None) -> float:
    """The mean over the classes present in `y` of the fraction of their items predicted
    right (each class's recall; scikit-learn's `balanced_accuracy_score`): a constant
    prediction scores 1 / (number of classes) however rare the other classes are, where
    accuracy gives it the majority class's share.

    `pred`, `y`: (N,) per example, or (N, L) per step, where each valid step (the first
    `lengths[i]` of example i; every step without `lengths`) is an item: the steps of all
    examples are pooled by class, unlike `accuracy`'s per-example average.
    """
    pred, y = np.asarray(pred), np.asarray(y)
    if y.ndim == 2:
        n = np.full(len(y), y.shape[1]) if lengths is None else np.asarray(lengths)
        valid = np.arange(y.shape[1])[None, :] < n[:, None]
        pred, y = pred[valid], y[valid]
    classes = np.unique(y)
    if classes.size == 0:
        return float("nan")
    return float(np.mean([np.mean(pred[y == c] == c) for c in classes]))


# --------------------------------------------------------------------------------------------
# export_run

EXPORT_FORMAT = 1
#: Lowered for both, so one export runs on a CPU or an NVIDIA GPU.
EXPORT_PLATFORMS = ("cpu", "cuda")


def _dims(shape) -> list:
    return [d if isinstance(d, int) else str(d) for d in shape]


def _describe(names, avals) -> list[dict]:
    return [
        {"name": n, "shape": _dims(a.shape), "dtype": str(a.dtype)}
        for n, a in zip(names, avals, strict=True)
    ]


def _output_names(head: str) -> list[str]:
    return {"gaussian": ["mean", "variance"], "regression": ["pred"]}.get(head, ["log_probs"])


def _export(fn, *shapes):
    from jax import export

    try:
        return export.export(jax.jit(fn), platforms=EXPORT_PLATFORMS)(*shapes)
    except Exception:  # an operation without CUDA lowering rules: this machine's only
        return export.export(jax.jit(fn))(*shapes)


def _sequential_model(run: _Run):
    """The run's model with the sequential scan: it lowers with a symbolic length."""
    from ..nn import build_model

    inputs = _model_inputs(run.dataset, run.head)
    model, _ = build_model(
        run.config.model, key=jax.random.PRNGKey(0), scan_method="sequential", **inputs
    )
    # The scan method is static metadata: the trained leaves go into the new structure.
    params, static = eqx.partition(model, eqx.is_inexact_array)
    leaves = jax.tree_util.tree_leaves(run.params)
    return eqx.combine(
        jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves), static
    )


def _forward_inputs(model, expect: _Expect, b, length):
    """Names and shapes of the exported forward's inputs."""
    x = (b, length) if expect.tokens else (b, length, expect.d_input)
    names = ["x"]
    shapes = [jax.ShapeDtypeStruct(x, jnp.int32 if expect.tokens else jnp.float32)]
    if expect.pooling == "masked_mean" or model.mask_padding:
        names.append("lengths")
        shapes.append(jax.ShapeDtypeStruct((b,), jnp.int32))
    if model.timestep_mode in ("irregular", "append"):
        names.append("dt")
        shapes.append(jax.ShapeDtypeStruct((b, length), jnp.float32))
    return names, shapes


def _export_forward(run: _Run, expect: _Expect, length: int | None):
    from jax import export

    model = _sequential_model(run)
    state = run.model_state
    info = run.dataset.meta.get("normalization")

    def build(b, L):
        names, shapes = _forward_inputs(model, expect, b, L)

        def forward(*args):
            given = dict(zip(names, args, strict=True))

            def one(x, n, dt):
                x = _normalize_traced(x, n, info)
                return model(x, state, inference=True, lengths=n, dt=dt)[0]

            axes = [0 if k in given else None for k in ("x", "lengths", "dt")]
            return jax.vmap(one, axis_name="batch", in_axes=axes)(
                given["x"], given.get("lengths"), given.get("dt")
            )

        return names, _export(forward, *shapes)

    if length is None:
        b, L = export.symbolic_shape("b, l")
        try:
            return (*build(b, L), None)
        except Exception as e:  # any failure to lower: fall back to a fixed L
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            length, note = _train_length(run), f"a symbolic length failed to lower ({first})"
    else:
        note = "--length given"
    (b,) = export.symbolic_shape("b")
    return (*build(b, length), f"fixed length {length}: {note}")


def _normalize_traced(x, n, info):
    """One sequence `x` (L, D) normalised inside the exported function as the run's data was
    (`data.normalize`; `s5jax.data._normalize`), padding (steps from `n` on) zero."""
    mode = "none" if info is None else info["mode"]
    if mode == "none" or x.ndim != 2:
        return x
    valid = (jnp.arange(x.shape[0]) < (x.shape[0] if n is None else n))[:, None]
    if mode == "channel":
        mean = jnp.asarray(info["mean"], x.dtype)[None, :]
        std = jnp.asarray(info["std"], x.dtype)[None, :]
    else:
        count = jnp.maximum(valid.sum(), 1).astype(x.dtype)
        mean = jnp.where(valid, x, 0.0).sum(0, keepdims=True) / count
        std = jnp.sqrt(jnp.where(valid, (x - mean) ** 2, 0.0).sum(0, keepdims=True) / count)
    out = (x - mean) / jnp.where(std < EPS, 1.0, std)
    return jnp.where(valid, out, 0.0).astype(x.dtype)


def _train_length(run: _Run) -> int:
    x = run.dataset.splits["train"].x
    return int(x.shape[-1] if np.issubdtype(x.dtype, np.integer) else x.shape[1])


def _export_step(run: _Run, expect: _Expect):
    """The online step over a batch of streams, on the stream state's leaves."""
    from jax import export

    model = eqx.combine(run.params, run.static)
    stream = model.init_state(run.model_state)
    leaves, treedef = jax.tree_util.tree_flatten(stream)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(stream)[0]]

    info = run.dataset.meta.get("normalization")
    if info is not None and info["mode"] == "example":
        raise ValueError(
            "data.normalize = 'example' standardises each sequence with its own mean and std, "
            "which an online step cannot know"
        )

    def one(state, x_t, dt_t, reset):
        x_t = _normalize_traced(x_t[None], None, info)[0] if x_t.ndim == 1 else x_t
        new, out = model.step(
            jax.tree_util.tree_unflatten(treedef, list(state)), x_t, dt_t=dt_t, reset=reset
        )
        return tuple(jax.tree_util.tree_leaves(new)), out

    def step(state, x_t, dt_t, reset):
        return jax.vmap(one, axis_name="batch")(state, x_t, dt_t, reset)

    (b,) = export.symbolic_shape("b")
    state = tuple(jax.ShapeDtypeStruct((b, *a.shape), a.dtype) for a in leaves)
    x_t = (b,) if expect.tokens else (b, expect.d_input)
    exported = _export(
        step,
        state,
        jax.ShapeDtypeStruct(x_t, jnp.int32 if expect.tokens else jnp.float32),
        jax.ShapeDtypeStruct((b,), jnp.float32),
        jax.ShapeDtypeStruct((b,), jnp.bool_),
    )
    state_spec = [
        {"name": f"leaf_{i:03d}", "path": path, "shape": list(a.shape), "dtype": str(a.dtype)}
        for i, (path, a) in enumerate(zip(paths, leaves, strict=True))
    ]
    init = {f"leaf_{i:03d}": np.asarray(a) for i, a in enumerate(leaves)}
    return exported, state_spec, init


def export_run(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    which: str = "best",
    length: int | None = None,
    overwrite: bool = False,
    dataset: PreparedDataset | None = None,
) -> Path:
    """Serialise a run's model with `jax.export`, parameters baked in, into the folder `out`.

    Writes `forward.jax` (the offline forward in inference mode over a symbolic batch `b`,
    and a symbolic length `l` unless `length` is given), `step.jax` (causal models: one
    online step of `b` streams on the stream state's leaves), `init_state.npz` (those leaves
    before the first step, unbatched) and `spec.json` (inputs, outputs, the state's leaves,
    the run's config and how to call each function). The folder is built under a temporary
    name and renamed when complete; an existing non-empty `out` is replaced only when it is an
    earlier export and `overwrite=True`.
    Load with `jax.export.deserialize` alone (`examples/load_exported.py`).

    **Returns:** the folder.
    """
    import json

    from ..data._common import atomic_dir

    out = Path(out)
    _check_export_out(out, overwrite)
    if length is not None and length < 1:
        raise ValueError(f"--length must be at least 1, got {length}")
    if importlib.util.find_spec("flatbuffers") is None:  # jax.export serialises with it
        raise ValueError("s5jax export needs the flatbuffers package: pip install flatbuffers")
    run = load_run(run_dir, which, dataset=dataset, examples=False)
    expect = _Expect.of(run)
    model = eqx.combine(run.params, run.static)
    names, forward, fixed = _export_forward(run, expect, length)
    try:
        model.check_online()
        step, state_spec, init = _export_step(run, expect)
        no_step = None
    except ValueError as e:
        step, state_spec, init, no_step = None, [], {}, str(e)
    spec = _spec(run, expect, names, forward, fixed, step, state_spec, no_step, which)
    with atomic_dir(out) as tmp:
        (tmp / "forward.jax").write_bytes(forward.serialize())
        if step is not None:
            (tmp / "step.jax").write_bytes(step.serialize())
            np.savez(tmp / "init_state.npz", **init)
        (tmp / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    return out


_EXPORT_FILES = ("forward.jax", "step.jax", "init_state.npz", "spec.json")


def _check_export_out(out: Path, overwrite: bool) -> None:
    """`out` may be absent or an empty folder; with `overwrite`, also an earlier export (a
    folder holding `spec.json` and only the files an export writes), never anything else:
    `--overwrite` must not delete a user's file or folder given by mistake."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder to write the export into")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ValueError(f"--out {out} exists and is not empty; pass --overwrite or a new folder")
    others = [name for name in entries if name not in _EXPORT_FILES]
    if others or "spec.json" not in entries:
        what = f"it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
        raise ValueError(
            f"--out {out} is not an s5jax export ({what if others else 'no spec.json'}); "
            "--overwrite replaces only an earlier export: give a new folder"
        )


def _spec(run, expect, names, forward, fixed, step, state_spec, no_step, which) -> dict:
    import json

    outputs = _output_names(run.head)
    timed = any(s.t is not None for s in run.dataset.splits.values())
    spec: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "jax_version": jax.__version__,
        "platforms": list(forward.platforms),
        "run_dir": str(Path(run.workdir).resolve()),
        "checkpoint": which,
        "config": json.loads((Path(run.workdir) / "config.json").read_text()),
        "head": run.head,
        "pooling": expect.pooling,
        "timestep_mode": run.config.model.timestep_mode,
        "metric": run.metric,
        "vocab_size": expect.vocab_size,
        "d_input": None if expect.tokens else expect.d_input,
        "n_classes": expect.n_classes or None,
        # the training data's class names (output i is classes[i]), when it named them
        "classes": run.dataset.meta.get("classes"),
        "normalization": run.dataset.meta.get("normalization"),
        # data.normalize_targets: the head's fixed affine; outputs are in the targets' units
        "target_normalization": run.dataset.meta.get("target_normalization"),
        "forward": {
            "file": "forward.jax",
            "inputs": _describe(names, forward.in_avals),
            "outputs": _describe(outputs, forward.out_avals),
            "length": "symbolic" if fixed is None else fixed,
            "scan_method": "sequential",
            "call": "jax.export.deserialize(bytearray(pathlib.Path('forward.jax').read_bytes()))"
            f".call({', '.join(names)}) -> {outputs[0] if len(outputs) == 1 else tuple(outputs)}"
            "; inference mode (no dropout, BatchNorm running statistics); x of b examples "
            "of l steps, raw (the run's data.normalize, in 'normalization', is applied "
            "inside); dt: per-step Δ multipliers [1, t1 - t0, ...]"
            + ("" if timed else " (the run's data had no times: all ones)")
            + "; lengths: valid steps",
        },
    }
    if step is None:
        spec["step"] = None
        spec["no_step"] = no_step
        return spec
    n = len(state_spec)
    spec["state"] = state_spec
    spec["step"] = {
        "file": "step.jax",
        "inputs": [
            {"name": "state", "leaves": n, "shape": "(b, *leaf shape) each, see 'state'"},
            *_describe(["x_t", "dt_t", "reset"], step.in_avals[n:]),
        ],
        "outputs": [
            {"name": "state", "leaves": n},
            *_describe(outputs, step.out_avals[n:]),
        ],
        "call": "state, out = step.call(state, x_t, dt_t, reset): state is a tuple of the "
        "leaves of init_state.npz (leaf_000, leaf_001, ...) each broadcast to (b, ...); "
        "x_t one step of b streams; dt_t the step's Δ multiplier (1 at a stream's first "
        "step; used in timestep_mode 'irregular'/'append'"
        + ("" if timed else "; the run's data had no times: 1 at every step")
        + "); reset True starts a new episode "
        "first. Pooled heads return the output on the inputs since the last reset, "
        "per-step heads this step's output",
    }
    return spec
