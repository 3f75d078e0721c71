"""The native (C++, XLA FFI) scan equals the sequential scan and the definition.

The kernel is compiled on first use with the system C++ compiler. Where none exists these
tests are skipped (and one test checks that the error then says so); where a compiler exists
the kernel must build, or the build test fails with the compiler's message.
"""

import functools
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax import core
from s5jax.config._schema import ModelConfig
from s5jax.core import _native
from s5jax.nn import _layers, build_model, nll_loss

from .test_scan import _loop, _random, check_gradients_equal_sequential

HAVE_CXX = _native._compiler() is not None
needs_native = pytest.mark.skipif(
    not HAVE_CXX or os.environ.get("S5JAX_NATIVE") == "0",
    reason="no C++ compiler (or S5JAX_NATIVE=0): the native kernel cannot be built here",
)


@needs_native
def test_kernel_builds_on_a_cpu_backend():
    assert core.native_available(), core.native_build_error()
    assert core.native_build_error() == ""
    assert "native" in core.SCAN_METHODS
    assert core.resolve_scan_method("native") == "native"


@needs_native
@settings(max_examples=25, deadline=None)
@given(
    L=st.integers(1, 40),
    P=st.integers(1, 5),
    varying=st.booleans(),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    with_resets=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_native_equals_the_definition_float64(L, P, varying, reverse, with_x0, with_resets, seed):
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, varying)
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P) if with_x0 else None
    resets = rng.random(L) < 0.2 if with_resets else None
    expected = _loop(a, b, reverse, x0, resets)
    with jax.enable_x64(True):
        xs, final = core.linear_recurrence(
            jnp.asarray(a),
            jnp.asarray(b),
            reverse=reverse,
            initial_state=None if x0 is None else jnp.asarray(x0),
            resets=None if resets is None else jnp.asarray(resets),
            method="native",
        )
    assert xs.dtype == jnp.complex128
    np.testing.assert_allclose(np.asarray(xs), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(final), expected[0 if reverse else -1], rtol=1e-12,
                               atol=1e-12)  # fmt: skip


@needs_native
@settings(max_examples=20, deadline=None)
@given(
    L=st.integers(1, 30),
    P=st.integers(1, 4),
    varying=st.booleans(),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    with_resets=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_native_gradients_equal_sequential_float64(
    L, P, varying, reverse, with_x0, with_resets, seed
):
    check_gradients_equal_sequential(
        "native", seed, L, varying, reverse, with_x0, with_resets, P=P, tol=1e-11
    )


@needs_native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("varying", [False, True])
def test_native_real_dtypes(dtype, varying):
    rng = np.random.default_rng(7)
    L, P = 23, 6
    a = rng.uniform(-0.99, 0.99, (L, P) if varying else (P,))
    b = rng.normal(size=(L, P))
    w = rng.normal(size=(L, P))
    with jax.enable_x64(dtype == jnp.float64):
        a, b, w = (jnp.asarray(z, dtype) for z in (a, b, w))

        def loss(a, b, method):
            return jnp.sum(w * core.linear_recurrence(a, b, reverse=True, method=method)[0])

        got = core.linear_recurrence(a, b, reverse=True, method="native")[0]
        want = core.linear_recurrence(a, b, reverse=True, method="sequential")[0]
        g_got = jax.grad(loss, argnums=(0, 1))(a, b, "native")
        g_want = jax.grad(loss, argnums=(0, 1))(a, b, "sequential")
    tol = 1e-12 if dtype == jnp.float64 else 1e-5
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
    for g, e in zip(g_got, g_want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_native_threads_and_streaming_stores_float32(monkeypatch, threads):
    # 4 × 2048 × 512 complex64 = 32 MiB of output: above the streaming-store threshold (16 MiB)
    # and enough work for several threads; odd P offsets rows from 16-byte alignment.
    monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
    rng = np.random.default_rng(11)
    for B, L, P in ((4, 2048, 512), (3, 1500, 601)):
        a = jnp.asarray(0.999 * np.exp(1j * rng.uniform(-np.pi, np.pi, P)), jnp.complex64)
        b = jnp.asarray(rng.normal(size=(B, L, P)) + 1j * rng.normal(size=(B, L, P)), jnp.complex64)
        w = jnp.asarray(rng.normal(size=(B, L, P)), jnp.float32)

        def run(method, a=a):
            return jax.vmap(lambda bb: core.linear_recurrence(a, bb, method=method)[0])

        def loss(a, b, w, method):  # w an argument: see the planar test below
            return jnp.sum(w * jnp.real(run(method, a)(b)))

        got = jax.jit(run("native"))(b)
        want = jax.jit(run("sequential"))(b)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-4)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=3)
        ga, gb = grad(a, b, w, "native")
        ea, eb = grad(a, b, w, "sequential")
        np.testing.assert_allclose(np.asarray(gb), np.asarray(eb), rtol=2e-4, atol=2e-4)
        # ā sums B·L products: compare with a scale-aware tolerance.
        scale = float(jnp.max(jnp.abs(ea)))
        np.testing.assert_allclose(np.asarray(ga), np.asarray(ea), rtol=0, atol=1e-4 * scale)


