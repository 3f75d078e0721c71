"""The chunked scan equals the sequential and parallel scans (states, final state, gradients).

Small chunk sizes are forced (the default is large) so that L is rarely a multiple of the
chunk size and several chunks are carried across.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax import core
from s5jax.core import _scan

from .test_scan import (
    _random,
    check_equals_sequential_and_parallel,
    check_gradients_equal_sequential,
    run_recurrence,
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
def test_chunked_equals_sequential_and_parallel(
    L, P, T, varying, reverse, with_x0, with_resets, seed
):
    with scan_setting("CHUNK_SIZE", T):
        check_equals_sequential_and_parallel(
            "chunked", seed, L, P, varying, reverse, with_x0, with_resets
        )


@settings(max_examples=12, deadline=None)
@given(
    L=st.integers(1, 30),
    T=st.integers(1, 7),
    varying=st.booleans(),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    with_resets=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_gradients_equal_sequential(L, T, varying, reverse, with_x0, with_resets, seed):
    with scan_setting("CHUNK_SIZE", T):
        check_gradients_equal_sequential("chunked", seed, L, varying, reverse, with_x0, with_resets)


@pytest.mark.parametrize("varying", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_x0", [False, True])
@pytest.mark.parametrize("with_resets", [False, True])
def test_chunked_equals_sequential_in_every_mode(varying, reverse, with_x0, with_resets):
    # Every branch at once, deterministically: L = 23 with T = 5 is four full chunks and a
    # padded one, so an off-by-one at a chunk boundary or in the padding shows in every mode.
    L, P, T = 23, 2, 5
    rng = np.random.default_rng(7)
    a, b = _random(rng, L, P, varying)
    x0 = jnp.asarray(rng.normal(size=P) + 1j * rng.normal(size=P)) if with_x0 else None
    resets = jnp.asarray(np.arange(L) % 7 == 3) if with_resets else None
    with jax.enable_x64(True), scan_setting("CHUNK_SIZE", T):
        args = (jnp.asarray(a), jnp.asarray(b), reverse, x0, resets)
        xs, final = run_recurrence("chunked", *args)
        xs_ref, final_ref = run_recurrence("sequential", *args)
    np.testing.assert_allclose(np.asarray(xs), np.asarray(xs_ref), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(final), np.asarray(final_ref), rtol=1e-10, atol=1e-10)


def test_chunked_under_jit_and_vmap_float32(getkey):
    # The benchmark's use: a batch of sequences, one Λ̄, several chunks and padding.
    P, L = 8, 50
    k1, k2 = jax.random.split(getkey())
    a = jnp.exp(jax.lax.complex(-0.05 * jnp.ones((P,)), jax.random.normal(k1, (P,))))
    b = jax.random.normal(k2, (4, L, P), jnp.complex64)
    with scan_setting("CHUNK_SIZE", 16):
        chunked = jax.jit(jax.vmap(lambda bb: core.linear_recurrence(a, bb, method="chunked")[0]))
        got = chunked(b)
    want = jax.vmap(lambda bb: core.linear_recurrence(a, bb, method="sequential")[0])(b)
    assert got.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_chunked_is_a_scan_method():
    assert "chunked" in core.SCAN_METHODS
    assert core.resolve_scan_method("chunked") == "chunked"
    assert _scan.CHUNK_SIZE >= 1
