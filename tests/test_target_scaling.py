"""`data.normalize_targets = "standard"`: the head predicts standardised regression targets and
a fixed affine (the train split's mean and std) maps them back, so that targets far from unit
scale train as well as unit-scale ones, with every figure in the targets' units.

The views that must agree: the head with the affine = mean + std · the same head without it
(regression and Gaussian); training on `a + b·y` = training on `y` with every loss × b² and
every prediction mapped by the affine (Adam is invariant to the gradient's scale), while
without the affine the two runs differ; predictions of a run whose training file is gone
(its `data_spec.json`) = those made with the file.
"""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import ModelConfig
from s5jax.data import DatasetError
from s5jax.data._normalize import target_stats
from s5jax.nn import build_model
from s5jax.train import (
    export_run,
    predict_run,
    read_metrics,
    train_and_evaluate,
    user_data_config,
)
from s5jax.train._defaults import choose_defaults, inspect_data
from s5jax.train._steps import per_example_loss

from ._fixtures import read_npz

TINY = ["model.n_layers=1", "model.d_model=8", "model.ssm_size=8", "model.blocks=2",
        "model.members=1", "data.batch_size=16", "train.epochs=3"]  # fmt: skip


def _regression(rng, n=64, L=16, per_step=False):
    x = rng.standard_normal((n, L, 2)).astype(np.float32)
    y = np.cumsum(x[..., 0], axis=1) / 4 if per_step else x[..., 0].mean(axis=1) * 3
    return x, y.astype(np.float32)