@needs_native
def test_native_under_nested_vmap_with_batched_per_step_decay():
    rng = np.random.default_rng(5)
    B1, B2, L, P = 2, 3, 9, 4
    a = rng.uniform(0.5, 1, (B1, B2, L, P)) * np.exp(1j * rng.uniform(-3, 3, (B1, B2, L, P)))
    b = rng.normal(size=(B2, L, P)) + 1j * rng.normal(size=(B2, L, P))  # not batched over B1
    with jax.enable_x64(True):
        a, b = jnp.asarray(a), jnp.asarray(b)

        def f(method):
            inner = jax.vmap(lambda aa, bb: core.linear_recurrence(aa, bb, method=method)[0])
            return jax.jit(jax.vmap(inner, in_axes=(0, None)))(a, b)

        np.testing.assert_allclose(np.asarray(f("native")), np.asarray(f("sequential")),
                                   rtol=1e-12, atol=1e-12)  # fmt: skip


def _planar_definition(a, b, bidirectional):
    """[Re x | Im x] (and the reverse-time direction) by the loop in test_scan, float64."""
    P = a.shape[0]
    bc = b[:, :P] + 1j * b[:, P:]
    fwd = _loop(a, bc, False, None, None)
    if not bidirectional:
        return np.concatenate([fwd.real, fwd.imag], axis=1)
    bwd = _loop(a, bc, True, None, None)
    return np.concatenate([fwd.real, bwd.real, fwd.imag, bwd.imag], axis=1)


def _planar_by_linear_recurrence(a, b, bidirectional):
    """The same states by the complex-array `linear_recurrence` (for autodiff)."""
    P = a.shape[0]
    bc = jax.lax.complex(b[:, :P], b[:, P:])
    xs = [core.linear_recurrence(a, bc, method="sequential")[0]]
    if bidirectional:
        xs.append(core.linear_recurrence(a, bc, reverse=True, method="sequential")[0])
    return jnp.concatenate([x.real for x in xs] + [x.imag for x in xs], axis=1)


@needs_native
@settings(max_examples=25, deadline=None)
@given(
    L=st.integers(1, 40),
    P=st.integers(1, 5),
    bidirectional=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_planar_states_equal_the_definition_and_their_gradients_float64(L, P, bidirectional, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1, P) * np.exp(1j * rng.uniform(-3, 3, P))
    b = rng.normal(size=(L, 2 * P))
    w = rng.normal(size=(L, (4 if bidirectional else 2) * P))
    with jax.enable_x64(True):
        a, b, w = jnp.asarray(a), jnp.asarray(b), jnp.asarray(w)
        xs = _native.native_planar_states(a, b, bidirectional)
        assert xs.dtype == jnp.float64
        want = _planar_definition(np.asarray(a), np.asarray(b), bidirectional)
        np.testing.assert_allclose(np.asarray(xs), want, rtol=1e-12, atol=1e-12)

        def loss(f):  # nonlinear in x, so that the cotangents differ from step to step
            return lambda a, b: jnp.sum(w * jnp.sin(f(a, b, bidirectional)))

        got = jax.jit(jax.grad(loss(_native.native_planar_states), argnums=(0, 1)))(a, b)
        want = jax.jit(jax.grad(loss(_planar_by_linear_recurrence), argnums=(0, 1)))(a, b)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-11, atol=1e-11)


@needs_native
@pytest.mark.parametrize(
    "threads, B, L, P",
    [("1", 1, 32, 5), ("1", 1, 65, 2), ("1", 2, 97, 3), ("2", 1, 2065, 40)],
)
def test_bidirectional_planar_gradients_over_several_chunks_float64(monkeypatch, threads, B, L, P):
    # The bidirectional adjoint runs the sequence in chunks of 32 steps (`kAdjointChunk` in
    # _native.cc), from the last, with the reverse-time direction restarted at each chunk from
    # a kept state: one whole chunk, a chunk and one step, several chunks with a partial last
    # one, and (2 threads, one sequence, P 40) lanes split into blocks of 16 and 24.
    monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
    rng = np.random.default_rng(16)
    a = rng.uniform(0.5, 0.99, P) * np.exp(1j * rng.uniform(-3, 3, P))
    b = rng.normal(size=(B, L, 2 * P))
    w = rng.normal(size=(B, L, 4 * P))
    with jax.enable_x64(True):
        a, b, w = jnp.asarray(a), jnp.asarray(b), jnp.asarray(w)

        def loss(f):  # nonlinear in x, so that the cotangents differ from step to step
            return lambda a, b, w: jnp.sum(w * jnp.sin(jax.vmap(lambda bb: f(a, bb, True))(b)))

        got = jax.jit(jax.grad(loss(_native.native_planar_states), argnums=(0, 1)))(a, b, w)
        want = jax.jit(jax.grad(loss(_planar_by_linear_recurrence), argnums=(0, 1)))(a, b, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-10)


