"""The native planar scan with its bfloat16 products as one custom VJP (`s5jax.core._mixed`):
the kernels' bfloat16 outputs against XLA's own convert, and the whole function against the
separate product, scan and product it replaces."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.core import _mixed, _native, _ssm

from .test_remat import _grad_step
from .test_scan_native import needs_native

BF16 = jnp.bfloat16


def _bits(x):
    return np.asarray(x).view(np.uint16)


def _awkward_float32(rng, shape):
    """Normal values, and values that test the rounding: ties (odd and even), values just off
    a tie, subnormals, the largest finite float32 (rounds to inf), signed zeros. (The kernels'
    arithmetic may flush subnormals to zero, as XLA's threads set FTZ/DAZ; what they write is
    still rounded as XLA's convert would round it.)"""
    x = rng.normal(size=shape).astype(np.float32).view(np.uint32)
    special = np.array(
        [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x00000001, 0x00008000, 0x807FFFFF,
         0x7F7FFFFF, 0xFF7FFFFF, 0x00000000, 0x80000000, 0x3F800000],
        np.uint32,
    )  # fmt: skip
    flat = x.reshape(-1)
    flat[: special.size * 7 : 7] = special[: len(flat[: special.size * 7 : 7])]
    return flat.view(np.float32).reshape(shape)


@needs_native
@pytest.mark.parametrize("bidirectional", [False, True])
def test_kernels_round_to_bfloat16_as_xla_s_convert_does(bidirectional):
    # With a = 0 every state is its own b_k and every λ_k its g_k, so the kernels' bfloat16
    # outputs must carry exactly the bits of XLA's convert of those float32 values.
    rng = np.random.default_rng(3)
    n, L, P = 2, 19, 24
    D = 2 if bidirectional else 1
    a = jnp.zeros((n, 2 * P), jnp.float32)
    b = jnp.asarray(_awkward_float32(rng, (n, L, 2 * P)))
    x, x16 = jax.jit(_native.planar_states_mixed, static_argnums=2)(a, b, bidirectional)
    assert x16.dtype == BF16 and x16.shape == x.shape == (n, L, 2 * D * P)
    np.testing.assert_array_equal(_bits(x16), _bits(x.astype(BF16)))
    np.testing.assert_array_equal(np.asarray(x)[..., :P], np.asarray(b)[..., :P])  # Re x→ = Re b

    g = jnp.asarray(_awkward_float32(rng, (n, L, 2 * D * P)))
    adjoint = jax.jit(_native.planar_adjoint, static_argnums=(3, 4))
    b16, a16 = adjoint(a, g, x, bidirectional, BF16)
    b32, a32 = adjoint(a, g, x, bidirectional, None)
    assert b16.dtype == BF16 and b32.dtype == jnp.float32
    np.testing.assert_array_equal(_bits(b16), _bits(b32.astype(BF16)))
    np.testing.assert_array_equal(np.asarray(a16), np.asarray(a32))
    if not bidirectional:  # λ = g (where g is normal: XLA's threads may flush subnormals)
        g = np.asarray(g)
        normal = np.abs(g) >= np.finfo(np.float32).tiny
        np.testing.assert_array_equal(np.asarray(b32)[normal], g[normal])


@needs_native
def test_kernels_keep_nan_and_infinity_through_the_rounding():
    # One step (L 1), so a NaN or an infinity reaches no other step.
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0, 3.0e38], np.float32)
    b = jnp.asarray(np.tile(specials, 16)[None, None, :32])  # (1, 1, 2P), P 16
    a = jnp.zeros((1, 32), jnp.float32)
    x, x16 = _native.planar_states_mixed(a, b, False)
    np.testing.assert_array_equal(_bits(x16), _bits(x.astype(BF16)))
    assert np.isnan(np.asarray(x16, np.float32)[0, 0, :2]).all()
    b16, _ = _native.planar_adjoint(a, b, x, False, BF16)
    np.testing.assert_array_equal(_bits(b16), _bits(b.astype(BF16)))


@needs_native
@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_bfloat16_outputs_equal_the_float32_ones_rounded_over_threads_and_streaming(
    monkeypatch, threads, bidirectional
):
    # Decaying lanes, one sequence split into lane blocks (P 40) and two sequences whose
    # bfloat16 outputs are over the 16 MiB streaming threshold (2 × 2048 × 2·2·528 × 2 bytes).
    monkeypatch.setenv("S5JAX_NATIVE_THREADS", threads)
    rng = np.random.default_rng(4)
    for n, L, P in ((1, 300, 40), (2, 2048, 528)):
        D = 2 if bidirectional else 1
        lam = 0.999 * np.exp(1j * rng.uniform(-np.pi, np.pi, (n, P)))
        a = jnp.asarray(np.concatenate([lam.real, lam.imag], axis=1), jnp.float32)
        b = jnp.asarray(rng.normal(size=(n, L, 2 * P)), jnp.float32)
        g = jnp.asarray(rng.normal(size=(n, L, 2 * D * P)), jnp.float32)
        x, x16 = _native.planar_states_mixed(a, b, bidirectional)
        x32 = _native._planar_forward(a, b, bidirectional)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(x32))
        np.testing.assert_array_equal(_bits(x16), _bits(x32.astype(BF16)))
        b16, a16 = _native.planar_adjoint(a, g, x, bidirectional, BF16)
        b32, a32 = _native.planar_adjoint(a, g, x, bidirectional)
        np.testing.assert_array_equal(_bits(b16), _bits(b32.astype(BF16)))
        np.testing.assert_array_equal(np.asarray(a16), np.asarray(a32))