@pytest.mark.parametrize("head", ["regression", "gaussian"])
def test_the_head_maps_standardised_outputs_to_the_targets_units(head):
    mean, std = (3.0, -200.0), (0.5, 40.0)
    cfg = ModelConfig(n_layers=1, d_model=8, ssm_size=8, blocks=2, head=head,
                      pooling="none" if head == "gaussian" else "mean")  # fmt: skip
    key = jax.random.PRNGKey(0)
    plain, state = build_model(cfg, d_input=2, n_outputs=2, key=key)
    scaled, _ = build_model(cfg, d_input=2, n_outputs=2, key=key, targets=(mean, std))
    x = jax.random.normal(jax.random.PRNGKey(1), (12, 2))
    got, _ = scaled(x, state, inference=True)
    want, _ = plain(x, state, inference=True)
    if head == "gaussian":  # (mean, variance): μ mapped, σ² × std²
        np.testing.assert_allclose(got[0], np.asarray(mean)[None] + np.asarray(std)[None] * want[0],
                                   rtol=1e-6, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(got[1], np.square(std)[None] * want[1], rtol=1e-6)
    else:
        np.testing.assert_allclose(got, np.asarray(mean) + np.asarray(std) * want, rtol=1e-6)
    # the affine is static: the parameters are those of the plain model
    leaves = jax.tree_util.tree_leaves
    assert len(leaves(scaled)) == len(leaves(plain))
    for a, b in zip(leaves(scaled), leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="a mean and a std per output"):
        build_model(cfg, d_input=2, n_outputs=2, key=key, targets=((0.0,), (1.0,)))
    with pytest.raises(ValueError, match="positive stds"):
        build_model(cfg, d_input=2, n_outputs=2, key=key, targets=((0.0, 0.0), (1.0, 0.0)))


def test_target_stats_read_the_valid_steps():
    y = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    y[1, 2:] = 1e6  # padding
    mean, std = target_stats(y, np.array([4, 2]))
    valid = np.concatenate([y[0], y[1, :2]])
    np.testing.assert_allclose(mean, valid.mean(axis=0))
    np.testing.assert_allclose(std, valid.std(axis=0))
    mean, std = target_stats(np.full(5, 7.0), None)  # a constant target: divide by 1
    assert mean.tolist() == [7.0] and std.tolist() == [1.0]


def test_the_training_loss_weighs_each_standardised_target_the_same():
    """With the targets' std the loss is the mean of (output − y)² / std² (a target in
    millimetres weighs what one in kilometres does); the metric stays in the targets' units;
    per step, over the valid steps."""
    rng = np.random.default_rng(3)
    out, y = rng.normal(size=(2, 6, 2)).astype(np.float32)
    std = np.array([0.01, 100.0], np.float32)
    loss, metric = per_example_loss("regression", out, y, jnp.asarray(4), std)
    sq = (out[:4].astype(np.float64) - y[:4]) ** 2
    np.testing.assert_allclose(loss, np.mean(sq / std**2), rtol=1e-5)
    np.testing.assert_allclose(metric, np.mean(sq), rtol=1e-5)
    loss, metric = per_example_loss("regression", out[0], y[0], None, std)  # per sequence
    np.testing.assert_allclose(loss, np.mean((out[0] - y[0]) ** 2 / std**2), rtol=1e-5)
    np.testing.assert_allclose(metric, np.mean((out[0] - y[0]) ** 2), rtol=1e-5)


def _train(tmp_path, name, x, y, *overrides):
    path = tmp_path / f"{name}.npz"
    np.savez(path, x_train=x[:48], y_train=y[:48], x_val=x[48:56], y_val=y[48:56],
             x_test=x[56:], y_test=y[56:])  # fmt: skip
    config, dataset = user_data_config(path, [*TINY, *overrides])
    run_dir = tmp_path / name
    train_and_evaluate(config, run_dir, dataset=dataset, progress=False, stream=io.StringIO())
    epochs = [r for r in read_metrics(run_dir) if r.get("kind") == "epoch"]
    losses = [(r["train_loss"], r["val_mse"]) for r in epochs]
    out = tmp_path / f"{name}.pred.npz"
    predict_run(run_dir, out, progress=False)
    return run_dir, path, np.array(losses), read_npz(out)["pred"]


@pytest.mark.parametrize("per_step", [False, True], ids=["per sequence", "per step"])
def test_an_affine_change_of_the_targets_changes_only_the_units(tmp_path, per_step):
    """Targets a + b·y train exactly as y does: the same training losses (of standardised
    targets), val mse × b², predictions a + b·pred; the data-chosen default is the affine,
    and without it the runs differ."""
    a, b = 300.0, 10.0
    x, y = _regression(np.random.default_rng(0), per_step=per_step)
    _, _, loss, pred = _train(tmp_path, "unit", x, y)
    run_dir, path, loss_ab, pred_ab = _train(tmp_path, "moved", x, a + b * y)
    assert json.loads((run_dir / "config.json").read_text())["data"]["normalize_targets"] == (
        "standard"
    )
    np.testing.assert_allclose(loss_ab[:, 0], loss[:, 0], rtol=2e-3)
    np.testing.assert_allclose(loss_ab[:, 1], b**2 * loss[:, 1], rtol=2e-3)
    np.testing.assert_allclose(pred_ab, a + b * pred, rtol=1e-4, atol=1e-3 * b)
    _, _, loss_none, _ = _train(tmp_path, "none", x, a + b * y, "data.normalize_targets=none")
    assert not np.allclose(loss_none[:, 1], b**2 * loss[:, 1], rtol=0.1)
    # the exported forward returns the targets' units too, and its spec names the affine
    folder = export_run(run_dir, tmp_path / "exported")
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["target_normalization"]["mean"] == [
        pytest.approx(float(np.mean((a + b * y[:48]).astype(np.float64))), rel=1e-6)
    ]
    forward = jax.export.deserialize(bytearray((folder / "forward.jax").read_bytes()))
    n, L = len(x[56:]), x.shape[1]
    given = {"x": x[56:], "lengths": np.full(n, L, np.int32), "dt": np.ones((n, L), np.float32)}
    out = forward.call(*(given[i["name"]] for i in spec["forward"]["inputs"]))
    np.testing.assert_allclose(np.asarray(out).reshape(pred_ab.shape), pred_ab, rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    # a run whose training file is gone predicts from its data_spec.json, in the same units
    moved = tmp_path / "new.npz"
    np.savez(moved, x=x[56:])
    path.unlink()
    assert main(["predict", str(run_dir), "--data", str(moved), "--out",
                 str(tmp_path / "p.npz"), "--no-progress"]) == 0  # fmt: skip
    np.testing.assert_allclose(read_npz(tmp_path / "p.npz")["pred"], pred_ab, rtol=1e-6)


def test_defaults_choose_the_affine_for_regression_only(tmp_path):
    rng = np.random.default_rng(1)
    x, y = _regression(rng)
    labels = (y > 0).astype(np.int64)
    np.savez(tmp_path / "r.npz", x_train=x, y_train=300 + 10 * y, x_test=x[:4], y_test=y[:4])
    np.savez(tmp_path / "c.npz", x_train=x, y_train=labels, x_test=x[:4], y_test=labels[:4])
    cfg, regression = user_data_config(tmp_path / "r.npz")
    facts = inspect_data(regression)
    assert facts.target_mean == pytest.approx(float(np.mean(300 + 10 * y.astype(np.float64))))
    chosen = {c.key: c for c in choose_defaults(facts, {})}
    assert chosen["data.normalize_targets"].value == "standard"
    assert chosen["data.normalize_targets"].reason.startswith(
        f"regression targets (mean {facts.target_mean:.3g}, std {facts.target_std:.3g} over "
        "the train split)"
    )
    assert "data.normalize_targets" not in {c.key for c in choose_defaults(facts, {
        "data.normalize_targets": "none"})}  # fmt: skip
    cfg, classification = user_data_config(tmp_path / "c.npz")
    assert cfg.data.normalize_targets == "none"
    assert "target_normalization" not in classification.meta
    with pytest.raises(DatasetError, match=r"standardises regression targets; dataset 'c' is "
                       r"classification: set data.normalize_targets = none"):  # fmt: skip
        user_data_config(tmp_path / "c.npz", ["data.normalize_targets=standard"])


def test_a_classification_run_refuses_the_option_in_one_line(tmp_path, capsys):
    rng = np.random.default_rng(2)
    x, y = _regression(rng)
    path = tmp_path / "c.npz"
    labels = (y > 0).astype(np.int64)
    np.savez(path, x_train=x, y_train=labels, x_test=x[:4], y_test=labels[:4])
    code = main(["train", "--data", str(path), "--workdir", str(tmp_path / "run"),
                 "--set", "data.normalize_targets=standard"])  # fmt: skip
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        "s5jax train: error: data.normalize_targets = 'standard' standardises regression "
        "targets; dataset 'c' is classification: set data.normalize_targets = none"
    ]
    assert not (tmp_path / "run").exists()


def test_paper_experiments_keep_the_authors_targets():
    from s5jax.config import list_experiments, load_experiment

    names = list_experiments()
    assert "pendulum" in names
    assert all(load_experiment(n).data.normalize_targets == "none" for n in names)