@needs_native
@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_planar_states_split_over_threads_lane_blocks_and_streaming_stores(
    monkeypatch, threads, bidirectional
):
    # One sequence splits its lanes into blocks of 16 over the threads (P 40: blocks of 16 and
    # 24); 3 × 2048 × 2 · 2 · 528 float32 = 50 MiB of states: above the streaming-store
    # threshold; odd sequence counts split unevenly.
    monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
    rng = np.random.default_rng(12)
    for B, L, P in ((1, 4096, 40), (3, 2048, 528)):
        a = jnp.asarray(0.999 * np.exp(1j * rng.uniform(-np.pi, np.pi, P)), jnp.complex64)
        b = jnp.asarray(rng.normal(size=(B, L, 2 * P)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(B, L, (4 if bidirectional else 2) * P)), jnp.float32)

        def run(f, a=a):
            return jax.vmap(lambda bb: f(a, bb, bidirectional))

        # w an argument, not a constant of the program: closed over, its 50 MiB made each
        # gradient's compilation take 2.7 s (native) and 5.6 s (reference) instead of 0.1–0.5.
        def loss(a, b, w, f):
            return jnp.sum(w * run(f, a)(b))

        got = jax.jit(run(_native.native_planar_states))(b)
        want = jax.jit(run(_planar_by_linear_recurrence))(b)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-4)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=3)
        ga, gb = grad(a, b, w, _native.native_planar_states)
        ea, eb = grad(a, b, w, _planar_by_linear_recurrence)
        np.testing.assert_allclose(np.asarray(gb), np.asarray(eb), rtol=2e-4, atol=2e-4)
        scale = float(jnp.max(jnp.abs(ea)))  # ā sums B·L·directions products
        np.testing.assert_allclose(np.asarray(ga), np.asarray(ea), rtol=0, atol=1e-4 * scale)


@needs_native
def test_concurrent_native_calls_in_one_executable_share_xla_s_thread_pool():
    # Six independent calls in one executable: XLA's CPU runtime runs them concurrently, each
    # hands chunks of its lanes to helper tasks on that runtime's thread pool, and a helper that
    # starts after its call has returned must find nothing left to do. Every output equals the
    # definition, call after call (fresh buffers each time; a stray late write would show).
    rng = np.random.default_rng(13)
    B, L, P, n = 1, 2048, 64, 6
    a = [
        jnp.asarray(0.99 * np.exp(1j * rng.uniform(-np.pi, np.pi, P)), jnp.complex64)
        for _ in range(n)
    ]
    b = [jnp.asarray(rng.normal(size=(B, L, 2 * P)), jnp.float32) for _ in range(n)]

    def many(f):
        return jax.jit(
            lambda a, b: [jax.vmap(lambda bb: f(ai, bb, True))(bi) for ai, bi in zip(a, b)]
        )

    want = many(_planar_by_linear_recurrence)(a, b)
    run = many(_native.native_planar_states)
    for _ in range(5):
        got = run(a, b)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=2e-4)


@needs_native
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.int32, jnp.float64])
def test_native_transpose_equals_swapaxes(dtype, request):
    # Odd sizes leave partial tiles and blocks on both axes; (3, 2, 1000, 136) makes enough work
    # for the threads; the leading axes are a batch of matrices; (2049, 1031) is over the 4 MiB
    # from which the output is written with streaming stores, on rows that are not 16-byte
    # aligned.
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        request.getfixturevalue("x64")
    rng = np.random.default_rng(14)
    shapes = ((1, 1), (7, 5), (33, 65), (64, 128), (2, 1000, 136), (3, 2, 517, 41), (2049, 1031))
    for shape in shapes:
        x = jnp.asarray(rng.normal(size=shape) * 100, dtype)
        got = jax.jit(_native.native_transpose)(x)
        assert got.shape == (*shape[:-2], shape[-1], shape[-2]) and got.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.swapaxes(x, -1, -2)))


@needs_native
def test_native_transpose_vmaps_and_differentiates():
    rng = np.random.default_rng(15)
    x = jnp.asarray(rng.normal(size=(4, 37, 19)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 19, 37)), jnp.float32)
    got = jax.vmap(_native.native_transpose)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.swapaxes(x, 1, 2)))
    grad = jax.grad(lambda x: jnp.sum(w * jax.vmap(_native.native_transpose)(x) ** 2))(x)
    want = 2 * jnp.swapaxes(w, 1, 2) * x
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-6)
    with pytest.raises(ValueError, match="must be"):
        _native.native_transpose(jnp.ones(3))


@needs_native
def test_native_weight_gradient_equals_the_float64_contraction():
    # Sizes leave partial panels of a and partial tiles of g for both tiles (AVX2: panels of 6
    # columns, tiles of 16; AVX-512: 12 and 32, every remainder of 1 to 11 columns of a among
    # K = 13, 130, 6, 1,024, 23, 17, 19, 21, 15, 14, 20, 3, 9 and whole ones at K = 12); 4,100 rows
    # are three blocks of 2,048 (three partial sums) and chunks of 128 with a short last one;
    # the leading axes are a batch; zero and one rows; (7,000, 1,024) × (…, 520) has its blocks
    # capped by the partial sums' size (three of 2,334 rows, not four of 2,048). Float32
    # accumulation: within 2e-6 of Σ|a||g| of the float64 contraction. Repeated calls are
    # bitwise equal (the blocks' sums are added in block order whichever thread ran them).
    rng = np.random.default_rng(16)
    shapes = (
        ((1, 1), (1, 1)), ((7, 5), (7, 17)), ((4100, 13), (4100, 40)), ((300, 130), (300, 250)),
        ((2, 3, 2100, 6), (2, 3, 2100, 16)), ((0, 4), (0, 5)), ((1, 64), (1, 8)),
        ((7000, 1024), (7000, 520)), ((50, 12), (50, 32)), ((61, 23), (61, 64)),
        *(((33, k), (33, 48)) for k in (17, 19, 21, 15, 14, 20, 3, 9)),
    )  # fmt: skip
    for sa, sg in shapes:
        a, g = rng.normal(size=sa), rng.normal(size=sg)
        f = jax.jit(_native.native_weight_gradient)
        got = f(jnp.asarray(a, jnp.float32), jnp.asarray(g, jnp.float32))
        assert got.shape == (*sa[:-2], sa[-1], sg[-1]) and got.dtype == jnp.float32
        want = np.einsum("...rk,...rn->...kn", a, g)
        scale = np.einsum("...rk,...rn->...kn", np.abs(a), np.abs(g))
        assert np.all(np.abs(np.asarray(got, np.float64) - want) <= 2e-6 * scale + 1e-7), sa
        again = f(jnp.asarray(a, jnp.float32), jnp.asarray(g, jnp.float32))
        np.testing.assert_array_equal(np.asarray(again), np.asarray(got))


