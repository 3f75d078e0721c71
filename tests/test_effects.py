"""End-to-end effects of the options that change results without changing shapes.

Each test states the two views that must agree: the engine's (or `s5jax eval`'s) figure and a
direct model call with the option applied by hand, and a third view the option must differ
from. Irregular Δ (pendulum, §6.3), the zero-shot Δ rescale (speech at 8 kHz, §6.2), `dt_global`
(reference semantics §5), reduce-on-plateau and early stopping (§5), and `s5jax eval`'s options.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s5jax.cli import main
from s5jax.config import ModelConfig, apply_overrides, load_experiment
from s5jax.core import step_multipliers
from s5jax.data import Split
from s5jax.nn import (
    S5SSM,
    accuracy,
    build_model,
    gaussian_nll,
    mse,
    nll_loss,
    parameter_roles,
    pool,
)
from s5jax.train import evaluate_run, get_lr_scale, load_run, read_metrics
from s5jax.train._datasets import synthetic_dataset
from s5jax.train._engine import _host_batch, _Run, train_and_evaluate
from s5jax.train._steps import make_steps, per_example_loss


def _cfg(*overrides):
    return apply_overrides(load_experiment("synthetic"), list(overrides))


def _with_times(dataset, seed=1):
    """`dataset` with irregular, strictly increasing observation times on every split."""
    rng = np.random.default_rng(seed)
    splits = {}
    for name, s in dataset.splits.items():
        gaps = rng.uniform(0.2, 3.0, s.x.shape[:2]).astype(np.float32)
        splits[name] = Split(s.x, s.y, t=np.cumsum(gaps, axis=1).astype(np.float32))
    return replace(dataset, splits=splits)


def _direct(run, split, *, dt=None, step_rescale=1.0, inference=True):
    """Mean NLL and accuracy of `split` from direct model calls (no engine, no eval step)."""
    model = eqx.combine(run.params, run.static)
    leaves, treedef = jax.tree_util.tree_flatten(run.model_state)
    state = jax.tree_util.tree_unflatten(treedef, leaves)  # a clone: the run keeps its own

    def one(x, d):
        out, _ = model(x, state, inference=inference, dt=d, step_rescale=step_rescale)
        return out

    logp = jax.vmap(one, axis_name="batch", in_axes=(0, None if dt is None else 0))(
        jnp.asarray(split.x), None if dt is None else jnp.asarray(dt)
    )
    logp = np.asarray(logp)
    y = np.asarray(split.y)
    nll = -logp[np.arange(len(y)), y]
    return float(nll.mean()), float((logp.argmax(-1) == y).mean())


def _built(tmp_path, cfg, dataset):
    run = _Run(cfg, tmp_path, dataset, io.StringIO())
    run.build()
    return run


# --- irregular Δ through the engine (pendulum, §6.3) -------------------------------------------


def test_batch_conversion_turns_times_into_step_multipliers():
    t = np.array([[0.0, 0.5, 2.0, 2.25], [3.0, 4.0, 4.1, 7.0]], np.float32)
    batch = {"x": np.zeros((2, 4, 1)), "y": np.zeros(2), "mask": np.ones(2, bool), "t": t}
    dt = _host_batch(batch, "classification")["dt"]
    np.testing.assert_allclose(dt, [[1.0, 0.5, 1.5, 0.25], [1.0, 1.0, 0.1, 2.9]], rtol=1e-6)
    for row, times in zip(dt, t, strict=True):
        np.testing.assert_allclose(row, np.asarray(step_multipliers(jnp.asarray(times))))


def test_unit_spaced_times_give_the_regularly_sampled_layer(getkey):
    # Times 0, 1, 2, ... are regular sampling: Δ multipliers of 1 (the first included) must
    # reproduce the layer without times; times 0, 2, 4, ... equal step_rescale = 2 after the
    # first step, whose multiplier is 1 whatever the times.
    layer = S5SSM(3, 8, J=2, dt_min=0.01, dt_max=0.5, key=getkey())
    u = jax.random.normal(getkey(), (12, 3))
    t = jnp.arange(12.0)
    np.testing.assert_allclose(
        np.asarray(layer(u, dt=step_multipliers(t))), np.asarray(layer(u)), rtol=1e-5, atol=1e-6
    )
    doubled = np.asarray(layer(u, dt=step_multipliers(2 * t)))
    assert not np.allclose(doubled, np.asarray(layer(u, step_rescale=2.0)), rtol=1e-4)
    np.testing.assert_allclose(doubled[0], np.asarray(layer(u))[0], rtol=1e-5, atol=1e-6)


def test_irregular_times_reach_the_model_in_eval_and_train_steps(tmp_path):
    data = _with_times(synthetic_dataset(seq_len=16, n_train=16, n_eval=16))
    run = _built(tmp_path, _cfg("data.n_train=16", "data.n_eval=16", "data.seq_len=16"), data)
    val = data.splits["val"]
    dt = np.stack([np.asarray(step_multipliers(jnp.asarray(t))) for t in val.t])
    engine = run.evaluate("val")
    with_dt, _ = _direct(run, val, dt=dt)
    without_dt, _ = _direct(run, val)
    assert engine["loss"] == pytest.approx(with_dt, rel=1e-5)
    assert abs(with_dt - without_dt) > 1e-3 * abs(with_dt)

    # The training step's loss (before its update) is the train-mode loss with the same Δ.
    train = data.splits["train"]
    batch = {"x": train.x[:8], "y": train.y[:8], "mask": np.ones(8, bool), "t": train.t[:8]}
    dt8 = np.stack([np.asarray(step_multipliers(jnp.asarray(t))) for t in batch["t"]])
    sub = Split(batch["x"], batch["y"])
    expected, _ = _direct(run, sub, dt=dt8, inference=False)
    ignored, _ = _direct(run, sub, inference=False)
    *_, stats = run.steps.train(
        run.params,
        run.model_state,
        run.opt_state,
        run.parallel.shard(_host_batch(batch, "classification")),
        jax.random.PRNGKey(0),
    )
    assert float(stats["loss"]) == pytest.approx(expected, rel=1e-5)
    assert abs(expected - ignored) > 1e-3 * abs(expected)


def test_mean_pooling_averages_every_step():
    # Mean pooling over L steps == masked-mean pooling with length L == the plain average.
    x = jnp.asarray(np.random.default_rng(3).normal(size=(7, 4)), jnp.float32)
    np.testing.assert_allclose(np.asarray(pool(x, "mean")), np.asarray(x).mean(0), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(pool(x, "mean")), np.asarray(pool(x, "masked_mean", jnp.asarray(7))), rtol=1e-6
    )


# --- the training loss is the tested loss of the heads ------------------------------------------


def test_step_losses_equal_the_heads_losses():
    """The steps' per-example loss (what training minimises) == `s5jax.nn`'s loss functions.

    The pendulum's Gaussian NLL (§6.3) is written twice, once per example in the steps and
    once over a batch in `s5jax.nn`; both must give the same figure, variance floor included.
    """
    rng = np.random.default_rng(0)
    mean = jnp.asarray(rng.normal(size=(5, 50, 2)), jnp.float32)
    var = jnp.asarray(rng.uniform(0.05, 2.0, (5, 50, 2)), jnp.float32).at[0, 3, 1].set(1e-9)
    y = jnp.asarray(rng.normal(size=(5, 50, 2)), jnp.float32)
    losses, metrics = jax.vmap(lambda m, v, t: per_example_loss("gaussian", (m, v), t))(
        mean, var, y
    )
    assert float(losses.mean()) == pytest.approx(float(gaussian_nll(mean, var, y)), rel=1e-5)
    assert float(metrics.mean()) == pytest.approx(float(mse(mean, y)), rel=1e-5)

    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 4)), jnp.float32))
    labels = jnp.asarray([0, 1, 2, 3, 1, 0])
    losses, hits = jax.vmap(lambda o, t: per_example_loss("classification", o, t))(logp, labels)
    assert float(losses.mean()) == pytest.approx(float(nll_loss(logp, labels)), rel=1e-6)
    assert float(hits.mean()) == pytest.approx(float(accuracy(logp, labels)))


def test_per_step_losses_average_only_the_valid_steps():
    """A padded example's per-step loss and metric (each head) = those of the example cut to
    its length; without a length every step counts."""
    rng = np.random.default_rng(4)
    L, n = 12, 7
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(L, 4)), jnp.float32))
    labels = jnp.asarray(rng.integers(0, 4, L))
    out = jnp.asarray(rng.normal(size=(L, 3)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(L, 3)), jnp.float32)
    var = jnp.asarray(rng.uniform(0.1, 2.0, (L, 3)), jnp.float32)
    for kind, o, t in (("classification", logp, labels), ("regression", out, y),
                       ("gaussian", (out, var), y)):  # fmt: skip
        cut = jax.tree.map(lambda a: a[:n], (o, t))
        got = per_example_loss(kind, o, t, jnp.asarray(n))
        want = per_example_loss(kind, *cut)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=kind)
        np.testing.assert_allclose(
            per_example_loss(kind, o, t, jnp.asarray(L)), per_example_loss(kind, o, t), rtol=1e-6
        )
        assert not np.allclose(per_example_loss(kind, o, t)[0], want[0], rtol=1e-3), kind


@pytest.mark.parametrize(
    "head, members", [("regression", 1), ("regression", 2), ("classification", 1)]
)
def test_padding_targets_do_not_move_a_training_step(head, members):
    """Per-step targets of padded sequences (regression, or a class label per step): one SGD
    step (single model and ensemble) gives the same parameters whether the padding's targets
    are 0 or 100 (labels 0 or 2); a batch without `lengths` (every step a target) is moved
    by them."""
    regression = head == "regression"
    cfg = ModelConfig(n_layers=2, d_model=8, ssm_size=8, blocks=2, pooling="none",
                      head=head, norm="layer", members=members)  # fmt: skip
    n_out = 1 if regression else 3
    model, state = build_model(cfg, d_input=2, n_outputs=n_out, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt = optax.sgd(0.1)
    steps = make_steps(static, opt, head, members=members)
    rng = np.random.default_rng(5)
    lengths = np.array([12, 3, 8, 5])
    valid = np.arange(12)[None, :] < lengths[:, None]
    x = jnp.asarray(rng.normal(size=(4, 12, 2)), jnp.float32)
    if regression:
        valid = valid[..., None]
        y, pads = rng.normal(size=(4, 12, 1)).astype(np.float32), (0.0, 100.0)
    else:
        y, pads = rng.integers(0, n_out, (4, 12)).astype(np.int32), (0, 2)

    def stepped(pad, with_lengths=True):
        batch = {"x": x, "y": jnp.asarray(np.where(valid, y, pad)), "mask": jnp.ones(4, bool)}
        if with_lengths:
            batch["lengths"] = jnp.asarray(lengths, jnp.int32)
        p, _, _, stats = steps.train(jax.tree.map(jnp.copy, params), state,
                                     opt.init(params), batch, jax.random.PRNGKey(1))  # fmt: skip
        return jax.tree_util.tree_leaves(p), float(stats["loss"])

    (a, loss_a), (b, loss_b) = stepped(pads[0]), stepped(pads[1])
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    _, loss_all = stepped(pads[1], with_lengths=False)
    if regression:
        assert loss_all > 100 * loss_a
    else:
        assert loss_all != pytest.approx(stepped(pads[0], with_lengths=False)[1], rel=1e-3)


# --- a trained synthetic run shared by the evaluation tests --------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three epochs whose val metric is forced to peak at epoch 1: best ≠ latest checkpoint.

    **Returns:** `(run_dir, real)`: `real[e]` is the true val result of epoch `e`'s params.
    """
    run_dir = tmp_path_factory.mktemp("effects") / "run"
    real, forced = {}, iter([0.9, 0.1, 0.1])
    original = _Run.evaluate

    def evaluate(self, split_name, step_rescale=1.0):
        result = original(self, split_name, step_rescale)
        if split_name != "val":
            return result
        real[len(real) + 1] = result
        return {**result, "accuracy": next(forced)}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Run, "evaluate", evaluate)
        cfg = _cfg("train.epochs=3")
        train_and_evaluate(cfg, run_dir, progress=False, stream=io.StringIO())
    return run_dir, real


