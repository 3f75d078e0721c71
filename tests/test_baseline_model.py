"""benchmarks/baseline_model.py (the authors' whole model in plain JAX) computes what our model
computes: outputs, BatchNorm statistics and gradients of the training loss, on the same
parameters, in float64, for small versions of the paper's configurations. One case runs by
default (each costs 15-25 s of compiling on 2 cores); the others are marked slow."""

import dataclasses
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.config import load_experiment
from s5jax.nn import build_model
from s5jax.train._steps import per_example_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import baseline_model as base

B, L = 3, 12

CASES = {
    # ListOps/Text-like: tokens, BatchNorm prenorm, bidirectional, half_glu2, masked mean,
    # tied dropout in training mode (the same keys reach both), two layers.
    "tokens-batchnorm-bidirectional": dict(
        task="listops",
        vocab=7,
        n_outputs=4,
        model=dict(
            n_layers=2,
            d_model=6,
            ssm_size=8,
            blocks=2,
            dropout=0.2,
            activation="half_glu2",
            bn_momentum=0.9,
        ),
    ),
    # Retrieval (two documents per example) with LayerNorm prenorm, full_glu, clip_eigs and a
    # unidirectional SSM.
    "retrieval-layernorm-prenorm": dict(
        slow=True,
        task="retrieval",
        vocab=9,
        n_outputs=2,
        model=dict(
            n_layers=1,
            d_model=6,
            ssm_size=8,
            blocks=2,
            norm="layer",
            prenorm=True,
            activation="full_glu",
            clip_eigs=True,
            bidirectional=False,
        ),
    ),
    # Pendulum: per-frame CNN, irregular Δ, LayerNorm postnorm, Gaussian head.
    "pendulum": dict(
        slow=True,
        task="pendulum",
        d_input=576,
        n_outputs=2,
        model=dict(n_layers=1, d_model=6, ssm_size=8, blocks=2),
    ),
    # Retrieval as the paper runs it (BatchNorm over 2B × L, bidirectional, half_glu1).
    "retrieval-batchnorm": dict(
        task="retrieval",
        vocab=9,
        n_outputs=2,
        slow=True,
        model=dict(n_layers=1, d_model=6, ssm_size=8, blocks=2),
    ),
    # psMNIST-like: dense encoder, BatchNorm postnorm, half_glu1, dropout.
    "dense-batchnorm-postnorm": dict(
        task="psmnist",
        d_input=1,
        n_outputs=3,
        slow=True,
        model=dict(n_layers=1, d_model=6, ssm_size=4, blocks=1, dropout=0.15),
    ),
}


def _batch(case, key):
    kx, ky, kl, kt = jax.random.split(key, 4)
    if "vocab" in case:
        shape = (B, 2, L) if case["task"] == "retrieval" else (B, L)
        x = jax.random.randint(kx, shape, 0, case["vocab"])
        lengths = jax.random.randint(kl, shape[:-1], 3, L + 1)
    else:
        x = jax.random.normal(kx, (B, L, case["d_input"]), jnp.float64)
        lengths = None
    if case["task"] == "pendulum":
        y = jax.random.normal(ky, (B, L, 2), jnp.float64)
        dt = jnp.concatenate(
            [jnp.ones((B, 1)), jax.random.uniform(kt, (B, L - 1), jnp.float64, 0.5, 3.0)], axis=1
        )
    else:
        y = jax.random.randint(ky, (B,), 0, case["n_outputs"])
        dt = None
    return {"x": x, "y": y, "lengths": lengths, "dt": dt}