@needs_native
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_weight_gradient_splits_columns_without_changing_a_bit(monkeypatch, dtype):
    # Few rows (one block of at most 2,048 per batch element) and several threads: the kernel
    # splits a's columns into ranges of whole panels, one unit each. Every thread count
    # (S5JAX_NATIVE_THREADS, read at each call) gives the same bits as one thread, and all are
    # the float64 contraction to float32 accuracy; K = 200 leaves a partial last panel in the
    # last range (AVX-512: 16 panels of 12 and one of 8), the batch of 3 one block each.
    if dtype == "bfloat16" and not _native.native_weight_gradient_bfloat16():
        pytest.skip("no AVX512_BF16 on this host")
    rng = np.random.default_rng(18)
    f = jax.jit(_native.native_weight_gradient)
    for sa, sg in (((2048, 200), (2048, 70)), ((3, 700, 200), (3, 700, 33)), ((90, 25), (90, 40))):
        a = jnp.asarray(rng.normal(size=sa), dtype)
        g = jnp.asarray(rng.normal(size=sg), dtype)
        results = []
        for threads in ("1", "2", "3", "8"):
            monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
            results.append(np.asarray(f(a, g)))
        for got in results[1:]:
            np.testing.assert_array_equal(got, results[0])
        a64, g64 = np.asarray(a, np.float64), np.asarray(g, np.float64)
        want = np.einsum("...rk,...rn->...kn", a64, g64)
        scale = np.einsum("...rk,...rn->...kn", np.abs(a64), np.abs(g64))
        assert np.all(np.abs(results[0] - want) <= 2e-6 * scale + 1e-7), sa


@needs_native
def test_native_weight_gradient_tile_is_the_hosts_widest_vectors():
    # The build is -march=native: AVX-512 registers where the CPU reports avx512f, else AVX2
    # and FMA where it reports both (the kernel is then used for float32 weight gradients).
    flags = _cpu_flags()
    want = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "portable"
    assert _native.native_weight_gradient_tile() == want
    assert _native.native_weight_gradient_vectorised() == (want != "portable")


@needs_native
def test_native_weight_gradient_vmaps_differentiates_and_rejects():
    rng = np.random.default_rng(17)
    a = jnp.asarray(rng.normal(size=(3, 41, 10)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(3, 41, 19)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 10, 19)), jnp.float32)
    got = jax.vmap(_native.native_weight_gradient)(a, g)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.einsum("brk,brn->bkn", a, g)),
                               rtol=1e-5, atol=1e-5)  # fmt: skip

    def loss(product):
        return lambda a, g: jnp.sum(w * jax.vmap(product)(a, g) ** 2)

    grads = jax.grad(loss(_native.native_weight_gradient), argnums=(0, 1))(a, g)
    wants = jax.grad(loss(lambda a, g: a.T @ g), argnums=(0, 1))(a, g)
    for got, want in zip(grads, wants, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="same leading"):
        _native.native_weight_gradient(a, g[:, :40])
    with pytest.raises(ValueError, match="float32 or bfloat16 operands"):
        _native.native_weight_gradient(a, g.astype(jnp.bfloat16))
    if not _native.native_weight_gradient_bfloat16():
        with pytest.raises(ValueError, match="no bfloat16 tile"):
            _native.native_weight_gradient(a.astype(jnp.bfloat16), g.astype(jnp.bfloat16))


@needs_native
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_column_dot_equals_the_float64_sum_on_any_thread_count(monkeypatch, dtype):
    # Σ_r (x − m) ⊙ g per column, m zero (None) and a shift near x's mean (3 + noise, x about
    # 3: the centring BatchNorm's gradient needs). 2,500 rows are three blocks of 1,024 (the
    # last short), with a batch of 2; one row; zero rows (zeros); N = 1 and odd N. Float32
    # accumulation: within 1e-6 of Σ|x − m||g| of the float64 sum of the same
    # (bfloat16-rounded) values. Every thread count (S5JAX_NATIVE_THREADS, read at each call)
    # gives the bits of one thread: the blocks' sums are added in block order.
    rng = np.random.default_rng(19)
    f = jax.jit(_native.native_column_dot)
    for shape in ((2, 2500, 37), (1, 5), (0, 3), (300, 1), (4, 3, 130, 17)):
        x = jnp.asarray(3 + rng.normal(size=shape), dtype)
        g = jnp.asarray(rng.normal(size=shape), jnp.float32)
        m = jnp.asarray(3 + 0.1 * rng.normal(size=(*shape[:-2], shape[-1])), jnp.float32)
        for shift in (None, m):
            results = []
            for threads in ("1", "2", "5"):
                monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
                results.append(np.asarray(f(x, g, shift)))
            for got in results[1:]:
                np.testing.assert_array_equal(got, results[0])
            assert results[0].shape == m.shape and results[0].dtype == np.float32
            x64, g64 = np.asarray(x, np.float64), np.asarray(g, np.float64)
            if shift is not None:
                x64 = x64 - np.expand_dims(np.asarray(m, np.float64), -2)
            want, scale = np.sum(x64 * g64, axis=-2), np.sum(np.abs(x64 * g64), axis=-2)
            assert np.all(np.abs(results[0] - want) <= 1e-6 * scale + 1e-7), shape


