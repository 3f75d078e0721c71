"""The matmul scan equals the sequential and parallel scans (states, final state, gradients).

Small chunk sizes are forced so that L is rarely a multiple of the chunk size and several
chunks are carried across, forward and in reverse.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax import core
from s5jax.core import _scan

from .test_scan import _random


@contextlib.contextmanager
def _chunk(T):
    old = _scan.MATMUL_CHUNK
    _scan.MATMUL_CHUNK = T
    try:
        yield
    finally:
        _scan.MATMUL_CHUNK = old


def _run(method, a, b, reverse, x0, resets):
    # A new function per call: `_scan.MATMUL_CHUNK` is read when tracing.
    def run(a, b, x0, resets):
        return core.linear_recurrence(
            a, b, reverse=reverse, initial_state=x0, resets=resets, method=method
        )

    return jax.jit(run)(a, b, x0, resets)


@settings(max_examples=30, deadline=None)
@given(
    L=st.integers(1, 40),
    P=st.integers(1, 4),
    T=st.integers(1, 9),
    varying=st.booleans(),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    with_resets=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_equals_sequential_and_parallel(
    L, P, T, varying, reverse, with_x0, with_resets, seed
):
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, varying)
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P) if with_x0 else None
    resets = rng.random(L) < 0.2 if with_resets else None
    with jax.enable_x64(True), _chunk(T):
        args = (
            jnp.asarray(a),
            jnp.asarray(b),
            reverse,
            None if x0 is None else jnp.asarray(x0),
            None if resets is None else jnp.asarray(resets),
        )
        xs, final = _run("matmul", *args)
        for method in ("sequential", "parallel"):
            xs_ref, final_ref = _run(method, *args)
            np.testing.assert_allclose(np.asarray(xs), np.asarray(xs_ref), rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(
                np.asarray(final), np.asarray(final_ref), rtol=1e-10, atol=1e-10
            )


@settings(max_examples=12, deadline=None)
@given(
    L=st.integers(1, 30),
    T=st.integers(1, 7),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_gradients_equal_sequential(L, T, reverse, with_x0, seed):
    # Time-invariant a (the custom VJP's case; per-step a runs the parallel scan).
    P = 3
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, False)
    w = rng.normal(size=(L, P)) + 1j * rng.normal(size=(L, P))
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P)
    with jax.enable_x64(True), _chunk(T):
        w = jnp.asarray(w)

        def loss(a, b, x0, method):
            xs, final = core.linear_recurrence(
                a, b, reverse=reverse, initial_state=x0 if with_x0 else None, method=method
            )
            return jnp.sum(jnp.real(w * xs)) + jnp.sum(jnp.abs(final) ** 2)

        args = (jnp.asarray(a), jnp.asarray(b), jnp.asarray(x0))
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
        grads = grad(*args, "matmul")
        expected = grad(*args, "sequential")
        for g, e in zip(grads, expected):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-9, atol=1e-9)


def test_matmul_in_apply_ssm_equals_sequential_with_gradients(getkey):
    # The layer's use: a bidirectional SSM (a forward and a reverse scan) over a batch
    # (vmap), float32, several chunks and padding (L = 50, T = 16); the loss's gradient with
    # respect to Λ̄, B̄, C̃, D and u.
    H, P, L = 4, 6, 50
    ks = jax.random.split(getkey(), 5)
    lam = jax.lax.complex(-0.05 - jax.random.uniform(ks[0], (P,)), jax.random.normal(ks[1], (P,)))
    lam_bar = jnp.exp(0.1 * lam)
    B = jax.random.normal(ks[2], (P, H), jnp.complex64) / H
    C = jax.random.normal(ks[3], (H, 2 * P), jnp.complex64) / P
    D = jnp.ones((H,))
    u = jax.random.normal(ks[4], (3, L, H))

    def loss(lam_bar, B, C, D, u, method):
        y = jax.vmap(
            lambda uu: core.apply_ssm(lam_bar, B, C, D, uu, bidirectional=True, method=method)
        )(u)
        return jnp.sum(jnp.sin(y))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)), static_argnums=5)
    with _chunk(16):
        got = grad(lam_bar, B, C, D, u, "matmul")
    want = grad(lam_bar, B, C, D, u, "sequential")
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-4, atol=2e-4)


def test_powers_by_doubling_equal_the_power_function():
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, 5) * np.exp(1j * rng.uniform(-3, 3, 5))
    with jax.enable_x64(True):
        got = np.asarray(_scan._powers(jnp.asarray(a), 37))
    np.testing.assert_allclose(got, a[None] ** np.arange(37)[:, None], rtol=1e-13)


def test_matmul_is_a_scan_method():
    assert "matmul" in core.SCAN_METHODS
    assert core.resolve_scan_method("matmul") == "matmul"
    assert core.resolve_ssm_method("matmul") == "matmul"
    assert _scan.MATMUL_CHUNK >= 1