def _ours_loss(kind, static, state, batch, key):
    def loss(params):
        model = eqx.combine(params, static)
        keys = jax.random.split(key, B)

        def one(x, k, n, d):
            return model(x, state, key=k, lengths=n, dt=d)

        out, new_state = jax.vmap(
            one, axis_name="batch",
            in_axes=(0, 0, None if batch["lengths"] is None else 0,
                     None if batch["dt"] is None else 0),
            out_axes=(0, None),
        )(batch["x"], keys, batch["lengths"], batch["dt"])  # fmt: skip
        losses = jax.vmap(lambda o, y: per_example_loss(kind, o, y)[0])(out, batch["y"])
        return jnp.mean(losses), (out, new_state)

    return loss


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if c.get("slow") else n for n, c in CASES.items()],
)
def test_baseline_equals_ours(name, x64):
    case = CASES[name]
    cfg = dataclasses.replace(load_experiment(case["task"]).model, **case["model"])
    model, state = build_model(
        cfg, d_input=case.get("d_input", case.get("vocab")), n_outputs=case["n_outputs"],
        vocab=case.get("vocab"), dtype=jnp.float64, key=jax.random.PRNGKey(0),
    )  # fmt: skip
    batch = _batch(case, jax.random.PRNGKey(1))
    key = jax.random.PRNGKey(2)
    spec, bparams, bstats = base.from_ours(model, state)  # before ours uses the state
    params, static = eqx.partition(model, eqx.is_inexact_array)
    kind = {"gaussian": "gaussian", "retrieval": "retrieval"}.get(cfg.head, "classification")
    (loss, (out, new_state)), grads = jax.jit(
        jax.value_and_grad(_ours_loss(kind, static, state, batch, key), has_aux=True)
    )(params)

    assert spec.dropout == cfg.dropout and spec.norm == cfg.norm
    inputs = base.model_inputs(spec, {k: v for k, v in batch.items() if v is not None})
    # The one-hot inputs are float32 from the host; in this float64 test, float64.
    inputs["x"] = inputs["x"].astype(jnp.float64) if spec.encoder == "onehot" else inputs["x"]

    def base_loss(p):
        o, s = base.apply(spec, p, bstats, inputs["x"], key=key, training=True,
                          lengths=inputs.get("lengths"), dt=inputs.get("dt"))  # fmt: skip
        return jnp.mean(base.per_example_loss(spec, o, inputs["y"])), (o, s)

    (b_loss, (b_out, b_stats)), b_grads = jax.jit(jax.value_and_grad(base_loss, has_aux=True))(
        bparams
    )

    tol = dict(rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(b_loss, loss, **tol)
    for a, b in zip(jax.tree_util.tree_leaves(b_out), jax.tree_util.tree_leaves(out), strict=True):
        np.testing.assert_allclose(a, b, **tol)
    if spec.norm == "batch":  # the running statistics after one training call
        _, _, ours_stats = base.from_ours(model, new_state)
        for a, b in zip(jax.tree_util.tree_leaves(b_stats), jax.tree_util.tree_leaves(ours_stats),
                        strict=True):  # fmt: skip
            np.testing.assert_allclose(a, b, **tol)
        assert not np.allclose(b_stats[0]["mean"], 0)  # the statistics did move
    # Gradients: ours mapped into the baseline's pytree (the map is linear in the leaves).
    _, mapped, _ = base.from_ours(eqx.combine(grads, static))
    flat_b = jax.tree_util.tree_leaves_with_path(b_grads)
    flat_o = jax.tree_util.tree_leaves(mapped)
    assert len(flat_b) == len(flat_o)
    for (path, a), b in zip(flat_b, flat_o, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10, err_msg=jax.tree_util.keystr(path))
    assert all(float(jnp.max(jnp.abs(g))) > 0 for _, g in flat_b if g.size > 1)


@pytest.mark.slow
def test_baseline_training_step_runs_and_learns(x64):
    """The jitted baseline step (value_and_grad, optax multi_transform) lowers the loss on a
    repeated batch, and its optimiser puts Λ, B̃ and log Δ in the Adam group."""
    case = CASES["tokens-batchnorm-bidirectional"]
    cfg = dataclasses.replace(load_experiment("listops").model, **{**case["model"], "n_layers": 1})
    model, state = build_model(cfg, d_input=7, n_outputs=4, vocab=7, dtype=jnp.float64,
                               key=jax.random.PRNGKey(0))  # fmt: skip
    spec, params, stats = base.from_ours(model, state)
    opt = base.make_optimizer(params, ssm_lr=1e-2, lr=1e-2)
    labels = opt.init(params).inner_states
    assert set(labels) == {"ssm", "regular"}
    step = base.make_train_step(spec, opt)
    batch = base.model_inputs(spec, {k: v for k, v in _batch(case, jax.random.PRNGKey(1)).items()
                                     if v is not None})  # fmt: skip
    opt_state = opt.init(params)
    losses = []
    for i in range(4):
        params, stats, opt_state, loss = step(params, stats, opt_state, batch,
                                              jax.random.PRNGKey(i))  # fmt: skip
        losses.append(float(loss))
    assert losses[-1] < losses[0]
