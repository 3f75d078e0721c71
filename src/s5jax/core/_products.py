"""`matmul`: a 2-D matrix product whose gradient stays cheap when the model is vmapped.

Every model in this package handles one example and is `jax.vmap`-ed over the batch
(`s5jax.train`), so a weight product `x @ W` runs with a batched `x` and an unbatched `W`. The
gradient JAX derives for that batched product contracts over (batch, rows) at once, and XLA's
CPU backend lays that contraction out with a transposed copy of the whole (batch·rows, N)
cotangent. `matmul` has the same value and the same gradient formulas (its backward pass is
`jax.vjp` of the plain product), but as a custom VJP its backward pass is batched as a whole:
under `vmap` the weight gradient becomes one product per example followed by a sum over the
batch, and the copy disappears. It is used for the SSM's products B̄u and C̃x
(`s5jax.core._ssm`), every `Dense` and the pendulum CNN's convolutions.

Measured on a 2-core Intel Xeon, whole training steps with these products against the same
steps with plain `@` products, interleaved in one process (`benchmarks/products.py`; the
figures, host and command are in `benchmarks/README.md`): 1.05× to 1.47× faster.

Forward mode: a custom VJP has no `jax.jvp`. `VMAP_FRIENDLY_GRADIENT = False` (read when a
function is traced) makes `matmul` the plain product, so that `jax.jvp`, `jax.jacfwd` and
`jax.hessian` work through the model again (with a scan method that supports them, e.g.
`"sequential"`; the chunked and fused scans have custom VJPs of their own).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["matmul"]


VMAP_FRIENDLY_GRADIENT = True
"""Whether `matmul` uses its custom VJP (see the module docstring); False gives the plain
product, which supports forward-mode autodiff."""


def matmul(
    a: Float[Array, "M K"], b: Float[Array, "K N"], preferred_element_type=None
) -> Float[Array, "M N"]:
    """`jnp.matmul(a, b, preferred_element_type=...)` for 2-D `a` and `b`, with the
    vmap-friendly reverse-mode gradient described in the module docstring.

    **Arguments:** `a` (M, K), `b` (K, N); `preferred_element_type`: the accumulation and
    output dtype (e.g. float32 for bfloat16 operands), or None for the operands' dtype.

    **Returns:** (M, N).
    """
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul takes 2-D operands, got shapes {a.shape} and {b.shape}")
    if not VMAP_FRIENDLY_GRADIENT:
        return _product(a, b, preferred_element_type)
    return _matmul(a, b, preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(a, b, preferred_element_type):
    return _product(a, b, preferred_element_type)


def _product(a, b, preferred_element_type):
    return jnp.matmul(a, b, preferred_element_type=preferred_element_type)


def _matmul_fwd(a, b, preferred_element_type):
    return _product(a, b, preferred_element_type), (a, b)


def _matmul_bwd(preferred_element_type, residuals, g):
    a, b = residuals
    _, vjp = jax.vjp(lambda a, b: _product(a, b, preferred_element_type), a, b)
    return vjp(g)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