@needs_native
def test_native_column_dot_vmaps_differentiates_and_rejects():
    # Under vmap (m batched or not) the same bits as the batched call; gradients those of the
    # plain Σ_r (x − m) ⊙ g (each in its input's dtype: a bfloat16 x gets a bfloat16 gradient).
    rng = np.random.default_rng(20)
    x = jnp.asarray(rng.normal(size=(3, 41, 10)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(3, 41, 10)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 10)), jnp.float32)
    m = jnp.asarray(rng.normal(size=(3, 10)), jnp.float32)
    batched = np.asarray(_native.native_column_dot(x, g, m))
    np.testing.assert_array_equal(np.asarray(jax.vmap(_native.native_column_dot)(x, g, m)), batched)
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(_native.native_column_dot, in_axes=(0, 0, None))(x, g, m[1])),
        np.asarray(_native.native_column_dot(x, g, jnp.broadcast_to(m[1], m.shape))),
    )

    def loss(f):
        return lambda x, g, m: jnp.sum(w * f(x, g, m) ** 2)

    def plain(x, g, m):
        return jnp.sum((x.astype(jnp.float32) - m[:, None, :]) * g, axis=-2)

    for dtype, rtol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)):  # bfloat16: its rounding
        xd = x.astype(dtype)
        grads = jax.grad(loss(_native.native_column_dot), argnums=(0, 1, 2))(xd, g, m)
        wants = jax.grad(loss(plain), argnums=(0, 1, 2))(xd, g, m)
        for got, want in zip(grads, wants, strict=True):
            assert got.dtype == want.dtype
            got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-3)
    with pytest.raises(ValueError, match="of one shape"):
        _native.native_column_dot(x, g[:, :40])
    with pytest.raises(ValueError, match="g and m float32"):
        _native.native_column_dot(x, g.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"m must be \(3, 10\)"):
        _native.native_column_dot(x, g, w[0])
    with pytest.raises(ValueError, match="x float32 or bfloat16"):
        _native.native_column_dot(x.astype(jnp.float16), g)


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@needs_native
def test_native_weight_gradient_bfloat16_tile_and_amx_follow_the_cpu_flags():
    # -march=native: the bfloat16 tile is compiled where the CPU reports AVX-512 with
    # AVX512_BF16, and the build sees AMX where the CPU reports amx_bf16.
    flags = _cpu_flags()
    assert _native.native_weight_gradient_bfloat16() == ({"avx512f", "avx512_bf16"} <= flags)
    assert _native.native_host_has_amx() == ("amx_bf16" in flags)


@pytest.mark.skipif(
    not _native.native_weight_gradient_bfloat16(), reason="no AVX512_BF16 on this host"
)
def test_native_bfloat16_weight_gradient_equals_the_float64_contraction():
    # The bfloat16 tile takes rows in pairs: odd row counts (the last pair padded with zeros),
    # one row, chunks of 128 with a short odd last one, blocks of 2,048 (4,101 rows: three
    # partial sums), every remainder of 1 to 11 columns of a (K = 13, 130, 6, 23, 17, 19, 21,
    # 15, 14, 20, 3, 9) and whole panels (K = 12, 512), partial 32-column tiles of g, and a
    # batch. Reference: the float64 contraction of the same bfloat16 values; float32 sums,
    # within 2e-6 of Σ|a||g|, and more accurate than XLA's product (a transposed copy and a
    # bfloat16 dot with float32 accumulation) at the layer's shape. Repeated calls are bitwise
    # equal; the VJP returns each gradient in its input's dtype.
    rng = np.random.default_rng(18)
    shapes = (
        ((1, 1), (1, 1)), ((7, 5), (7, 17)), ((4101, 13), (4101, 40)), ((301, 130), (301, 250)),
        ((2, 3, 257, 6), (2, 3, 257, 16)), ((0, 4), (0, 5)), ((1, 64), (1, 8)),
        ((50, 12), (50, 32)), ((61, 23), (61, 64)), ((2048, 512), (2048, 128)),
        *(((33, k), (33, 48)) for k in (17, 19, 21, 15, 14, 20, 3, 9)),
    )  # fmt: skip
    f = jax.jit(_native.native_weight_gradient)
    for sa, sg in shapes:
        a = jnp.asarray(rng.normal(size=sa), jnp.bfloat16)
        g = jnp.asarray(rng.normal(size=sg), jnp.bfloat16)
        got = f(a, g)
        assert got.shape == (*sa[:-2], sa[-1], sg[-1]) and got.dtype == jnp.float32
        a64, g64 = np.asarray(a, np.float64), np.asarray(g, np.float64)
        want = np.einsum("...rk,...rn->...kn", a64, g64)
        scale = np.einsum("...rk,...rn->...kn", np.abs(a64), np.abs(g64))
        err = np.abs(np.asarray(got, np.float64) - want)
        assert np.all(err <= 2e-6 * scale + 1e-7), sa
        np.testing.assert_array_equal(np.asarray(f(a, g)), np.asarray(got))
        if sa == (2048, 512):
            xla = jnp.matmul(a.T, g, preferred_element_type=jnp.float32)
            assert err.max() <= np.abs(np.asarray(xla, np.float64) - want).max()
    a = jnp.asarray(rng.normal(size=(3, 41, 10)), jnp.bfloat16)
    g = jnp.asarray(rng.normal(size=(3, 41, 19)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(3, 10, 19)), jnp.float32)

    def loss(product):
        return lambda a, g: jnp.sum(w * jax.vmap(product)(a, g) ** 2)

    grads = jax.grad(loss(_native.native_weight_gradient), argnums=(0, 1))(a, g)
    wants = jax.grad(
        loss(lambda a, g: jnp.matmul(a.T, g, preferred_element_type=jnp.float32)), argnums=(0, 1)
    )(a, g)
    for got, want in zip(grads, wants, strict=True):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip


