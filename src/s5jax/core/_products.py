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

Mixed precision (bfloat16 operands with float32 accumulation, `model.precision = "bf16"`):
JAX's own backward pass of such a product multiplies the float32 cotangent by the bfloat16
operand, so both gradient products run in float32, and XLA's CPU backend computes the weight
gradient (a contraction over the rows, the long axis) through a float32 copy of both operands
whatever their dtype: its bfloat16 matrix-product kernels take a left operand only with the
contracted axis innermost, and the rows of `x` are its outer axis.
`matmul`'s backward pass instead rounds the cotangent to the operands' dtype (as mixed-precision
training does: bfloat16 gradient products, float32 accumulation) and hands the kernel a
row-major copy of the transposed input (`_rows_to_columns`), so all three products of a step
run in bfloat16. On a 2-core Intel Xeon with AMX-BF16 (2026-11-27, `benchmarks/README.md`)
one product's forward and backward pass under `vmap` became 1.5–1.9× faster than with JAX's
gradient (1.8–2.0× faster than float32), and whole bfloat16 training steps with the chunked
scan 1.32–1.49× faster (Text 1,072 → 760 ms, Image 776 → 522 ms). `REDUCED_PRECISION_GRADIENT
= False` gives JAX's float32 gradient products back.

Master weights: `matmul(x, W, float32, operand_dtype=bfloat16)` casts inside the product (as
`Dense` and the SSM's products call it), so the float32 weight's gradient is the float32
accumulator of its bfloat16 gradient product, and the batch's sum of those runs in float32.
A cast outside (`matmul(x.astype(bf16), W.astype(bf16), float32)`, as before 2026-11-27)
makes the cast's cotangent bfloat16: every example's weight gradient is rounded to bfloat16
before the batch's sum (the compiled sMNIST step holds the `convert` pair after each
per-example product). Alone, (6, 40, 32) @ (32, 24) under `vmap`, the weight gradient then
differed from the float64 sum of the same bfloat16 products by 1.7e-3 in norm (3.8e-3 at
worst: bfloat16's rounding, ≤ 2⁻⁸), against 6e-8 with the cast inside (`tests/test_products.py`);
in a whole bf16 model the activations' own rounding dominates the gradient's error against
float32 (`benchmarks/README.md`). `MASTER_WEIGHT_GRADIENT = False` restores the cast outside.

`scale_columns(x, d)`, the SSM's feed-through D ⊙ u (`s5jax.core._ssm`), is the same idea for
a per-channel scale: the gradient JAX derives for `d` multiplies the cotangent by `x` and sums
over the rows, and under `vmap` that is a reduction of a (batch, rows, N) product over its
middle axis, which XLA's CPU backend (its YNNPACK fusions, jax 0.10.2) runs at about 11 ns an
element when the batch is 1: 5.4 ms for (1, 4096, 128), 36.7 ms for (1, 16384, 128), against
0.08 and 0.24 ms as a contraction over the rows (`dot_general`), which is what `scale_columns`'
backward pass computes; at batch 2 to 50 the two are within noise of each other (AMD EPYC,
2026-11-29, a `/tmp` script timing the vmapped gradient of each form alone). The authors' model
hits it at every batch-1 step: Path-X and Speech at the CPU benchmark shapes, six layers each.
On one CPU device with the native library that contraction is `native_column_dot`
(`NATIVE_COLUMN_DOT`, since 2026-12-03), which reads x as it is stored: under bfloat16
products the layer's input u is bfloat16, and XLA's product took a float32 copy of it, written
in the forward pass and kept until the backward pass. The same kernel, with a shift, computes
BatchNorm's Σ_t ∂y ⊙ (x − mean) (`s5jax.nn._norm`), for which XLA wrote x − mean in the forward
pass and kept it. With both, the compiled training steps need less scratch memory (XLA's
`memory_analysis()`; Zen 4 EPYC, CPU shapes, `benchmarks/products.py --switch
native-column-dot --precision bf16|fp32 --memory --out products-native-column-dot-bn-…`): bf16
9–22 % less (psMNIST 709.5 → 575.6 MiB, Text 996.0 → 820.1, Image 487.1 → 399.1, ListOps 540.5
→ 420.5), float32 6–11 % less (psMNIST 652.1 → 594.8, Text 869.1 → 797.1, ListOps 504.4 →
448.4); Pendulum (LayerNorm, batch 32 × 50 steps) unchanged. Whole steps within those runs'
noise (XLA / native 0.95–1.09); ∂D alone 1.1–1.4× faster (vmapped, with ∂x: (50, 784, 128)
bfloat16 2.25 → 1.56 ms, float32 3.99 → 3.46; a `/tmp` script, 20 interleaved calls).

The batch's sum of the per-example weight gradients: JAX batches a custom VJP by running its
backward pass per example and summing the (batch, K, N) stack with one `reduce_sum`, which
XLA's CPU backend ran at 4.16 ms for a (4, 768, 512) float32 stack (85 ms of kernel time in
Image's float32 step). Where the innermost transformation is the batch's `vmap`
(`_vmapped_here`), `matmul` goes through a `custom_vmap` rule to `_batch_matmul`, a custom VJP
over the whole batch with the same per-example gradients, summed pairwise on one CPU device
(`_sum_over_batch`: 0.14 ms there). Training steps alone, old / new (2-core AMD EPYC,
2026-11-29, alternating processes): Image float32 461 / 404 and 501 / 404 ms, sCIFAR 230 /
209. Under `vmap(grad(...))`, `jax.checkpoint` or a scan body the trace is not that `vmap`
and the per-example product runs (correct; JAX's sum). `BATCH_LEVEL_GRADIENT = False` turns
it off.

The batch-level mixed-precision weight gradient with the native library on one CPU device
(`NATIVE_WEIGHT_GRADIENT`): Σ_b a_bᵀ g_b as one product over batch × rows, (a as (n·M, K))ᵀ
(g as (n·M, N)), whose left operand is a row-major transposed copy made by
`s5jax.core._native.native_transpose` (SSE2 8 × 8 blocks in 32 × 32 tiles over XLA's thread
pool: 0.60 ms for a bfloat16 (39,200, 128) array; XLA itself either folds the transpose into
the product, which then runs through float32 copies, or fuses it into a loop that took 2 ms).
One long product beats the batched per-example ones where the examples are many: the pair
(50, 784, 128) × (50, 784, 128) took 3.30 ms against 3.4–3.8 ms per example, (8, 2,048, 128) ×
(…, 16) 0.42 against 0.63, (4, 1,024, 512) × (…, 384) 1.88 against 2.04 (AMD EPYC, 2026-11-29,
a `/tmp` script, 30 calls each). Whole bf16 steps, off / on in alternating processes (ms):
ListOps 112.2 / 103.6 and 107.6 / 103.7, sMNIST 172.6 / 161.3 and 165.5 / 161.9, psMNIST
206.7 / 204.1 and 213.6 / 210.9, Image 252.8 / 238.5, Speech 59.3 / 58.7.

The float32 weight gradient with the native library (`NATIVE_FLOAT32_WEIGHT_GRADIENT`): Σ_r a[r]ᵀ
g[r] over all of a batch's rows as one `s5jax.core._native.native_weight_gradient` call (chunks of
128 rows packed into panels, 6 × 16 tiles accumulated in AVX2 registers, or 12 × 32 in AVX-512 ones
where the host has them, blocks of rows split over XLA's threads and summed in block order). XLA's
CPU backend runs a product contracted over the outer axis of both operands well below its forward
products: 55–65 GFLOP/s for the C̃ gradient of the retrieval model's layer, (16,000, 512)ᵀ ·
(16,000, 128), against 95–125 GFLOP/s for a forward product of that size; under two nested `vmap`s
(the retrieval model's two documents) the per-example products became Eigen dots with two batch
axes, whose tasks also held XLA's second thread while a YNNPACK product waited for it. Alone (2-core
AMD EPYC, AVX2 and FMA only, 2026-12-01, a `/tmp` script, 15 calls each in three rounds),
per-example products and their pairwise sum / the native call, ms: (4, 4,000, 512) × (…, 128) 32.7 /
20.5, (4, 4,000, 128) × (…, 256) 12.7 / 11.5, (4, 4,096, 384) × (…, 128) 20.8 / 16.6, (8, 4,096,
128) × (…, 256) 22.1 / 20.8, (4, 1,024, 512) × (…, 768) 32.4 / 28.8, (50, 784, 128) × (…, 256) 33.3
/ 25.7. The retrieval model's float32 training step (batch 2, L 4,000), off / on in alternating
processes, medians of 6 steps: 1,027 / 872 and 1,122 / 903 ms; Text's (batch 4, L 4,096) within
noise (1,608 / 1,678, 1,818 / 1,807). On a host with AVX-512 the build accumulates 12 × 32 tiles in
24 AVX-512 registers instead: on a 2-core AMD EPYC with AVX-512 (family 26, 2026-12-02) the AVX2
tile ran at 150–190 GFLOP/s, below XLA's 150–280 there, and the AVX-512 tile at 200–370 (the same
shapes, a `/tmp` script, 15 calls each in three rounds, ms, XLA's per-example products and their sum
/ the native call, two runs: (4, 4,000, 512) × (…, 128) 13.4 / 8.8 and 20.4 / 10.5, (4, 4,000, 128)
× (…, 256) 4.9 / 4.9 and 7.0 / 5.2, (4, 4,096, 384) × (…, 128) 7.7 / 6.4 and 7.5 / 6.0, (8, 4,096,
128) × (…, 256) 8.0 / 7.1 and 8.8 / 7.9, (4, 1,024, 512) × (…, 768) 10.1 / 8.9 and 10.5 / 8.8, (50,
784, 128) × (…, 256) 13.2 / 10.5 and 12.6 / 10.1). Whole float32 training steps there, XLA's weight
gradients / the native kernel, interleaved in one process (`benchmarks/products.py --switch
native-float32-wg --repeats 5`): Retrieval 1.26, Image 1.19, ListOps 1.18, sMNIST 1.16, Pathfinder
1.14, Text 1.06; on a 2-core AMD EPYC of family 25 (Zen 4, whose AVX-512 runs as two 256-bit
halves; 2026-12-02, the same command): Retrieval 1.15, sMNIST 1.16, Pathfinder 1.13, ListOps 1.11,
Image 1.09, Text 1.02. Used on one CPU device where the native build has a vector tile
(`s5jax.core._native.native_weight_gradient_tile()`); on a 2-core Intel Xeon with AMX
(2026-12-02, the same command): ListOps 1.22, psMNIST 1.19, sMNIST 1.18, Retrieval 1.10,
Pendulum 1.10, Text, Image and Pathfinder 1.08, sCIFAR 0.99 (the products alone 1.4–1.6×
faster than XLA's, `benchmarks/weight_gradient.py`). `NATIVE_FLOAT32_WEIGHT_GRADIENT = False`
gives XLA's products back.

The bfloat16 weight gradient with the native library (`NATIVE_BF16_WEIGHT_GRADIENT`, since
2026-12-02): where the build has AVX512_BF16 and the host no AMX, the mixed-precision weight
gradient (both operands bfloat16, float32 sums) is one `native_weight_gradient` call on the
bfloat16 operands as they are stored, instead of the transposed copy above and XLA's product: the
same 12 × 32 tiles, each step two rows at once (VDPBF16PS adds both products of a pair of
bfloat16 words into a float32 lane). On the 2-core Zen 4 EPYC (`benchmarks/weight_gradient.py
--out weight-gradient-zen4-epyc`, figures in `benchmarks/README.md`) the copy and XLA's product /
the kernel took 24.1 / 14.1 ms for the layer benchmark's C̃ gradient (32,768 rows, 512 × 128),
12.3 / 7.6 for its B̃ gradient (32,768 rows, 128 × 256), 6.2 / 4.1 and 9.9 / 8.4 at 8,000 and
39,200 rows, and the kernel's sums were closer to the float64 contraction; whole bf16
training steps, the copy and XLA / the kernel, interleaved (`benchmarks/products.py --switch
native-bf16-wg --precision bf16 --repeats 5`): Text and Pathfinder 1.07, ListOps 1.05,
Retrieval and sCIFAR 1.04, Image 1.02, psMNIST 1.01, Speech 1.00, sMNIST 0.99. Not used on AMX
hosts, where XLA's bfloat16 products run on AMX tiles: on a 2-core Intel Xeon (2026-12-02,
`benchmarks/weight_gradient.py --out weight-gradient-xeon`) the copy and XLA's product took
10.2 ms for the C̃ gradient above against the kernel's 25.4, 3.1–7.4 against 7.1–15.4 at the
other three shapes.

Forward mode: a custom VJP has no `jax.jvp`. `VMAP_FRIENDLY_GRADIENT = False` (read when a
function is traced) makes `matmul` and `scale_columns` the plain products, so that `jax.jvp`,
`jax.jacfwd` and `jax.hessian` work through the model again (with a scan method that supports
them, e.g. `"sequential"`; the chunked and fused scans have custom VJPs of their own).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jaxtyping import Array, Float

from . import _native

__all__ = ["matmul", "scale_columns"]

_TRANSPOSE_RUN = 16
"""`_rows_to_columns` moves runs of up to this many rows at once (the largest divisor of the
row count up to it). On a 2-core Intel Xeon (2026-11-27, a `/tmp` script, 11 calls each) the
weight gradient of a vmapped (8, 4096, 128) @ (128, 256) bfloat16 product took 6.2 ms with
runs of 16 rows, 6.5 with 8, 9.2 with 2, 15.8 with single rows (24.8 ms as JAX derives it)."""


VMAP_FRIENDLY_GRADIENT = True
"""Whether `matmul` and `scale_columns` use their custom VJPs (see the module docstring); False
gives the plain products, which support forward-mode autodiff."""

REDUCED_PRECISION_GRADIENT = True
"""Whether `matmul`'s backward pass, for operands narrower than `preferred_element_type`
(bfloat16 with float32 accumulation), rounds the cotangent to the operands' dtype and runs
both gradient products in it (see the module docstring); False keeps JAX's float32 gradient
products. Read when a function is traced."""

BATCH_LEVEL_GRADIENT = True
"""Whether `matmul`, under a `vmap` that batches its left operand and not its weight, runs as
one product over the batch whose backward pass sums the examples' weight gradients pairwise
(`_sum_over_batch`; see the module docstring), instead of JAX's batching of the per-example
custom VJP, whose sum over the batch XLA's CPU backend runs slowly for large weights. Same
values and gradients. Read when a function is traced."""

NATIVE_WEIGHT_GRADIENT = True
"""Whether `_batch_matmul`'s backward pass, for a mixed-precision product on one CPU device
with the native library built, computes the weight gradient as one product over the whole
batch, Σ_b a_bᵀ g_b = (a as (batch·M, K))ᵀ (g as (batch·M, N)), with the transposed copy made by
`s5jax.core._native.native_transpose` (see the module docstring), instead of one product per
example and their pairwise sum. Read when a function is traced."""

NATIVE_FLOAT32_WEIGHT_GRADIENT = True
"""Whether float32 weight gradients Σ_r a[r]ᵀ g[r] (`_batch_matmul` over the whole batch's rows,
`_matmul` per example) run through `s5jax.core._native.native_weight_gradient` (packed panels,
6 × 16 AVX2 or 12 × 32 AVX-512 tiles) instead of XLA's product, on one CPU device whose native
build has a vector tile (see the module docstring for the hosts it was measured on). Read when
a function is traced."""

NATIVE_BF16_WEIGHT_GRADIENT = True
"""Whether bfloat16 weight gradients (mixed-precision products on one CPU device, reduced-precision
gradient products) run through `s5jax.core._native.native_weight_gradient`'s bfloat16 tile
(pairs of rows, AVX512_BF16 dot products, float32 sums) instead of a transposed copy of the
left operand (`native_transpose`, `_rows_to_columns`) and XLA's product, where the native build
has that tile and its host has no AMX (whose bfloat16 tiles XLA's products may use; not
measured). See the module docstring for the host it was measured on. Read when a function is
traced."""

NATIVE_COLUMN_DOT = True
"""Whether `scale_columns`' gradient for `d`, Σ_m g[m] x[m], and BatchNorm's Σ_t g (x − mean)
(`s5jax.nn._norm`) run through `s5jax.core._native.native_column_dot` (x and g read once, x
widened and shifted in registers) instead of XLA's products over the rows, on one CPU device
with the native library built (see the module docstring). Read when a function is traced."""

MASTER_WEIGHT_GRADIENT = True
"""Whether `matmul(..., operand_dtype=...)` casts inside the product, so that a float32 weight's
gradient is the float32 accumulator of its gradient product (True), or casts outside it, as
`matmul(a.astype(dt), b.astype(dt))` would, rounding the weight's gradient to `dt` for each
example before the batch's sum (False: the behaviour before 2026-11-27, for benchmarks). Read
when a function is traced."""


def matmul(
    a: Float[Array, "M K"],
    b: Float[Array, "K N"],
    preferred_element_type=None,
    *,
    operand_dtype=None,
) -> Float[Array, "M N"]:
    """`jnp.matmul(a, b, preferred_element_type=...)` for 2-D `a` and `b`, with the
    vmap-friendly reverse-mode gradient described in the module docstring.

    **Arguments:** `a` (M, K), `b` (K, N); `preferred_element_type`: the accumulation and
    output dtype (e.g. float32 for bfloat16 operands), or None for the operands' dtype;
    `operand_dtype` (keyword-only): cast both operands to this dtype inside the product (e.g.
    bfloat16 for a float32 master weight), or None to take them as they are. Each gradient
    comes back in its own input's dtype: with a float32 weight `b`, its gradient is the
    float32 accumulator of the bfloat16 gradient product, never rounded to bfloat16 (a cast
    outside the product rounds it per example, before the batch's sum; see the module
    docstring and `MASTER_WEIGHT_GRADIENT`).

    **Returns:** (M, N).
    """
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul takes 2-D operands, got shapes {a.shape} and {b.shape}")
    if operand_dtype is not None:
        operand_dtype = jnp.dtype(operand_dtype)
        if not MASTER_WEIGHT_GRADIENT:  # the cast outside the product, as before
            a, b, operand_dtype = a.astype(operand_dtype), b.astype(operand_dtype), None
    if not VMAP_FRIENDLY_GRADIENT:
        return _product(a, b, preferred_element_type, operand_dtype)
    statics = (preferred_element_type, operand_dtype, (a.dtype, b.dtype))
    if BATCH_LEVEL_GRADIENT and _vmapped_here(a, b):
        return _vmappable(*statics)(a, b)
    return _matmul(a, b, *statics)


def _vmapped_here(a, b) -> bool:
    """Whether the innermost transformation now running is a `vmap` that batches `a` and not
    `b`: then `_vmappable`'s batching rule runs before any autodiff sees the product (a
    `custom_vmap` has no reverse-mode rule of its own, and under `vmap(grad(...))` each
    example's weight gradient must stay apart). Reads JAX internals (`jax._src`); where they
    are not as expected, False (the per-example product, correct and slower on CPU)."""
    try:
        trace, batch_trace, batch_tracer = _jax_batching()
    except (ImportError, AttributeError):
        return False

    def batched(x):
        return isinstance(x, batch_tracer) and x._trace is trace and x.batch_dim is not None

    return isinstance(trace, batch_trace) and batched(a) and not batched(b)


def _jax_batching():
    """(the trace now running, JAX's batching trace class, its tracer class), from `jax._src`
    (as in jax 0.10.2); raises ImportError or AttributeError where they differ."""
    from jax._src import core
    from jax._src.interpreters import batching

    return core.trace_ctx.trace, batching.BatchTrace, batching.BatchTracer


@functools.cache
def _vmappable(preferred_element_type, operand_dtype, input_dtypes):
    """`_matmul` for these static arguments, with a batching rule (`custom_vmap`): with `a`
    batched and `b` not (the model's batch), the whole batch's product `_batch_matmul`, whose
    backward pass sums the examples' weight gradients with `_sum_over_batch`; otherwise the
    vmap of `_matmul`. Called only where `_vmapped_here` holds."""
    statics = (preferred_element_type, operand_dtype, input_dtypes)

    @custom_vmap
    def product(a, b):
        return _matmul(a, b, *statics)

    @product.def_vmap
    def _batched(n, in_batched, a, b):
        a_batched, b_batched = in_batched
        if a_batched and not b_batched:
            return _batch_matmul(a, b, *statics), True
        axes = (0 if a_batched else None, 0 if b_batched else None)
        return jax.vmap(lambda a, b: _matmul(a, b, *statics), in_axes=axes, axis_size=n)(a, b), True

    return product


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _matmul(a, b, preferred_element_type, operand_dtype, input_dtypes):
    """The product; `input_dtypes` (a's, b's), static: the dtypes its gradients return in."""
    return _product(a, b, preferred_element_type, operand_dtype)


def _product(a, b, preferred_element_type, operand_dtype=None):
    if operand_dtype is not None:
        a, b = a.astype(operand_dtype), b.astype(operand_dtype)
    return jnp.matmul(a, b, preferred_element_type=preferred_element_type)


def _matmul_fwd(a, b, preferred_element_type, operand_dtype, input_dtypes):
    if operand_dtype is not None:  # keep the cast operands (bfloat16: half a float32's bytes)
        a, b = a.astype(operand_dtype), b.astype(operand_dtype)
    return _product(a, b, preferred_element_type), (a, b)


def _mixed_precision(a, b, preferred_element_type) -> bool:
    """Whether a product is mixed precision: operands of one floating dtype narrower than the
    accumulation dtype."""
    if preferred_element_type is None or a.dtype != b.dtype:
        return False
    acc = jnp.dtype(preferred_element_type)
    return (
        jnp.issubdtype(a.dtype, jnp.floating)
        and jnp.issubdtype(acc, jnp.floating)
        and jnp.finfo(a.dtype).bits < jnp.finfo(acc).bits
    )


def _rows_to_columns(a: Float[Array, "M K"]) -> Float[Array, "K M"]:
    """aᵀ as a row-major array, from a transpose XLA cannot turn into a layout change.

    `a.T` alone becomes a column-major view of `a` when XLA assigns layouts, and a product
    with it is computed through float32 copies (see the module docstring). Moving runs of `s`
    rows through a 3-D transpose yields a real row-major copy, which the bfloat16 kernels
    take. Other backends take the transposed operand as it is (`a.T`; decided when tracing)."""
    if jax.default_backend() != "cpu":
        return a.T
    M, K = a.shape
    s = max(d for d in range(1, min(_TRANSPOSE_RUN, M) + 1) if M % d == 0)
    return a.reshape(M // s, s, K).transpose(2, 0, 1).reshape(K, M)


def _gradients(preferred_element_type, a, b, g):
    """(∂a, ∂b) of one example's product a @ b (the operands as multiplied) for the cotangent
    `g`, in the accumulation dtype."""
    if REDUCED_PRECISION_GRADIENT and _mixed_precision(a, b, preferred_element_type):
        g = g.astype(a.dtype)
        da = _input_gradient(g, b, preferred_element_type)
        if _native_bf16_weight_gradient(a, g, preferred_element_type):
            return da, _native.native_weight_gradient(a, g)
        db = jnp.matmul(_rows_to_columns(a), g, preferred_element_type=preferred_element_type)
        return da, db
    if _native_float32_weight_gradient(a, b, g, preferred_element_type):
        return _input_gradient(g, b), _native.native_weight_gradient(a, g)
    _, vjp = jax.vjp(lambda a, b: _product(a, b, preferred_element_type), a, b)
    return vjp(g)


def _input_gradient(g, b, preferred_element_type=None):
    """g bᵀ for `g` (..., M, N) and the weight `b` (K, N): b's rows contracted, no transposed
    copy; one product over all leading axes."""
    dims = (((g.ndim - 1,), (1,)), ((), ()))
    return jax.lax.dot_general(g, b, dims, preferred_element_type=preferred_element_type)


def _matmul_bwd(preferred_element_type, operand_dtype, input_dtypes, residuals, g):
    a, b = residuals  # the operands as multiplied
    da, db = _gradients(preferred_element_type, a, b, g)
    return da.astype(input_dtypes[0]), db.astype(input_dtypes[1])


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _batch_matmul(a, b, preferred_element_type, operand_dtype, input_dtypes):
    """`_matmul` for a batch of examples `a` (n, M, K) and one weight `b` (K, N): the same
    products, and the same per-example gradients, with the weight gradient's sum over the batch
    taken by `_sum_over_batch`."""
    return _batch_matmul_fwd(a, b, preferred_element_type, operand_dtype, input_dtypes)[0]


def _batch_matmul_fwd(a, b, preferred_element_type, operand_dtype, input_dtypes):
    if operand_dtype is not None:
        a, b = a.astype(operand_dtype), b.astype(operand_dtype)
    return _product(a, b, preferred_element_type), (a, b)


def _batch_matmul_bwd(preferred_element_type, operand_dtype, input_dtypes, residuals, g):
    a, b = residuals
    if _native_weight_gradient(a, b, preferred_element_type):
        g = g.astype(a.dtype)
        da = _input_gradient(g, b, preferred_element_type)  # for every example at once
        db = whole_batch_weight_gradient(a, g, preferred_element_type)
        return da.astype(input_dtypes[0]), db.astype(input_dtypes[1])
    if _native_float32_weight_gradient(a, b, g, preferred_element_type):
        n, m, k = a.shape
        db = _native.native_weight_gradient(a.reshape(n * m, k), g.reshape(n * m, g.shape[-1]))
        return _input_gradient(g, b).astype(input_dtypes[0]), db.astype(input_dtypes[1])
    da, db = jax.vmap(
        lambda a, g: _gradients(preferred_element_type, a, b, g)
    )(a, g)  # fmt: skip
    return da.astype(input_dtypes[0]), _sum_over_batch(db).astype(input_dtypes[1])


_batch_matmul.defvjp(_batch_matmul_fwd, _batch_matmul_bwd)


def whole_batch_weight_gradient(a, g, preferred_element_type):
    """Σ over every example and row of aᵀ g, for mixed-precision operands `a` (n, M, K) and `g`
    (n, M, N) already in the narrow dtype, accumulated in `preferred_element_type`: the native
    bfloat16 tile where `_native_bf16_weight_gradient`, else XLA's product of the native
    transposed copy. For one CPU device with the native library (`_native_weight_gradient`)."""
    n, m, k = a.shape
    a2, g2 = a.reshape(n * m, k), g.reshape(n * m, g.shape[-1])
    if _native_bf16_weight_gradient(a2, g2, preferred_element_type):
        return _native.native_weight_gradient(a2, g2)
    return jnp.matmul(
        _native.native_transpose(a2), g2, preferred_element_type=preferred_element_type
    )


def _native_weight_gradient(a, b, preferred_element_type) -> bool:
    """Whether `_batch_matmul_bwd` takes the whole-batch weight gradient through
    `native_transpose` (`NATIVE_WEIGHT_GRADIENT`): mixed precision, reduced-precision gradient
    products, one CPU device, the native library built."""
    return (
        NATIVE_WEIGHT_GRADIENT
        and REDUCED_PRECISION_GRADIENT
        and _mixed_precision(a, b, preferred_element_type)
        and jax.device_count() == 1
        and _native.native_available()
    )


def _native_bf16_weight_gradient(a, g, preferred_element_type) -> bool:
    """Whether a mixed-precision weight gradient aᵀ g (both bfloat16, float32 sums) runs through
    `native_weight_gradient`'s bfloat16 tile (`NATIVE_BF16_WEIGHT_GRADIENT`): one CPU device, a
    native build with that tile (AVX512_BF16) on a host without AMX."""
    return (
        NATIVE_BF16_WEIGHT_GRADIENT
        and a.dtype == g.dtype == jnp.bfloat16
        and jnp.dtype(preferred_element_type) == jnp.float32
        and jax.device_count() == 1
        and _native.native_weight_gradient_bfloat16()
        and not _native.native_host_has_amx()
    )


def _native_float32_weight_gradient(a, b, g, preferred_element_type) -> bool:
    """Whether a float32 product's weight gradient runs through `native_weight_gradient`
    (`NATIVE_FLOAT32_WEIGHT_GRADIENT`): float32 operands, cotangent and accumulation, one CPU
    device, the native library built with a vector tile (AVX2 or AVX-512)."""
    return (
        NATIVE_FLOAT32_WEIGHT_GRADIENT
        and a.dtype == b.dtype == g.dtype == jnp.float32
        and (preferred_element_type is None or jnp.dtype(preferred_element_type) == jnp.float32)
        and jax.device_count() == 1
        and _native.native_weight_gradient_vectorised()
    )


def _native_column_dot(x, g) -> bool:
    """Whether Σ over the rows of x ⊙ g (`scale_columns`' ∂d, BatchNorm's centred sum) runs
    through `native_column_dot` (`NATIVE_COLUMN_DOT`): x float32 or bfloat16, g float32, one
    CPU device, the native library built."""
    return (
        NATIVE_COLUMN_DOT
        and x.dtype in (jnp.float32, jnp.bfloat16)
        and g.dtype == jnp.float32
        and jax.device_count() == 1
        and _native.native_available()
    )


def _sum_over_batch(x: Array) -> Array:
    """Σ over the leading axis, as pairwise sums of halves (log₂ n elementwise adds). XLA's CPU
    backend (its YNNPACK reduction, jax 0.10.2) sums a few large arrays over their leading axis
    slowly: for float32 (4, 768, 512), 4.16 ms as `jnp.sum(x, 0)` against 0.14 ms pairwise;
    (8, 256, 512) 3.17 against 0.08 ms; at (50, 128, 128) the two are within 0.01 ms (AMD EPYC,
    2026-11-29, a `/tmp` script, 20 calls each). Pairwise on one CPU device only: with the
    batch sharded over several devices the halves sit on different devices and each add would
    move one of them (a `reduce_sum` becomes local sums and one all-reduce), and other backends
    reduce well."""
    if jax.default_backend() != "cpu" or jax.device_count() > 1:
        return jnp.sum(x, axis=0)
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        pairs = x[:half] + x[half : 2 * half]
        x = jnp.concatenate([pairs, x[2 * half :]]) if x.shape[0] % 2 else pairs
    return x[0]


def scale_columns(x: Float[Array, "M N"], d: Float[Array, " N"]) -> Float[Array, "M N"]:
    """`x * d[None, :]`: each column of `x` (M, N) scaled by `d` (N,), in the wider of their
    dtypes, with the gradient for `d` computed as a contraction over the rows (Σ_m g[m] x[m]:
    `s5jax.core._native.native_column_dot` on one CPU device with the native library,
    `NATIVE_COLUMN_DOT`; a `dot_general` otherwise) rather than as a product followed by a sum,
    which XLA's CPU backend runs slowly under `vmap` with a batch of one (see the module
    docstring). A narrower `x` (bfloat16) is widened inside the products and kept narrow for the
    backward pass. Same value and same gradient formulas as the plain product; each gradient
    comes back in its own input's dtype."""
    if x.ndim != 2 or d.shape != x.shape[1:]:
        raise ValueError(f"scale_columns takes x (M, N) and d (N,), got {x.shape} and {d.shape}")
    if not VMAP_FRIENDLY_GRADIENT:
        return _scaled(x, d)
    return _scale_columns(x, d)


def _scaled(x, d):
    """x ⊙ d in the wider of the two dtypes (a bfloat16 x is widened exactly, inside the
    product's fusion)."""
    wider = jnp.finfo(d.dtype).bits >= jnp.finfo(x.dtype).bits  # explicit: strict promotion
    dtype = d.dtype if wider else x.dtype
    return x.astype(dtype) * d[None, :].astype(dtype)


@jax.custom_vjp
def _scale_columns(x, d):
    return _scaled(x, d)


def _scale_columns_fwd(x, d):  # x kept as it is: a bfloat16 x stays narrow until ∂d
    return _scaled(x, d), (x, d)


def _scale_columns_bwd(residuals, g):
    x, d = residuals
    if _native_column_dot(x, g):
        dd = _native.native_column_dot(x, g)
    else:
        dd = jax.lax.dot_general(g, x.astype(g.dtype), (((0,), (0,)), ((1,), (1,))))  # Σ_m g x
    return (g * d[None, :].astype(g.dtype)).astype(x.dtype), dd.astype(d.dtype)


_scale_columns.defvjp(_scale_columns_fwd, _scale_columns_bwd)
