"""Whole-model online inference (`S5Model.init_state` / `step` / `run_online`, §3.3, App. C.2).

Two views that must agree: the model run step by step and the offline model (inference mode)
applied to the inputs seen so far. Pooled heads are compared with the offline model on every
prefix; per-step heads with the offline model on the whole sequence (a causal model's step k
sees only the first k + 1 inputs). float64 to 1e-10, float32 to 1e-5 (relative to the output's
scale).
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax.config import list_experiments, load_experiment
from s5jax.core import step_multipliers
from s5jax.nn import StreamState, build_model

CAUSAL = [
    name
    for name in list_experiments()
    if not load_experiment(name).model.bidirectional
    and load_experiment(name).model.head != "retrieval"
]


def _shrunk(model_cfg, **changes):
    """The config's choices (encoder, norm, activation, head, pooling, Δ mode) at a small size."""
    small = dict(n_layers=2, d_model=8, ssm_size=8, blocks=2, dropout=0.1)
    return dataclasses.replace(model_cfg, **{**small, **changes})


def _trained_statistics(model, state, key):
    """Give every BatchNorm non-trivial running statistics, as a trained model has."""
    for layer in model.layers:
        index = getattr(layer.norm, "state_index", None)
        if index is None:
            continue
        key, k1, k2 = jax.random.split(key, 3)
        mean, var = state.get(index)
        mean = 0.3 * jax.random.normal(k1, mean.shape, mean.dtype)
        var = jnp.exp(0.5 * jax.random.normal(k2, var.shape, var.dtype))
        state = state.set(index, (mean, var))
    return state


def _inputs(model_cfg, L, key, dtype, d_input=3, vocab=11):
    if model_cfg.encoder == "embedding":
        return jax.random.randint(key, (L,), 0, vocab)
    width = 576 if model_cfg.encoder == "pendulum_cnn" else d_input
    return jax.random.uniform(key, (L, width), dtype)


def _build(model_cfg, key, dtype, n_outputs=3, d_input=3, vocab=11):
    width = 576 if model_cfg.encoder == "pendulum_cnn" else d_input
    model, state = build_model(
        model_cfg, d_input=width, n_outputs=n_outputs,
        vocab=vocab if model_cfg.encoder == "embedding" else None, key=key, dtype=dtype,
    )  # fmt: skip
    return model, _trained_statistics(model, state, jax.random.fold_in(key, 7))


def _offline(model, state, x, dt, lengths=None):
    out, _ = eqx.filter_jit(
        lambda m, x, dt: m(x, state, inference=True, dt=dt, lengths=lengths)
    )(model, x, dt)
    return out


def _online(model, state, x, dt, resets=None):
    stream = model.init_state(state)
    _, outs = eqx.filter_jit(lambda m, s, x, dt, r: m.run_online(s, x, dt=dt, resets=r))(
        model, stream, x, dt, resets
    )
    return outs


def _close(a, b, rtol):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(np.max(np.abs(b)), 1.0)
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


def _check_agree(model, state, x, dt, rtol):
    """Online outputs at every step equal the offline model on the inputs seen so far."""
    L = x.shape[0]
    online = _online(model, state, x, dt)
    if model.pooling == "none":
        offline = _offline(model, state, x, dt)
        for a, b in zip(jax.tree.leaves(online), jax.tree.leaves(offline), strict=True):
            _close(a, b, rtol)
        return
    for k in range(L):
        lengths = jnp.asarray(k + 1) if model.pooling == "masked_mean" else None
        prefix = _offline(model, state, x[: k + 1], None if dt is None else dt[: k + 1], lengths)
        _close(online[k], prefix, rtol)


@pytest.mark.parametrize("name", CAUSAL)
def test_every_causal_paper_config_steps_like_offline_float64(name, x64, getkey):
    cfg = _shrunk(load_experiment(name).model)
    model, state = _build(cfg, getkey(), jnp.float64)
    L = 5
    x = _inputs(cfg, L, getkey(), jnp.float64)
    t = jnp.cumsum(jax.random.uniform(getkey(), (L,), jnp.float64, 0.2, 2.0))
    _check_agree(model, state, x, step_multipliers(t), 1e-10)


@pytest.mark.parametrize("name", ["pendulum", "smnist"])
def test_paper_configs_step_like_offline_float32(name, getkey):
    cfg = _shrunk(load_experiment(name).model)
    model, state = _build(cfg, getkey(), jnp.float32)
    L = 6
    x = _inputs(cfg, L, getkey(), jnp.float32)
    t = jnp.cumsum(jax.random.uniform(getkey(), (L,), jnp.float32, 0.2, 2.0))
    _check_agree(model, state, x, step_multipliers(t), 1e-5)