def _system(rng, P, H, bidirectional):
    lam = 0.98 * np.exp(1j * rng.uniform(-1.0, 1.0, P))
    B = (rng.normal(size=(P, H)) + 1j * rng.normal(size=(P, H))) / np.sqrt(H)
    nP = P * (2 if bidirectional else 1)
    C = (rng.normal(size=(H, nP)) + 1j * rng.normal(size=(H, nP))) / np.sqrt(nP)
    return (
        jnp.asarray(lam, jnp.complex64),
        jnp.asarray(B, jnp.complex64),
        jnp.asarray(C, jnp.complex64),
        jnp.asarray(rng.normal(size=H), jnp.float32),
    )


def _with_flag(monkeypatch, on, fn):
    monkeypatch.setattr(_mixed, "NATIVE_PLANAR_MIXED", on)
    return jax.tree.map(np.asarray, fn())


@needs_native
@pytest.mark.parametrize("u_dtype", [jnp.float32, BF16])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_one_vjp_equals_the_separate_products_and_scan(monkeypatch, bidirectional, u_dtype):
    # The model's batch (vmap inside grad): the same values and gradients, bit for bit, as the
    # product, the planar scan and the product with their own VJPs; and the mixed kernel in
    # the program only with the switch on.
    rng = np.random.default_rng(5)
    P, H, L, n = 24, 16, 53, 3
    lam, B, C, D = _system(rng, P, H, bidirectional)
    u = jnp.asarray(rng.normal(size=(n, L, H)), u_dtype)
    w = jnp.asarray(rng.normal(size=(n, L, H)), jnp.float32)

    def loss(lam, B, C, D, u):
        def one(x):
            return _ssm._apply(lam, B, C, D, x, bidirectional=bidirectional, method="native",
                               matmul_dtype=BF16)  # fmt: skip

        y = jax.vmap(one)(u)
        return jnp.sum(y * w), y

    def grad():  # a new jitted function each time: the switch is read when tracing
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))

    assert _mixed.applies(BF16, jnp.float32)
    got = _with_flag(monkeypatch, True, lambda: grad()(lam, B, C, D, u))
    want = _with_flag(monkeypatch, False, lambda: grad()(lam, B, C, D, u))
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
    assert got[0][4].dtype == u_dtype
    for on in (True, False):
        monkeypatch.setattr(_mixed, "NATIVE_PLANAR_MIXED", on)
        text = grad().lower(lam, B, C, D, u).as_text()
        assert ("s5jax_planar_mixed" in text) == on


@needs_native
def test_one_sequence_and_per_example_gradients_equal_the_separate_pieces(monkeypatch):
    # Without vmap (one sequence) and under vmap(grad) (each example's own gradient: the
    # weights' gradients must not be summed over the batch).
    rng = np.random.default_rng(6)
    P, H, L, n = 16, 8, 29, 2
    lam, B, C, D = _system(rng, P, H, True)
    u = jnp.asarray(rng.normal(size=(n, L, H)), jnp.float32)

    def loss(B, C, x):
        y = _ssm._apply(lam, B, C, D, x, bidirectional=True, method="native", matmul_dtype=BF16)
        return jnp.sum(jnp.sin(y))

    def one():  # new jitted functions each time: the switch is read when tracing
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(B, C, u[0])

    def per_example():
        grad = jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, None, 0))
        return jax.jit(grad)(B, C, u)

    for fn in (one, per_example):
        got = _with_flag(monkeypatch, True, fn)
        want = _with_flag(monkeypatch, False, fn)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6 * np.max(np.abs(e)))
    assert _with_flag(monkeypatch, True, per_example)[0].shape == (n, P, H)


def test_applies_only_to_bfloat16_products_on_float32_systems(monkeypatch):
    assert not _mixed.applies(None, jnp.float32)
    assert not _mixed.applies(jnp.float16, jnp.float32)
    assert not _mixed.applies(BF16, jnp.float64)
    monkeypatch.setattr(_mixed, "NATIVE_PLANAR_MIXED", False)
    assert not _mixed.applies(BF16, jnp.float32)


@needs_native
@pytest.mark.parametrize("remat", ["none", "layers", "ssm"])
def test_a_bf16_model_trains_the_same_with_one_vjp(monkeypatch, remat):
    # The whole model under bf16 products (its batch under a named vmap, BatchNorm, dropout),
    # with each rematerialisation: loss, gradients and BatchNorm state as with the separate
    # pieces, and the mixed kernel in the step.
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 40, 3))
    y = jnp.asarray([0, 3, 1])
    key = jax.random.PRNGKey(2)

    def step():  # traced anew each time: the switch is read when tracing
        fn, params, state = _grad_step(
            remat, "native", d_model=16, ssm_size=32, precision="bf16"
        )  # stored P 16: the planar path
        text = fn.lower(params, state, x, y, key).as_text()
        return fn(params, state, x, y, key), "s5jax_planar_mixed" in text

    monkeypatch.setattr(_mixed, "NATIVE_PLANAR_MIXED", True)
    got, mixed_on = step()
    monkeypatch.setattr(_mixed, "NATIVE_PLANAR_MIXED", False)
    want, mixed_off = step()
    assert mixed_on and not mixed_off
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
