"""`model.members`: a deep ensemble is K independent models, trained each on its own loss, whose
probabilities are averaged; it trains, checkpoints, predicts and exports as one model."""

import io
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s5jax.config import ConfigError, ModelConfig, apply_overrides, load_experiment
from s5jax.nn import Ensemble, build_model, combine_members, count_parameters
from s5jax.train._engine import train_and_evaluate
from s5jax.train._runs import load_run
from s5jax.train._steps import make_steps

CFG = dict(n_layers=2, d_model=8, ssm_size=8, blocks=2, bidirectional=True, dropout=0.0)


def _batch(n=6, L=12, d=2, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    return {
        "x": jnp.asarray(rng.standard_normal((n, L, d)), jnp.float32),
        "y": jnp.asarray(rng.integers(0, classes, n), jnp.int32),
        "mask": jnp.ones((n,), bool),
    }


def _apply(model, state, x):
    return jax.vmap(
        lambda x: model(x, state, inference=True), axis_name="batch", out_axes=(0, None)
    )(x)[0]


def test_an_ensemble_predicts_the_mean_probability_of_its_members():
    key = jax.random.PRNGKey(0)
    ensemble, state = build_model(ModelConfig(**CFG, members=3), d_input=2, n_outputs=3, key=key)
    assert isinstance(ensemble, Ensemble) and ensemble.size == 3
    x = _batch()["x"]
    got = _apply(ensemble, state, x)
    probs = []
    for k in jax.random.split(key, 3):  # member k is the model built from the k-th split key
        single, single_state = build_model(ModelConfig(**CFG), d_input=2, n_outputs=3, key=k)
        probs.append(np.exp(np.asarray(_apply(single, single_state, x), np.float64)))
    np.testing.assert_allclose(np.exp(got), np.mean(probs, axis=0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(probs[0], probs[1], atol=1e-3)  # the members differ
    # regression averages the predictions themselves
    outs = jnp.asarray([[1.0, -2.0], [3.0, 4.0]])
    np.testing.assert_allclose(combine_members("regression", outs), [2.0, 1.0])


def test_each_member_follows_its_own_gradient():
    """A training step of the ensemble = each member's own step (BatchNorm in training mode,
    per-member statistics): the ensemble's loss is the members' mean, so plain SGD at rate
    K·lr on the ensemble moves each member as SGD at lr moves it alone."""
    key, K, lr = jax.random.PRNGKey(3), 2, 0.05
    batch = _batch()
    ensemble, state = build_model(ModelConfig(**CFG, members=K), d_input=2, n_outputs=3, key=key)
    params, static = eqx.partition(ensemble, eqx.is_inexact_array)
    steps = make_steps(static, optax.sgd(K * lr), "classification", members=K)
    opt_state = optax.sgd(K * lr).init(params)
    for i in range(2):
        params, state, opt_state, stats = steps.train(
            params, state, opt_state, batch, jax.random.PRNGKey(i)
        )
    trained = eqx.combine(params, static)
    for k, member_key in enumerate(jax.random.split(key, K)):
        single, s_state = build_model(ModelConfig(**CFG), d_input=2, n_outputs=3, key=member_key)
        s_params, s_static = eqx.partition(single, eqx.is_inexact_array)
        s_steps = make_steps(s_static, optax.sgd(lr), "classification")
        s_opt = optax.sgd(lr).init(s_params)
        for i in range(2):
            s_params, s_state, s_opt, _ = s_steps.train(
                s_params, s_state, s_opt, batch, jax.random.PRNGKey(i)
            )
        member = jax.tree_util.tree_map(
            lambda a: a[k], eqx.filter(trained.members, eqx.is_inexact_array)
        )
        for a, b in zip(jax.tree_util.tree_leaves(member), jax.tree_util.tree_leaves(s_params),
                        strict=True):  # fmt: skip
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
        member_state = jax.tree_util.tree_map(lambda a: a[k], state)
        for a, b in zip(jax.tree_util.tree_leaves(member_state),
                        jax.tree_util.tree_leaves(s_state), strict=True):  # fmt: skip
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # the reported metric is the ensemble's (averaged) accuracy, in [0, 1]
    assert 0.0 <= float(stats["metric"]) <= 1.0


def test_members_are_checked_where_they_cannot_work():
    with pytest.raises(ConfigError, match=r"model\.members = 2 and model\.causal = true"):
        apply_overrides(load_experiment("synthetic"), ["model.members=2", "model.causal=true"])
    with pytest.raises(ConfigError, match="not the 'gaussian' head"):
        apply_overrides(load_experiment("pendulum"), ["model.members=2"])
    with pytest.raises(ConfigError, match=r"model\.members = 0: must be > 0"):
        apply_overrides(load_experiment("synthetic"), ["model.members=0"])


def test_an_ensemble_run_trains_checkpoints_and_predicts_as_one_model(tmp_path):
    cfg = apply_overrides(
        load_experiment("synthetic"),
        ["model.members=2", "train.epochs=2", "data.n_train=64", "data.n_eval=32"],
    )
    out = io.StringIO()
    summary = train_and_evaluate(cfg, tmp_path / "run", progress=False, stream=out)
    assert "(2 ensemble members of " in out.getvalue()
    run = load_run(tmp_path / "run", "best")
    model = eqx.combine(run.params, run.static)
    assert isinstance(model, Ensemble)
    first = jax.tree_util.tree_map(lambda a: a[0], eqx.filter(model.members, eqx.is_array))
    assert summary["n_params"] == 2 * count_parameters(first)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["members"] == 2
    # the checkpoint's model gives the run's own test figure
    assert run.evaluate("test")["accuracy"] == pytest.approx(summary["test_at_best_val"])
    with pytest.raises(ValueError, match="runs whole sequences only"):
        model.init_state()
