"""The native planar scan and its two bfloat16 products as one custom VJP.

Under bfloat16 products (`model.precision = "bf16"`) the SSM of `_ssm._apply_planar` is
y = [x₁ … x_L] C, x the planar states of the recurrence over B̄u = u B (`_native`), each
product taking bfloat16 operands and summing in float32 (`_products.matmul`). Built from those
pieces, two passes do nothing but round: the float32 states are read again to make the
bfloat16 operand of the product with C (forward), and the float32 b̄ the scan's adjoint writes
is read again to make the bfloat16 cotangent both of B's gradient products take (backward).
Each piece must keep its own dtypes at its boundary (a custom VJP's cotangent has its
primal's dtype), so the rounding cannot move into the kernels while they stay separate.

Here the three are one function with one VJP. The scan's kernel writes the states twice,
float32 (kept for ā) and rounded to bfloat16 (the product's operand), and its adjoint writes
b̄ rounded to bfloat16 only (`_native.planar_states_mixed`, `_native.planar_adjoint`). The
values are the ones the separate pieces give: the same products on the same operands, the
kernels rounding as `astype(jnp.bfloat16)` does (ties to even; tests check the bits).

Under `jax.vmap` over the model's batch (the weights not batched) the whole batch runs as one
call of each kernel and product, and the weights' gradients are one sum over every example's
rows (`_products.whole_batch_weight_gradient`), as `_products.matmul` does for each product
alone.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from . import _native, _products

NATIVE_PLANAR_MIXED = True
"""Whether bfloat16 products around the native planar scan (`_ssm._apply_planar`) run as this
module's one custom VJP (True) or as the separate product, scan, product (False: the behaviour
before 2026-12-02, for benchmarks). Read when a function is traced."""

_NARROW = jnp.bfloat16


def applies(matmul_dtype, dtype) -> bool:
    """Whether `_apply_planar` with products in `matmul_dtype` on a system of real dtype `dtype`
    runs through `planar_ssm`: bfloat16 operands and float32 sums, `NATIVE_PLANAR_MIXED`, and
    `_products` on its default gradients with the native whole-batch weight gradient (one CPU
    device, the native library built)."""
    if matmul_dtype is None or jnp.dtype(matmul_dtype) != _NARROW or dtype != jnp.float32:
        return False
    probe = jax.ShapeDtypeStruct((1, 1), _NARROW)
    return (
        NATIVE_PLANAR_MIXED
        and _products.VMAP_FRIENDLY_GRADIENT
        and _products.BATCH_LEVEL_GRADIENT
        and _products.MASTER_WEIGHT_GRADIENT
        and _products._native_weight_gradient(probe, probe, jnp.float32)
    )


def planar_ssm(u, W_in, a, W_out, bidirectional: bool):
    """[the planar states of (u W_in)] W_out for one sequence `u` (L, H) (float32 or
    bfloat16): `W_in` (H, 2P) float32, `a` (2P,) float32 [Re Λ̄ | Im Λ̄], `W_out` (2DP, H)
    float32; both products in bfloat16, summed in float32. Returns float32 (L, H). Check
    `applies` first."""
    statics = (bool(bidirectional), jnp.dtype(u.dtype))
    if _products.BATCH_LEVEL_GRADIENT and _products._vmapped_here(u, W_in):
        return _vmappable(*statics)(u, W_in, a, W_out)
    return _one(u, W_in, a, W_out, *statics)


def _one(u, W_in, a, W_out, bidirectional, u_dtype):
    return _ssm(u[None], W_in, a, W_out, bidirectional, u_dtype)[0]


@functools.cache
def _vmappable(bidirectional, u_dtype):
    """`planar_ssm` with a batching rule: the sequences batched and nothing else, the whole
    batch's `_ssm`; otherwise the vmap of one sequence's."""

    @custom_vmap
    def ssm(u, W_in, a, W_out):
        return _one(u, W_in, a, W_out, bidirectional, u_dtype)

    @ssm.def_vmap
    def _batched(n, in_batched, u, W_in, a, W_out):
        if tuple(in_batched) == (True, False, False, False):
            return _ssm(u, W_in, a, W_out, bidirectional, u_dtype), True
        axes = tuple(0 if b else None for b in in_batched)
        one = functools.partial(_one, bidirectional=bidirectional, u_dtype=u_dtype)
        return jax.vmap(one, in_axes=axes, axis_size=n)(u, W_in, a, W_out), True

    return ssm


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ssm(U, W_in, a, W_out, bidirectional, u_dtype):
    """The batch `U` (n, L, H) with one set of weights: Y (n, L, H) float32."""
    return _ssm_fwd(U, W_in, a, W_out, bidirectional, u_dtype)[0]


def _ssm_fwd(U, W_in, a, W_out, bidirectional, u_dtype):
    U, W_in, W_out = U.astype(_NARROW), W_in.astype(_NARROW), W_out.astype(_NARROW)
    Bu = jnp.matmul(U, W_in, preferred_element_type=jnp.float32)
    X, X16 = _native.planar_states_mixed(_per_sequence(a, U), Bu, bidirectional)
    Y = jnp.matmul(X16, W_out, preferred_element_type=jnp.float32)
    return Y, (U, W_in, a, X, X16, W_out)


def _ssm_bwd(bidirectional, u_dtype, residuals, dY):
    U, W_in, a, X, X16, W_out = residuals  # U and the weights as multiplied (bfloat16)
    dY = dY.astype(_NARROW)
    dX = _products._input_gradient(dY, W_out, jnp.float32)
    dW_out = _products.whole_batch_weight_gradient(X16, dY, jnp.float32)
    b_bar, a_bar = _native.planar_adjoint(_per_sequence(a, U), dX, X, bidirectional, _NARROW)
    dU = _products._input_gradient(b_bar, W_in, jnp.float32).astype(u_dtype)
    dW_in = _products.whole_batch_weight_gradient(U, b_bar, jnp.float32)
    return dU, dW_in, jnp.sum(a_bar, axis=0), dW_out


_ssm.defvjp(_ssm_fwd, _ssm_bwd)


def _per_sequence(a, U):
    return jnp.broadcast_to(a, (U.shape[0], a.shape[-1]))