HEADS_AND_POOLINGS = [
    ("classification", "mean"),
    ("classification", "masked_mean"),
    ("classification", "last"),
    ("classification", "none"),
    ("regression", "mean"),
    ("regression", "none"),
    ("gaussian", "none"),
]
_CONFIGS = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["batch", "layer"]),
        "prenorm": st.booleans(),
        "activation": st.sampled_from(["gelu", "full_glu", "half_glu1", "half_glu2"]),
        "head_pooling": st.sampled_from(HEADS_AND_POOLINGS),
        "encoder": st.sampled_from(["dense", "embedding"]),
        "discretization": st.sampled_from(["zoh", "bilinear"]),
        "conj_sym": st.booleans(),
        "parameterization": st.sampled_from(["continuous", "discrete"]),
        "irregular": st.booleans(),
        "L": st.integers(2, 5),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=8, deadline=None)
@given(c=_CONFIGS)
def test_random_configs_step_like_offline_float64(c):
    with jax.enable_x64(True):
        _random_config_agrees(c)


def _random_config_agrees(c):
    head, pooling = c["head_pooling"]
    irregular = c["irregular"] and c["parameterization"] == "continuous"
    cfg = _shrunk(
        load_experiment("synthetic").model, norm=c["norm"], prenorm=c["prenorm"],
        activation=c["activation"], head=head, pooling=pooling, encoder=c["encoder"],
        discretization=c["discretization"], conj_sym=c["conj_sym"],
        parameterization=c["parameterization"],
    )  # fmt: skip
    key = jax.random.PRNGKey(c["seed"])
    k1, k2, k3 = jax.random.split(key, 3)
    model, state = _build(cfg, k1, jnp.float64)
    x = _inputs(cfg, c["L"], k2, jnp.float64)
    dt = None
    if irregular:
        dt = step_multipliers(jnp.cumsum(jax.random.uniform(k3, (c["L"],), jnp.float64, 0.2, 3)))
    _check_agree(model, state, x, dt, 1e-10)


@pytest.mark.parametrize("name", ["pendulum", "synthetic"])
def test_reset_starts_a_new_episode(name, x64, getkey):
    """Two episodes in one stream, with a reset at the second's first step, give each
    episode's offline outputs; without the reset the second episode's outputs differ."""
    cfg = _shrunk(load_experiment(name).model)
    model, state = _build(cfg, getkey(), jnp.float64)
    La, Lb = 4, 3
    x = _inputs(cfg, La + Lb, getkey(), jnp.float64)
    ta = jnp.cumsum(jax.random.uniform(getkey(), (La,), jnp.float64, 0.5, 2.0))
    tb = jnp.cumsum(jax.random.uniform(getkey(), (Lb,), jnp.float64, 0.5, 2.0))
    dt = jnp.concatenate([step_multipliers(ta), step_multipliers(tb)])
    resets = jnp.zeros((La + Lb,), bool).at[La].set(True)
    online = _online(model, state, x, dt, resets)
    off_a = _offline(model, state, x[:La], dt[:La])
    off_b = _offline(model, state, x[La:], dt[La:])
    for got, a, b in zip(jax.tree.leaves(online), jax.tree.leaves(off_a), jax.tree.leaves(off_b),
                         strict=True):  # fmt: skip
        if model.pooling == "none":
            _close(got[:La], a, 1e-10)
            _close(got[La:], b, 1e-10)
        else:
            _close(got[La - 1], a, 1e-10)
            _close(got[-1], b, 1e-10)
    carried = _online(model, state, x, dt)
    last = jax.tree.leaves(carried)[0][-1]
    assert np.max(np.abs(np.asarray(last) - np.asarray(jax.tree.leaves(online)[0][-1]))) > 1e-6


def test_batch_of_streams_under_vmap_equals_each_stream(getkey):
    cfg = _shrunk(load_experiment("pendulum").model)
    model, state = _build(cfg, getkey(), jnp.float32)
    B, L = 3, 4
    x = jax.random.uniform(getkey(), (B, L, 576))
    dt = 1.0 + jax.random.uniform(getkey(), (B, L))
    streams = model.init_state(state, batch=B)
    assert jax.tree.leaves(streams)[0].shape[0] == B

    @eqx.filter_jit
    def run(m, streams, x, dt):
        def one_step(s, inputs):
            x_t, dt_t = inputs
            return jax.vmap(lambda s, x, d: m.step(s, x, dt_t=d))(s, x_t, dt_t)

        return jax.lax.scan(one_step, streams, (x.swapaxes(0, 1), dt.swapaxes(0, 1)))

    _, (mean, var) = run(model, streams, x, dt)
    for b in range(B):
        want_mean, want_var = _online(model, state, x[b], dt[b])
        _close(mean[:, b], want_mean, 1e-6)
        _close(var[:, b], want_var, 1e-6)


def test_bidirectional_and_retrieval_models_cannot_run_online(getkey, user_facing):
    cfg = _shrunk(load_experiment("listops").model)
    model, state = build_model(cfg, d_input=20, n_outputs=10, vocab=20, key=getkey())
    with pytest.raises(ValueError, match="bidirectional model cannot run online"):
        model.init_state(state)
    with pytest.raises(ValueError, match="bidirectional"):
        model.step(None, jnp.asarray(1))
    cfg = _shrunk(load_experiment("retrieval").model, bidirectional=False)
    model, state = build_model(cfg, d_input=1, n_outputs=2, vocab=13, key=getkey())
    with pytest.raises(ValueError, match="retrieval model cannot run online"):
        model.init_state(state)