@needs_native
def test_planar_states_reject_what_they_cannot_run():
    a = jnp.ones(3, jnp.complex64)
    with pytest.raises(ValueError, match=r"real \(L, 2P\)"):
        _native.native_planar_states(a, jnp.ones((4, 5), jnp.float32))
    with pytest.raises(ValueError, match=r"a must be \(2,\)"):
        _native.native_planar_states(a, jnp.ones((4, 4), jnp.float32))


@needs_native
@pytest.mark.parametrize("bidirectional", [False, True])
def test_native_ssm_runs_the_planar_kernel_and_equals_the_complex_path(
    monkeypatch, getkey, bidirectional
):
    from s5jax.core import _ssm

    rng = np.random.default_rng(3)
    H, P, n = 6, _ssm.NATIVE_PLANAR_MIN_P, 2 if bidirectional else 1
    Lambda_bar = np.exp(-rng.uniform(0.01, 0.5, P) + 1j * rng.uniform(-3, 3, P))
    B_bar = rng.normal(size=(P, H)) + 1j * rng.normal(size=(P, H))
    C = rng.normal(size=(H, n * P)) + 1j * rng.normal(size=(H, n * P))
    args = [jnp.asarray(z, jnp.complex64) for z in (Lambda_bar, B_bar, C)]
    args += [jnp.asarray(rng.normal(size=H), jnp.float32), jax.random.normal(getkey(), (29, H))]

    def traced():  # a new function each time: jax caches traces by function
        def loss(Lambda_bar, B, C, D, u):
            y, final = core.apply_ssm(Lambda_bar, B, C, D, u, bidirectional=bidirectional,
                                      method="native", return_state=True)  # fmt: skip
            return jnp.sum(jnp.sin(y)) + jnp.sum(jnp.abs(final) ** 2), (y, final)

        run = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        return str(jax.make_jaxpr(run)(*args)), run(*args)

    jaxpr, ((_, (y, final)), grads) = traced()
    assert "s5jax_planar" in jaxpr
    fewer = [args[0][:-1], args[1][:-1], args[2][:, : n * (P - 1)], *args[3:]]
    small = functools.partial(core.apply_ssm, bidirectional=bidirectional, method="native")
    assert "s5jax_planar" not in str(jax.make_jaxpr(small)(*fewer))
    monkeypatch.setattr(_ssm, "NATIVE_PLANAR", False)
    jaxpr, ((_, (y_c, final_c)), grads_c) = traced()
    assert "s5jax_planar" not in jaxpr and "s5jax_recurrence" in jaxpr
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_c), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), np.asarray(final_c), rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, grads_c):
        scale = float(jnp.max(jnp.abs(e)))
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=0, atol=1e-5 * scale)


@needs_native
@pytest.mark.parametrize("reference", ["sequential", "fused"])
def test_s5_layer_with_native_scan_matches_other_methods(getkey, reference):
    import equinox as eqx

    from s5jax import nn

    key = getkey()  # same key, same parameters
    ref = nn.S5SSM(8, 16, J=2, bidirectional=True, scan_method=reference, key=key)
    nat = nn.S5SSM(8, 16, J=2, bidirectional=True, scan_method="native", key=key)
    for x, y in zip(jax.tree_util.tree_leaves(nat), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    u = jax.random.normal(getkey(), (37, 8))
    run = eqx.filter_jit(lambda m, u: m(u))  # jitted: 9.4 s op by op, 6.7 s so (both cases)
    np.testing.assert_allclose(
        np.asarray(run(nat, u)), np.asarray(run(ref, u)), rtol=1e-4, atol=1e-5
    )
    grad = eqx.filter_jit(jax.grad(lambda m, u: jnp.sum(m(u) ** 2), argnums=(0, 1)))
    g_nat, g_ref = grad(nat, u), grad(ref, u)
    leaves_nat = jax.tree_util.tree_leaves(eqx.filter(g_nat, eqx.is_inexact_array))
    leaves_ref = jax.tree_util.tree_leaves(eqx.filter(g_ref, eqx.is_inexact_array))
    assert len(leaves_nat) == len(leaves_ref) > 0
    for x, y in zip(leaves_nat, leaves_ref):
        scale = float(jnp.max(jnp.abs(y))) + 1e-6
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-4 * scale)


