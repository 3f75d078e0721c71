"""The constant baseline a run reports beside its test figure: the test metric of a prediction
that ignores the inputs (the training split's most frequent class, or its mean per target).

Two views that must agree: `constant_baseline` and the training step's own metric
(`per_example_loss`, with each example's length) applied to that constant prediction, for
labels and targets per example and per step, with padding; and the figure a finished run
prints and writes with the same computed by numpy from the data."""

import io
import json
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.data import PreparedDataset, Split
from s5jax.train import train_and_evaluate
from s5jax.train._engine import constant_baseline, results_text
from s5jax.train._runs import user_data_config
from s5jax.train._steps import per_example_loss


def _dataset(y_train, y_test, lengths=None, classes=None, task="classification"):
    def split(y, n):
        x = np.zeros((len(y), 6, 1), np.float32)
        return Split(x=x, y=y, lengths=n)

    n_train, n_test = (None, None) if lengths is None else lengths
    meta = {} if classes is None else {"classes": classes}
    splits = {"train": split(y_train, n_train), "test": split(y_test, n_test)}
    n_classes = 3 if task == "classification" else 0
    return PreparedDataset(
        name="t", task=task, splits=splits, n_classes=n_classes, vocab_size=None, meta=meta
    )


def _metric(kind, outputs, y, lengths):
    """The training step's metric, averaged over the examples."""
    if lengths is None:
        _, m = jax.vmap(lambda o, t: per_example_loss(kind, o, t))(outputs, y)
    else:
        _, m = jax.vmap(lambda o, t, n: per_example_loss(kind, o, t, n))(outputs, y, lengths)
    return float(jnp.mean(m))


@pytest.mark.parametrize("per_step", [False, True])
def test_majority_class_equals_the_metric_of_always_that_class(per_step):
    rng = np.random.default_rng(0)
    shape = (40, 6) if per_step else (40,)
    y_train = rng.choice(3, shape, p=[0.2, 0.5, 0.3])
    y_test = rng.choice(3, (30, *shape[1:]), p=[0.4, 0.3, 0.3])
    lengths = (rng.integers(1, 7, 40), rng.integers(1, 7, 30)) if per_step else None
    if per_step:  # the padding's labels are 0, the rarest class: never counted
        y_train = np.where(np.arange(6)[None] < lengths[0][:, None], y_train, 0)
    got = constant_baseline(_dataset(y_train, y_test, lengths), "accuracy", per_step)
    top = 1  # the training split's most frequent, on its valid steps
    assert got["what"] == "always class 1, the training split's most frequent"
    log_probs = jnp.log(jnp.asarray([0.1, 0.8, 0.1]))  # argmax: class 1
    outputs = jnp.broadcast_to(log_probs, (*y_test.shape, 3))
    n_test = None if lengths is None else jnp.asarray(lengths[1])
    assert got["value"] == pytest.approx(_metric("classification", outputs, y_test, n_test))
    hits = (y_test == top).astype(float)
    if per_step:  # numpy: each example's valid steps, then the examples
        n = lengths[1]
        want = np.mean([hits[i, : n[i]].mean() for i in range(len(n))])
    else:
        want = hits.mean()
    assert got["value"] == pytest.approx(want)
    named = constant_baseline(_dataset(y_train, y_test, lengths, ["a", "b", "c"]), "accuracy",
                              per_step)  # fmt: skip
    assert named["what"] == "always class 'b', the training split's most frequent"


@pytest.mark.parametrize("shape, per_step", [((), False), ((2,), False), ((6,), True),
                                             ((6, 2), True)])  # fmt: skip
def test_training_mean_equals_the_metric_of_predicting_it(shape, per_step):
    rng = np.random.default_rng(1)
    y_train = (3.0 + 2.0 * rng.standard_normal((40, *shape))).astype(np.float32)
    y_test = (3.5 + 2.0 * rng.standard_normal((30, *shape))).astype(np.float32)
    lengths = (rng.integers(1, 7, 40), rng.integers(1, 7, 30)) if per_step else None
    if per_step:  # padding targets of 100: not part of the mean
        y_train = np.where(
            (np.arange(6)[None] < lengths[0][:, None]).reshape(40, 6, *[1] * (len(shape) - 1)),
            y_train, 100.0,
        )  # fmt: skip
    data = _dataset(y_train, y_test, lengths, task="regression")
    got = constant_baseline(data, "mse", per_step)
    assert got["what"] == "the training split's mean of each target"
    # the mean per target over the training split's valid entries
    if per_step:
        valid = np.arange(6)[None] < lengths[0][:, None]
        mean = y_train.reshape(40, 6, -1)[valid].mean(axis=0)
    else:
        mean = y_train.reshape(40, -1).mean(axis=0)
    y = jnp.asarray(y_test.reshape(30, 6, -1) if per_step else y_test.reshape(30, -1))
    outputs = jnp.broadcast_to(jnp.asarray(mean, jnp.float32), y.shape)
    n_test = None if lengths is None else jnp.asarray(lengths[1])
    assert got["value"] == pytest.approx(_metric("regression", outputs, y, n_test), rel=1e-5)
    assert got["value"] > 0.25 * 4  # at least the shift's square: 3.5 vs about 3


def test_no_train_or_test_split_gives_none():
    y = np.zeros(4, int)
    data = _dataset(y, y)
    assert constant_baseline(replace(data, splits={"train": data.splits["train"]}), "accuracy",
                             False) is None  # fmt: skip


def test_a_finished_run_prints_and_writes_the_constant(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {}
    for split, n in (("train", 40), ("val", 8), ("test", 20)):
        arrays[f"x_{split}"] = rng.standard_normal((n, 8, 2)).astype(np.float32)
        arrays[f"y_{split}"] = rng.choice(2, n, p=[0.25, 0.75])
    np.savez(tmp_path / "d.npz", **arrays)
    config, dataset = user_data_config(
        tmp_path / "d.npz",
        ["train.epochs=1", "model.n_layers=1", "model.d_model=8", "model.ssm_size=8",
         "model.blocks=2", "model.members=1"],
    )  # fmt: skip
    out = io.StringIO()
    summary = train_and_evaluate(config, tmp_path / "run", dataset=dataset, progress=False,
                                 stream=out)  # fmt: skip
    top = int(np.argmax(np.bincount(arrays["y_train"])))
    want = float(np.mean(arrays["y_test"] == top))
    assert summary["baseline"]["value"] == pytest.approx(want)
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["baseline"] == summary["baseline"]
    text = results_text(summary)
    row = next(line for line in text.splitlines() if line.startswith("test accuracy of a const"))
    assert float(row.split("|")[1]) == pytest.approx(want, abs=5e-5)
    assert f"constant: always class {top}, the training split's most frequent" in text
    # the results.json of a run from before the baseline: the table without it
    del written["baseline"]
    assert "constant" not in results_text(written)
