"""The train step writes each large gradient to memory once before the optimiser reads it
(`s5jax.train._steps.STORE_GRADIENTS`), and that changes no value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.core import _native
from s5jax.train import _steps

from .test_products import small_training_setup

needs_native = pytest.mark.skipif(
    not _native.native_available(), reason="the native kernel cannot be built here"
)


def _setup():
    return small_training_setup(ssm_size=16)


@needs_native
def test_large_gradients_are_stored_once_and_the_step_is_unchanged(monkeypatch):
    cfg, static, optimizer, carry, batch = _setup()
    monkeypatch.setattr(_steps, "STORED_GRADIENT_SIZE", 64)
    large = sum(p.size >= 64 for p in jax.tree_util.tree_leaves(carry[0]))
    assert 0 < large < len(jax.tree_util.tree_leaves(carry[0]))
    key = jax.random.PRNGKey(2)
    calls, results = {}, {}
    for flag in (True, False):
        monkeypatch.setattr(_steps, "STORE_GRADIENTS", flag)
        step = _steps.make_steps(static, optimizer, cfg.head).train  # read when tracing
        args = jax.tree_util.tree_map(jnp.copy, carry)  # the step donates its buffers
        text = step.lower(*args, batch, key).as_text()
        # The layers' outputs go through the same call (float32, native path): count those
        # apart by comparing with the step that stores nothing.
        calls[flag] = text.count("@s5jax_materialise(")
        new_params, _, new_opt, stats = step(*args, batch, key)
        results[flag] = (stats["loss"], stats["grad_norm"], new_params, new_opt)
    assert calls[True] - calls[False] == large, calls
    for a, b in zip(
        jax.tree_util.tree_leaves(results[True]), jax.tree_util.tree_leaves(results[False]),
        strict=True,
    ):  # fmt: skip
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_without_the_native_kernel_nothing_is_stored(monkeypatch):
    _, _, _, carry, _ = _setup()
    monkeypatch.setattr(_native, "native_available", lambda: False)
    grads = carry[0]
    assert _steps._stored(grads) is grads


def test_the_steps_grad_norm_is_the_global_norm_of_its_gradients():
    """`grad_norm` (logged as `step/grad_norm`) is the global L2 norm of the gradients the
    optimiser receives: with plain SGD at rate 1 the update is -g, so it is the global norm
    of the parameters' change (numpy, float64)."""
    import equinox as eqx
    import optax

    cfg, static, _, (params, state, _), batch = _setup()
    sgd = optax.sgd(1.0)
    step = _steps.make_steps(static, sgd, cfg.head).train
    before = jax.tree_util.tree_map(jnp.copy, params)
    new_params, _, _, stats = step(params, state, sgd.init(params), batch, jax.random.PRNGKey(2))
    change = jax.tree_util.tree_map(lambda a, b: a - b, eqx.filter(before, eqx.is_array),
                                    eqx.filter(new_params, eqx.is_array))  # fmt: skip
    want = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2)
                       for g in jax.tree_util.tree_leaves(change)))  # fmt: skip
    assert want > 0
    assert float(stats["grad_norm"]) == pytest.approx(want, rel=1e-5)