@needs_native
def test_unsupported_dtype_is_a_clear_error():
    a = jnp.ones((3,), jnp.bfloat16)
    b = jnp.ones((4, 3), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"native.*float32, float64, complex64 and complex128"):
        core.linear_recurrence(a, b, method="native")


def _run_python(code, env):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        env=env, timeout=300, check=False,
    )  # fmt: skip


def test_switched_off_or_without_a_compiler_the_error_says_why(tmp_path):
    code = """
        import jax.numpy as jnp
        from s5jax import core
        assert not core.native_available()
        print("REASON:", core.native_build_error())
        try:
            core.linear_recurrence(jnp.ones(2, jnp.complex64), jnp.ones((3, 2), jnp.complex64),
                                   method="native")
        except RuntimeError as err:
            print("ERROR:", err)
        # "auto" falls back to the chunked scan, and a layer under it still runs.
        import jax
        from s5jax.core import _ssm
        from s5jax.nn import S5SSM
        print("AUTO:", _ssm.resolve_ssm_method("auto", states=10))
        layer = S5SSM(3, 8, bidirectional=True, key=jax.random.PRNGKey(0))
        print("FINITE:", bool(jnp.isfinite(layer(jnp.ones((5, 3)))).all()))
    """
    base = {k: v for k, v in os.environ.items() if k not in ("S5JAX_NATIVE", "CXX")}
    off = _run_python(code, {**base, "S5JAX_NATIVE": "0"})
    assert off.returncode == 0, off.stderr
    assert "REASON: S5JAX_NATIVE=0 is set" in off.stdout
    assert "ERROR: scan method 'native' is unavailable: S5JAX_NATIVE=0" in off.stdout
    assert "method='auto'" in off.stdout
    assert "AUTO: chunked" in off.stdout and "FINITE: True" in off.stdout

    missing = _run_python(code, {**base, "CXX": str(tmp_path / "no-such-compiler")})
    assert missing.returncode == 0, missing.stderr
    assert "building or loading the native kernel failed" in missing.stdout
    assert "AUTO: chunked" in missing.stdout and "FINITE: True" in missing.stdout


def _age(path, days):
    """Set a file's modification time `days` days into the past."""
    then = time.time() - days * 86_400
    os.utime(path, (then, then))


@needs_native
def test_build_is_cached_and_atomic_and_prunes_unused_builds(tmp_path):
    # A cache folder holding another source's build unused for 31 days, one used yesterday, a
    # killed build's temporary file from two days ago, one from a build that may be running
    # now, and a file that is not ours: the first process compiles and removes exactly the old
    # build and the old temporary file; the second process reuses the new build and marks it
    # used; no temporary file of its own is left behind.
    code = """
        from s5jax.core import _native
        assert _native.native_available(), _native.native_build_error()
        print(_native._state["library"])
    """
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, days in [
        ("s5jax_native-0000000000000000.so", 31),
        ("s5jax_native-1111111111111111.so", 1),
        (".s5jax_native-2222222222222222.so.0123456789ab.tmp", 2),
        (".s5jax_native-3333333333333333.so.0123456789ab.tmp", 0),
        ("notes.txt", 400),
    ]:
        (cache / name).write_bytes(b"x")
        _age(cache / name, days)
    env = {**os.environ, "S5JAX_CACHE_DIR": str(cache)}
    env.pop("S5JAX_NATIVE", None)
    first = _run_python(code, env)
    assert first.returncode == 0, first.stderr
    build = Path(first.stdout.strip())
    assert build.parent == cache and build.name.startswith("s5jax_native-")
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [
            ".s5jax_native-3333333333333333.so.0123456789ab.tmp",
            "notes.txt",
            "s5jax_native-1111111111111111.so",
            build.name,
        ]
    )
    _age(build, 10)
    second = _run_python(code, env)
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout
    assert time.time() - build.stat().st_mtime < 3600  # loaded: marked used
    assert len(list(cache.iterdir())) == 4  # nothing built, nothing pruned


@needs_native
def test_a_build_pruned_just_before_its_load_is_built_again():
    # Another process's prune may remove a long-unused build between `_build`'s check and the
    # load: the load then builds it again instead of leaving the process without the kernel.
    code = """
        from s5jax.core import _native
        real, calls = _native._build, []
        def build(cxx):
            calls.append(cxx)
            path = real(cxx)
            return path.with_name("s5jax_native-removed.so") if len(calls) == 1 else path
        _native._build = build
        assert _native.native_available(), _native.native_build_error()
        print(len(calls), _native._state["library"].name)
    """
    env = {**os.environ}
    env.pop("S5JAX_NATIVE", None)
    out = _run_python(code, env)
    assert out.returncode == 0, out.stderr
    calls, name = out.stdout.split()
    assert calls == "2" and name.startswith("s5jax_native-") and name != "s5jax_native-removed.so"


