"""The chunked scan on real planes (`_scan.chunked_planes`, used by `apply_ssm(method="chunked")`
for a time-invariant Λ̄ without resets, from `PLANES_MIN_P` states up) against the scan on
complex arrays.

Two views that must agree: the planes path (its own VJP, real arithmetic) and the sequential
scan on complex arrays differentiated by JAX, in float64, values and gradients with respect to
every input.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import core
from s5jax.core import _scan, _ssm
from s5jax.nn import S5SSM


def _close(a, b, tol=1e-11):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def _complex(key, shape):
    re, im = jax.random.normal(key, (2, *shape), jnp.float64)
    return jax.lax.complex(re, im)


@pytest.mark.parametrize(("reverse", "L"), list(itertools.product([False, True], [1, 2, 17])))
def test_planes_scan_equals_the_complex_scan_with_gradients(x64, getkey, reverse, L):
    P = 5
    a = jnp.exp(jax.lax.complex(-jax.random.uniform(getkey(), (P,), jnp.float64, 0.01, 0.5),
                                jax.random.normal(getkey(), (P,), jnp.float64)))  # fmt: skip
    b = _complex(getkey(), (3, L, P))  # a batch of 3 under jax.vmap
    w = _complex(getkey(), (3, L, P))

    def loss_planes(a, b):
        def one(bb):
            x_re, x_im = _scan.chunked_planes(a.real, a.imag, bb.real, bb.imag, reverse)
            return jax.lax.complex(x_re, x_im)

        xs = jax.vmap(one)(b)
        return jnp.sum(jnp.real(xs * w)) + jnp.sum(jnp.imag(xs) ** 2)

    def loss_complex(a, b):
        xs = jax.vmap(
            lambda bb: core.linear_recurrence(a, bb, reverse=reverse, method="sequential")[0]
        )(b)
        return jnp.sum(jnp.real(xs * w)) + jnp.sum(jnp.imag(xs) ** 2)

    _close(loss_planes(a, b), loss_complex(a, b))
    grads = [jax.grad(f, argnums=(0, 1))(a, b) for f in (loss_planes, loss_complex)]
    _close(grads[0], grads[1])


def _system(key, conj_sym, bidirectional, dtype=jnp.float64):
    layer = S5SSM(
        3, 8, J=2 if conj_sym else 1, conj_sym=conj_sym, bidirectional=bidirectional,
        lambda_init="hippo" if conj_sym else "s4d_lin", dt_min=0.01, dt_max=0.5, dtype=dtype,
        key=key,
    )  # fmt: skip
    Lambda_bar, B_bar = layer.discretized()
    return Lambda_bar, B_bar, layer.C_tilde(), layer.D


CASES = [
    (conj_sym, bidir, with_x0, return_state)
    for conj_sym, bidir, with_x0, return_state in itertools.product([True, False], repeat=4)
    if not (bidir and with_x0)  # an initial state is for unidirectional systems only
]


@pytest.mark.parametrize(("conj_sym", "bidir", "with_x0", "return_state"), CASES)
def test_apply_ssm_chunked_equals_sequential(
    x64, monkeypatch, getkey, conj_sym, bidir, with_x0, return_state
):
    Lambda_bar, B_bar, C, D = _system(getkey(), conj_sym, bidir)
    P = Lambda_bar.shape[0]
    u = jax.random.normal(getkey(), (2, 13, 3), jnp.float64)
    w = jax.random.normal(getkey(), (2, 13, 3), jnp.float64)
    x0 = _complex(getkey(), (P,)) if with_x0 else None
    monkeypatch.setattr(_ssm, "PLANES_MIN_P", P)
    calls = []
    planes = _ssm._ssm_planes
    monkeypatch.setattr(_ssm, "_ssm_planes", lambda *a, **k: calls.append(1) or planes(*a, **k))

    def loss(method, Lambda_bar, B_bar, C, D, u, x0):
        def one(v):
            return core.apply_ssm(
                Lambda_bar, B_bar, C, D, v, conj_sym=conj_sym, bidirectional=bidir,
                initial_state=x0, method=method, return_state=return_state,
            )  # fmt: skip

        out = jax.vmap(one)(u)
        y, final = out if return_state else (out, None)
        total = jnp.sum(y * w)
        if final is not None:
            total = total + jnp.sum(jnp.abs(final) ** 2)
        return total, out

    argnums = (1, 2, 3, 4, 5, 6) if with_x0 else (1, 2, 3, 4, 5)
    got = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(
        "chunked", Lambda_bar, B_bar, C, D, u, x0
    )
    assert calls, "the planes path did not run"
    want = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(
        "sequential", Lambda_bar, B_bar, C, D, u, x0
    )
    _close(got, want)


def test_bf16_products_match_the_complex_path(monkeypatch, getkey):
    # The same casts on both paths: bfloat16 operands, float32 accumulation, float32 states.
    monkeypatch.setattr(_ssm, "PLANES_MIN_P", 1)
    Lambda_bar, B_bar, C, D = _system(getkey(), True, True, dtype=jnp.float32)
    u = jax.random.normal(getkey(), (64, 3), jnp.float32)

    def run(method):
        return _ssm._apply(
            Lambda_bar, B_bar, C, D, u, bidirectional=True, method=method,
            matmul_dtype=jnp.bfloat16,
        )  # fmt: skip

    np.testing.assert_allclose(run("chunked"), run("sequential"), rtol=2e-5, atol=2e-5)


def test_resets_long_sequences_and_small_p_take_the_complex_path(x64, monkeypatch, getkey):
    Lambda_bar, B_bar, C, D = _system(getkey(), True, True)
    P = Lambda_bar.shape[0]
    monkeypatch.setattr(_ssm, "PLANES_MIN_P", P)
    u = jax.random.normal(getkey(), (12, 3), jnp.float64)
    resets = jnp.zeros(12, bool).at[5].set(True)
    calls = []
    planes = _ssm._ssm_planes
    monkeypatch.setattr(_ssm, "_ssm_planes", lambda *a, **k: calls.append(1) or planes(*a, **k))
    want = core.apply_ssm(Lambda_bar, B_bar, C, D, u, bidirectional=True, method="sequential")
    want_r = core.apply_ssm(
        Lambda_bar, B_bar, C, D, u, bidirectional=True, resets=resets, method="sequential"
    )
    got_r = core.apply_ssm(
        Lambda_bar, B_bar, C, D, u, bidirectional=True, resets=resets, method="chunked"
    )
    assert not calls
    _close(got_r, want_r)
    monkeypatch.setattr(_ssm, "CHUNK_SIZE", 11)  # L = 12 spans two chunks: the complex kernel
    _close(core.apply_ssm(Lambda_bar, B_bar, C, D, u, bidirectional=True, method="chunked"), want)
    assert not calls
    monkeypatch.setattr(_ssm, "CHUNK_SIZE", 12)
    _close(core.apply_ssm(Lambda_bar, B_bar, C, D, u, bidirectional=True, method="chunked"), want)
    assert calls
    calls.clear()
    monkeypatch.setattr(_ssm, "PLANES_MIN_P", P + 1)
    _close(core.apply_ssm(Lambda_bar, B_bar, C, D, u, bidirectional=True, method="chunked"), want)
    assert not calls