def test_step_input_errors_name_the_expected_shape(getkey, user_facing):
    cfg = _shrunk(load_experiment("synthetic").model)
    model, state = build_model(cfg, d_input=3, n_outputs=2, key=getkey())
    stream = model.init_state(state)
    assert isinstance(stream, StreamState)
    with pytest.raises(ValueError, match=r"x_t must have shape \(d_input,\) = \(3,\)"):
        model.step(stream, jnp.ones((4,)))
    tokens = _shrunk(load_experiment("synthetic").model, encoder="embedding")
    model, state = build_model(tokens, d_input=5, n_outputs=2, vocab=5, key=getkey())
    with pytest.raises(ValueError, match="one integer token id"):
        model.step(model.init_state(state), jnp.ones((5,)))
    with pytest.raises(ValueError, match="reset must be a boolean scalar"):
        model.step(model.init_state(state), jnp.asarray(1), reset=jnp.ones((2,), bool))


def test_zero_shot_step_rescale_reaches_every_step(x64, getkey):
    """`step_rescale` in step mode equals the offline model's (§6.2), and changes the output."""
    cfg = _shrunk(load_experiment("synthetic").model, pooling="none", head="regression")
    model, state = _build(cfg, getkey(), jnp.float64)
    x = _inputs(cfg, 5, getkey(), jnp.float64)
    stream = model.init_state(state)
    _, online = eqx.filter_jit(lambda m, s, x: m.run_online(s, x, step_rescale=2.0))(
        model, stream, x
    )
    offline, _ = model(x, state, inference=True, step_rescale=2.0)
    _close(online, offline, 1e-10)
    plain, _ = model(x, state, inference=True)
    assert np.max(np.abs(np.asarray(plain) - np.asarray(offline))) > 1e-6


def test_pendulum_model_trained_a_few_steps_predicts_the_same_both_ways(getkey):
    """Train the pendulum model for a few optimiser steps with the real training step, then
    compare its online predictions (irregular Δ) with the offline ones."""
    from s5jax.train._optim import build_optimizer
    from s5jax.train._steps import make_steps

    config = load_experiment("pendulum")
    cfg = _shrunk(config.model)
    model, state = build_model(cfg, d_input=576, n_outputs=2, key=getkey())
    optimizer, _ = build_optimizer(config.optim, model, steps_per_epoch=3, epochs=1)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    steps = make_steps(static, optimizer, "gaussian")
    B, L = 4, 8
    t = jnp.cumsum(jax.random.uniform(getkey(), (B, L), minval=0.5, maxval=2.0), axis=1)
    dt = jnp.concatenate([jnp.ones((B, 1)), jnp.diff(t, axis=1)], axis=1)
    batch = {
        "x": jax.random.uniform(getkey(), (B, L, 576)),
        "y": jax.random.normal(getkey(), (B, L, 2)),
        "mask": jnp.ones((B,), bool),
        "dt": dt,
    }
    before = np.array(params.layers[0].ssm.B_re)
    for i in range(3):
        params, state, opt_state, stats = steps.train(
            params, state, opt_state, batch, jax.random.PRNGKey(i)
        )
        assert np.isfinite(float(stats["loss"]))
    assert not np.allclose(np.asarray(params.layers[0].ssm.B_re), before)  # it trained
    trained = eqx.combine(params, static)
    for b in range(2):
        mean_on, var_on = _online(trained, state, batch["x"][b], dt[b])
        mean_off, var_off = _offline(trained, state, batch["x"][b], dt[b])
        _close(mean_on, mean_off, 1e-5)
        _close(var_on, var_off, 1e-5)


def test_streaming_example_runs_and_agrees_with_the_offline_model():
    """`examples/streaming.py` (briefly trained model) streams a simulated sequence and checks
    its predictions against the offline model itself (it exits non-zero if they disagree)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "streaming.py"
    done = subprocess.run(
        [sys.executable, str(script), "--train-steps", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "running MSE over 50 frames" in done.stdout
    gap = float(done.stdout.split("offline model: ")[1].split()[0])
    assert gap < 1e-4


def test_mixed_precision_model_steps_like_offline(getkey):
    """Under `precision = "bf16"` the step takes bfloat16 operands where the sequence path
    does; the outputs agree to bfloat16 rounding (8 bits of mantissa: 2⁻⁸ ≈ 4e-3 relative per
    rounding, a few roundings deep)."""
    cfg = _shrunk(load_experiment("pendulum").model, precision="bf16")
    model, state = _build(cfg, getkey(), jnp.float32)
    x = _inputs(cfg, 6, getkey(), jnp.float32)
    dt = step_multipliers(jnp.cumsum(jax.random.uniform(getkey(), (6,), minval=0.5, maxval=2.0)))
    online = _online(model, state, x, dt)
    offline = _offline(model, state, x, dt)
    for a, b in zip(jax.tree.leaves(online), jax.tree.leaves(offline), strict=True):
        assert a.dtype == b.dtype == jnp.float32
        _close(a, b, 1e-2)