def test_prune_keeps_recent_builds_the_new_one_and_other_files(tmp_path):
    now = 1_000_000_000.0
    names = {
        "s5jax_native-aaaaaaaaaaaaaaaa.so": 30.5,  # unused past the limit: removed
        "s5jax_native-bbbbbbbbbbbbbbbb.so": 29.5,  # kept
        "s5jax_native-cccccccccccccccc.so": 90,  # the new build itself (keep=): kept
        ".s5jax_native-dddddddddddddddd.so.0123456789ab.tmp": 1.5,  # removed
        ".s5jax_native-eeeeeeeeeeeeeeee.so.0123456789ab.tmp": 0.5,  # kept
        "s5jax_native-notes.txt": 90,  # not a build: kept
        "other.so": 90,  # not ours: kept
    }
    for name, days in names.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (now - days * 86_400, now - days * 86_400))
    (tmp_path / "s5jax_native-ffffffffffffffff.so").mkdir()  # not a file: kept
    removed = _native._prune(tmp_path, keep=tmp_path / "s5jax_native-cccccccccccccccc.so", now=now)
    assert sorted(p.name for p in removed) == [
        ".s5jax_native-dddddddddddddddd.so.0123456789ab.tmp",
        "s5jax_native-aaaaaaaaaaaaaaaa.so",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        set(names) - {p.name for p in removed} | {"s5jax_native-ffffffffffffffff.so"}
    )
    assert _native._prune(tmp_path / "missing", keep=tmp_path / "x.so", now=now) == []


def test_compiler_lookup_honours_cxx(monkeypatch):
    monkeypatch.setenv("CXX", "definitely-not-a-compiler-xyz")
    assert _native._compiler() == "definitely-not-a-compiler-xyz"
    monkeypatch.delenv("CXX")
    assert _native._compiler() == (
        shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    )


@needs_native
def test_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("S5JAX_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(RuntimeError, match=r"cannot write the kernel cache in .*S5JAX_CACHE_DIR"):
        _native._build(_native._compiler())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# --- the materialisation barrier (native_materialise) ---------------------------------------


@needs_native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64])
def test_native_materialise_is_the_identity_in_value_and_gradient(dtype, request):
    if dtype == jnp.float64:
        request.getfixturevalue("x64")
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 40, 7)).astype(dtype)
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 40, 7)).astype(dtype)

    def f(x):  # vmapped, and x used again after the barrier (XLA must copy, not alias)
        y = jax.vmap(_native.native_materialise)(x * 2)
        return jnp.sum((y * w).astype(jnp.float32)) + jnp.sum(x.astype(jnp.float32)), y

    (_, y), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(x)
    np.testing.assert_array_equal(np.asarray(y, np.float64), np.asarray(x * 2, np.float64))
    expected = np.asarray(w * 2, np.float64) + 1.0
    np.testing.assert_allclose(np.asarray(grad, np.float64), expected, rtol=1e-2, atol=1e-2)
    assert grad.dtype == dtype


def _materialise_model(n_layers, scan_method="auto", precision="fp32"):
    cfg = ModelConfig(
        n_layers=n_layers, d_model=16, ssm_size=8, blocks=1, bidirectional=True,
        activation="half_glu1", pooling="mean", dropout=0.0, precision=precision,
    )  # fmt: skip
    return build_model(
        cfg, d_input=3, n_outputs=4, key=jax.random.PRNGKey(0), scan_method=scan_method
    )


def _materialise_grad(model, state, x, y):
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss(p, s):
        m = eqx.combine(p, static)
        out, _ = jax.vmap(
            lambda xi: m(xi, s, inference=False), axis_name="batch", out_axes=(0, None)
        )(x)
        return nll_loss(out, y)

    step = jax.jit(jax.value_and_grad(loss))
    return (lambda: step(params, state)), (lambda: step.lower(params, state))


def _widest_loop_fusion(hlo: str) -> int:
    """The largest number of operands of any elementwise (kLoop) fusion in compiled HLO."""
    widths = [
        len(m.group(1).split(",")) for m in re.finditer(r"= \S+ fusion\((.*?)\), kind=kLoop", hlo)
    ]
    return max(widths)


@needs_native
def test_layers_materialise_their_outputs_on_the_native_path(monkeypatch):
    # With the barrier, every layer's output and its cotangent are written once (2 custom
    # calls per layer) and no fusion recomputes the residual stream: the widest elementwise
    # fusion of the gradient step does not grow with depth. Values and gradients are those
    # of the same model without it; the sequential scan's path (export) and bf16 have none.
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 64, 3))
    y = jnp.asarray([0, 3, 1, 2])
    widest = {}
    for n_layers in (4, 8):
        model, state = _materialise_model(n_layers)
        results = {}
        for flag in (True, False):
            monkeypatch.setattr(_layers, "MATERIALISE_OUTPUT", flag)
            run, lower = _materialise_grad(model, state, x, y)
            hlo = lower().compile().as_text()
            assert hlo.count('custom_call_target="s5jax_materialise"') == (
                2 * n_layers if flag else 0
            )
            if flag:
                widest[n_layers] = _widest_loop_fusion(hlo)
            results[flag] = run()
        (v1, g1), (v0, g0) = results[True], results[False]
        np.testing.assert_allclose(v1, v0, rtol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    assert widest[8] == widest[4] <= 16, widest

    monkeypatch.setattr(_layers, "MATERIALISE_OUTPUT", True)
    for kwargs in ({"scan_method": "sequential"}, {"precision": "bf16"}):
        model, state = _materialise_model(2, **kwargs)
        _, lower = _materialise_grad(model, state, x, y)
        assert "s5jax_materialise" not in lower().compile().as_text(), kwargs