def _eval_cli(capsys, run_dir, *args):
    capsys.readouterr()
    assert main(["eval", str(run_dir), *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_checkpoint_option_picks_best_or_latest(trained, capsys):
    run_dir, real = trained
    best = _eval_cli(capsys, run_dir, "--split", "val", "--checkpoint", "best")
    latest = _eval_cli(capsys, run_dir, "--split", "val", "--checkpoint", "latest")
    assert best["loss"] == pytest.approx(real[1]["loss"], rel=1e-5)
    assert latest["loss"] == pytest.approx(real[3]["loss"], rel=1e-5)
    assert best["loss"] != pytest.approx(latest["loss"], rel=1e-4)
    assert _eval_cli(capsys, run_dir, "--split", "val")["loss"] == best["loss"]  # default best


def test_eval_split_option_evaluates_that_split(trained, capsys):
    run_dir, _ = trained
    run = load_run(run_dir, "best")
    val = _eval_cli(capsys, run_dir, "--split", "val")
    test = _eval_cli(capsys, run_dir, "--split", "test")
    default = _eval_cli(capsys, run_dir)
    assert val["loss"] == pytest.approx(_direct(run, run.dataset.splits["val"])[0], rel=1e-5)
    assert test["loss"] == pytest.approx(_direct(run, run.dataset.splits["test"])[0], rel=1e-5)
    assert val["loss"] != pytest.approx(test["loss"], rel=1e-4)
    assert default["split"] == "test" and default["loss"] == test["loss"]


def test_step_rescale_reaches_the_model_in_evaluate_run_and_eval(trained, capsys):
    """Zero-shot resampling (§6.2): every Δ doubled equals a direct call at step_rescale=2."""
    run_dir, _ = trained
    run = load_run(run_dir, "best")
    test = run.dataset.splits["test"]
    direct2, _ = _direct(run, test, step_rescale=2.0)
    direct1, _ = _direct(run, test, step_rescale=1.0)
    api = evaluate_run(run_dir, split="test", step_rescale=2.0)
    cli = _eval_cli(capsys, run_dir, "--split", "test", "--step-rescale", "2")
    assert api["loss"] == pytest.approx(direct2, rel=1e-5)
    assert cli["loss"] == pytest.approx(direct2, rel=1e-5) and cli["step_rescale"] == 2.0
    assert abs(direct2 - direct1) > 1e-3 * abs(direct1)
    assert evaluate_run(run_dir, split="test")["loss"] == pytest.approx(direct1, rel=1e-5)


def test_zero_shot_8khz_splits_are_evaluated_at_step_rescale_2(tmp_path):
    base = synthetic_dataset(seq_len=32, n_train=64, n_eval=32)
    half = {f"{s}_8khz": Split(base.splits[s].x[:, ::2], base.splits[s].y) for s in ("val", "test")}
    data = replace(base, splits={**base.splits, **half})
    cfg = _cfg("train.epochs=1", "data.zero_shot_8khz=true")
    train_and_evaluate(cfg, tmp_path / "run", dataset=data, progress=False, stream=io.StringIO())
    (record,) = read_metrics(tmp_path / "run", kind="epoch")
    run = load_run(tmp_path / "run", "best", dataset=data)
    for split in ("val_8khz", "test_8khz"):
        at2, _ = _direct(run, data.splits[split], step_rescale=2.0)
        at1, _ = _direct(run, data.splits[split], step_rescale=1.0)
        assert record[f"{split}_loss"] == pytest.approx(at2, rel=1e-5)
        assert abs(at2 - at1) > 1e-4 * abs(at1)  # ten times the tolerance above


# --- dt_global: log Δ trained with the global rate and weight decay (reference §5) --------------


def _log_step_update(dt_global, tmp_path):
    """The first update of every log Δ under zero gradients, and the log Δ values."""
    cfg = _cfg(
        f"optim.dt_global={str(dt_global).lower()}",
        "optim.schedule=constant",
        "optim.weight_decay=0.1",
    )
    run = _built(tmp_path, cfg, synthetic_dataset(seq_len=32, n_train=64, n_eval=32))
    zeros = jax.tree.map(jnp.zeros_like, run.params)
    updates, _ = run.optimizer.update(zeros, run.opt_state, run.params)
    roles = jax.tree.leaves(parameter_roles(eqx.combine(run.params, run.static)))
    pairs = zip(roles, jax.tree.leaves(updates), jax.tree.leaves(run.params), strict=True)
    chosen = [(np.asarray(u), np.asarray(p)) for r, u, p in pairs if r == "log_step"]
    assert chosen, "the model has log Δ parameters"
    return chosen, cfg.optim


def test_dt_global_puts_log_step_under_the_global_rate_with_weight_decay(tmp_path):
    # With zero gradients Adam does not move a leaf; AdamW moves it by −lr·wd·p.
    local, _ = _log_step_update(False, tmp_path / "a")
    global_, optim = _log_step_update(True, tmp_path / "b")
    for update, _ in local:
        assert not np.any(update)
    for update, param in global_:
        np.testing.assert_allclose(update, -optim.lr * optim.weight_decay * param, rtol=1e-5)
        assert np.any(update)


# --- reduce-on-plateau and early stopping in the epoch loop (§5) --------------------------------


def _forced_run(tmp_path, monkeypatch, val_metrics, *overrides):
    """Train with the val accuracy of epoch e forced to `val_metrics[e - 1]`.

    **Returns:** `(summary, scales)`: `scales[e - 1]` is the plateau scale the optimiser held
    while training epoch e.
    """
    original, scales, forced = _Run.evaluate, [], iter(val_metrics)

    def evaluate(self, split_name, step_rescale=1.0):
        result = original(self, split_name, step_rescale)
        if split_name != "val":
            return result
        scales.append(get_lr_scale(self.opt_state))
        return {**result, "accuracy": next(forced)}

    monkeypatch.setattr(_Run, "evaluate", evaluate)
    summary = train_and_evaluate(
        _cfg(*overrides), tmp_path / "run", progress=False, stream=io.StringIO()
    )
    return summary, scales


def test_reduce_on_plateau_lowers_the_rate_after_patience_epochs(tmp_path, monkeypatch):
    # Best at epoch 2; epochs 3 and 4 do not improve: after epoch 4 (more than 1 epoch without
    # improvement) the scale halves, and again after epoch 6.
    _, scales = _forced_run(
        tmp_path,
        monkeypatch,
        [0.3, 0.5, 0.5, 0.4, 0.5, 0.5, 0.5],
        "train.epochs=7",
        "optim.reduce_on_plateau=true",
        "optim.plateau_patience=1",
        "optim.plateau_factor=0.5",
        "optim.lr_min=0",
    )
    assert scales == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.25]


def test_rate_is_never_reduced_without_reduce_on_plateau(tmp_path, monkeypatch):
    _, scales = _forced_run(
        tmp_path, monkeypatch, [0.5] * 4, "train.epochs=4", "optim.plateau_patience=1"
    )
    assert scales == [1.0] * 4


def test_early_stopping_stops_after_patience_epochs_without_improvement(tmp_path, monkeypatch):
    # Accuracy improves until epoch 3; with patience 2 the run stops after epoch 6.
    summary, _ = _forced_run(
        tmp_path,
        monkeypatch,
        [0.1, 0.2, 0.3, 0.3, 0.25, 0.3, 0.9, 0.9],
        "train.epochs=8",
        "train.early_stop_patience=2",
    )
    assert summary["epochs_run"] == 6 and summary["best_epoch"] == 3
    assert [r["epoch"] for r in read_metrics(tmp_path / "run", kind="epoch")] == list(range(1, 7))
