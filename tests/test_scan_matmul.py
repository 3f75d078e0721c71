"""The matmul scan equals the sequential and parallel scans (states, final state, gradients).

Small chunk sizes are forced so that L is rarely a multiple of the chunk size and several
chunks are carried across, forward and in reverse.
"""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax import core
from s5jax.core import _scan

from .test_scan import (
    check_equals_sequential_and_parallel,
    check_gradients_equal_sequential,
    scan_setting,
)


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
    with scan_setting("MATMUL_CHUNK", T):
        check_equals_sequential_and_parallel(
            "matmul", seed, L, P, varying, reverse, with_x0, with_resets
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
    with scan_setting("MATMUL_CHUNK", T):
        check_gradients_equal_sequential("matmul", seed, L, False, reverse, with_x0, False)


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
    with scan_setting("MATMUL_CHUNK", 16):
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
