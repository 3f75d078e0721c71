"""A fused Pallas kernel for the diagonal recurrence x_k = a_k ⊙ x_{k−1} + b_k (opt-in).

Written for the Pallas **Triton** (GPU) backend; on any other backend it runs in Pallas
interpret mode (the same kernel evaluated as XLA loops: correct, not fast). Registered as
scan method `"pallas"` in `_scan.SCAN_METHODS`. `"auto"` (`s5jax.core.apply_ssm`, the
layers) picks it on one NVIDIA GPU for long sequences where `pallas_available()` says it
can run (`s5jax.core._ssm.AUTO_GPU_PALLAS_ABOVE`); `S5JAX_PALLAS=0` turns that off.

Kernel (`_recurrence_kernel`):
- Triton has no complex dtype, so a complex array travels as two real planes (Re, Im) of
  its real dtype (float32 for complex64) and the complex multiply-add is written out by
  hand. Real inputs use one plane. The planes are split before and joined after the call
  (`z.real`, `z.imag`, `lax.complex`): under `jax.jit`, when `b` was built by `lax.complex`
  and only `xs.real`/`xs.imag` are used afterwards (as in `apply_ssm`), XLA cancels these;
  on a stand-alone complex array they are one extra elementwise pass each way.
- Grid: one program per block of `block_size` lanes (P, padded to a multiple of the block,
  a power of two as Triton requires); `jax.vmap` adds a grid axis through `pallas_call`'s
  batching rule (no transposed copy: the batch stays the leading axis in memory).
- Each program walks time sequentially with the state in registers, in chunks of
  `chunk_size` = T steps (L padded to a multiple of T): a `fori_loop` over chunks whose
  body is unrolled over the T steps. A chunk first loads its T rows of b (and of a when a
  is per step), each row a contiguous (block,) vector (Triton cannot slice rows out of a
  register tile, so the (T, block) tile is loaded row by row; the loads do not depend on the
  recurrence and can all be in flight), then runs the T multiply-adds and stores the T rows
  of x. Reverse walks the chunks and the rows within them backwards (no flipped copies).
- Time-invariant a (P,) (S5's Λ̄) is loaded once per program. Per-step a (L, P) is loaded
  in tiles like b. Resets and the initial state are folded in by `linear_recurrence` before
  the method is called (a = 0 at reset steps, which makes a per step; x_init added to the
  first processed b), exactly as for the other methods.

Gradient (`jax.custom_vjp`; no forward-mode `jax.jvp`): the map b ↦ x is linear, and with
JAX's convention (the VJP of a product of complex numbers does not conjugate) the cotangent
of b is λ with λ_k = g_k + a_{k+1} λ_{k+1} (the same recurrence, walked the other way, its
multiplier taken from the step processed just before in that walk), and the cotangent of a
is ā_k = λ_k x_{k−1} (summed over k for a time-invariant a); with `reverse`, k+1 and k−1
swap. The backward is the same kernel in "adjoint" mode, one pass: it reads g, a and the
stored forward states x, writes λ and accumulates ā in registers (time-invariant a: one (P,)
result per program) or writes it per step. Stored, not recomputed: the forward states x
(padded planes) and the padded planes of a are the residuals; nothing is re-run.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jaxtyping import Array, Inexact

__all__ = [
    "PALLAS_BLOCK",
    "PALLAS_CHUNK",
    "PALLAS_NUM_WARPS",
    "pallas_available",
    "pallas_recurrence",
    "pallas_unavailable_reason",
]

PALLAS_BLOCK = 32
"""Lanes per program (rounded down to a power of two ≤ the padded lane count). Not tuned."""

PALLAS_CHUNK = 32
"""Time steps per unrolled chunk: the rows of b whose loads can be in flight together."""

PALLAS_NUM_WARPS = 1
"""Triton warps per program (32 threads each: one lane per thread at `PALLAS_BLOCK` = 32)."""


def pallas_unavailable_reason() -> str:
    """Why `"auto"` does not run the kernel here ("" when it may): `pallas_available()`.

    It needs a CUDA GPU of compute capability 8.0 (Ampere) or more as JAX's default backend
    (our own floor, not Triton's: the kernel has run on 9.0 only, an NVIDIA H200), JAX's Pallas
    Triton backend (deprecated in jax 0.11 in favour of Mosaic GPU: when a jax without it is
    installed this says so and `"auto"` keeps `"parallel"`), and `S5JAX_PALLAS` not `0`.
    Builds nothing.
    """
    if os.environ.get("S5JAX_PALLAS", "1") == "0":
        return "S5JAX_PALLAS=0 is set"
    if jax.default_backend() != "gpu":
        return f"the Pallas kernel needs a GPU; the default backend is {jax.default_backend()}"
    capability = getattr(jax.devices()[0], "compute_capability", None)
    if capability is None:
        return f"the Pallas kernel needs a CUDA GPU; found {jax.devices()[0].device_kind}"
    try:
        major_minor = tuple(int(x) for x in str(capability).split(".")[:2])
    except ValueError:
        return f"unreadable CUDA compute capability {capability!r}"
    if major_minor < (8, 0):
        return f"the Pallas kernel needs compute capability 8.0 or more; this GPU has {capability}"
    try:
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError as err:
        return f"this jax has no Pallas Triton backend ({err})"
    return ""


def pallas_available() -> bool:
    """Whether the kernel compiles for this machine's GPU and `"auto"` may use it
    (`pallas_unavailable_reason()` says why not). `method="pallas"` by name runs anyway: on a
    GPU as a Triton kernel, elsewhere in interpret mode."""
    return not pallas_unavailable_reason()


def pallas_recurrence(
    a: Inexact[Array, "*La P"],
    b: Inexact[Array, "L P"],
    *,
    reverse: bool = False,
    chunk_size: int | None = None,
    block_size: int | None = None,
    interpret: bool | None = None,
) -> Inexact[Array, "L P"]:
    """All states of x_k = a_k ⊙ x_{k∓1} + b_k by the fused kernel (zero initial state).

    **Arguments:**
    - `a`: (P,) time-invariant or (L, P) per step; same dtype as `b`.
    - `b`: (L, P), complex or real floating (complex128/float64 run in float64 planes).
    - `reverse`: x_k = a_k ⊙ x_{k+1} + b_k, from the last step to the first.
    - `chunk_size`: steps per unrolled chunk T (default `PALLAS_CHUNK`, at most L).
    - `block_size`: lanes per program (default `PALLAS_BLOCK`), rounded down to a power of
      two and capped at the power of two ≥ P (Triton needs power-of-two vectors).
    - `interpret`: run the kernel in Pallas interpret mode. `None` (default): decided at
      trace time, interpret unless `jax.default_backend() == "gpu"` (Triton needs a GPU).

    **Returns:** xs, (L, P), the dtype of `b`.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if b.ndim != 2 or a.shape not in (b.shape[1:], b.shape):
        raise ValueError(f"a must be (P,) or (L, P) for b (L, P); got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    L, P = b.shape
    T = max(1, min(int(chunk_size or PALLAS_CHUNK), L))
    block = _power_of_two_at_most(int(block_size or PALLAS_BLOCK), pl.next_power_of_2(P))
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    return _pallas_vjp(a, b, bool(reverse), T, block, bool(interpret))


def _power_of_two_at_most(n: int, cap: int) -> int:
    if n < 1:
        raise ValueError(f"block_size must be >= 1, got {n}")
    return min(1 << (n.bit_length() - 1), cap)


# --- planes and padding ---------------------------------------------------------------------


def _planes(z):
    return (z.real, z.imag) if jnp.iscomplexobj(z) else (z,)


def _join(planes, dtype):
    return jax.lax.complex(*planes) if len(planes) == 2 else planes[0].astype(dtype)


def _pad(plane, L_pad, P_pad):
    widths = [(0, P_pad - plane.shape[-1])]
    if plane.ndim == 2:
        widths.insert(0, (0, L_pad - plane.shape[0]))
    return jnp.pad(plane, widths) if any(w for _, w in widths) else plane


def _sizes(L, P, T, block):
    return -(-L // T) * T, -(-P // block) * block


# --- custom VJP -----------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _pallas_vjp(a, b, reverse, T, block, interpret):
    return _pallas_fwd(a, b, reverse, T, block, interpret)[0]


def _pallas_fwd(a, b, reverse, T, block, interpret):
    L, P = b.shape
    L_pad, P_pad = _sizes(L, P, T, block)
    a_p = tuple(_pad(p, L_pad, P_pad) for p in _planes(a))
    b_p = tuple(_pad(p, L_pad, P_pad) for p in _planes(b))
    xs_p = _call(a_p, b_p, None, reverse=reverse, adjoint=False, T=T, block=block,
                 interpret=interpret)  # fmt: skip
    xs = _join(tuple(p[:L, :P] for p in xs_p), b.dtype)
    return xs, (a_p, xs_p)


def _pallas_bwd(reverse, T, block, interpret, residuals, g):
    a_p, xs_p = residuals
    L_pad, P_pad = xs_p[0].shape
    L, P = g.shape
    g_p = tuple(_pad(p, L_pad, P_pad) for p in _planes(g))
    lam_p, a_bar_p = _call(a_p, g_p, xs_p, reverse=not reverse, adjoint=True, T=T,
                           block=block, interpret=interpret)  # fmt: skip
    b_bar = _join(tuple(p[:L, :P] for p in lam_p), g.dtype)
    if a_p[0].ndim == 1:
        a_bar = _join(tuple(p[:P] for p in a_bar_p), g.dtype)
    else:
        a_bar = _join(tuple(p[:L, :P] for p in a_bar_p), g.dtype)
    return a_bar, b_bar


_pallas_vjp.defvjp(_pallas_fwd, _pallas_bwd)


# --- the pallas_call ------------------------------------------------------------------------


def _call(a_p, b_p, x_p, *, reverse, adjoint, T, block, interpret):
    """Run the kernel on padded planes; `reverse` is the direction of this walk.

    Forward: returns the planes of x. Adjoint (`x_p` = the forward states, `b_p` = the
    cotangent g, walking opposite to the forward): returns the planes of λ and of ā.
    """
    L_pad, P_pad = b_p[0].shape
    varying = a_p[0].ndim == 2
    n = len(b_p)
    lane_spec = pl.BlockSpec((block,), lambda i: (i,))
    tile_spec = pl.BlockSpec((L_pad, block), lambda i: (0, i))
    a_spec = tile_spec if varying else lane_spec
    tile = jax.ShapeDtypeStruct((L_pad, P_pad), b_p[0].dtype)
    a_shape = jax.ShapeDtypeStruct(a_p[0].shape, b_p[0].dtype)
    in_specs = [a_spec] * n + [tile_spec] * n
    out_shape = [tile] * n
    out_specs = [tile_spec] * n
    inputs = (*a_p, *b_p)
    if adjoint:
        in_specs += [tile_spec] * n
        out_shape += [a_shape] * n
        out_specs += [a_spec] * n
        inputs += tuple(x_p)
    kernel = functools.partial(
        _recurrence_kernel,
        n_planes=n,
        n_chunks=L_pad // T,
        T=T,
        reverse=reverse,
        varying=varying,
        adjoint=adjoint,
    )
    compiler_params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        compiler_params = plgpu.CompilerParams(num_warps=PALLAS_NUM_WARPS, num_stages=1)
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(P_pad // block,),
        in_specs=in_specs,
        out_specs=out_specs,
        interpret=interpret,
        compiler_params=compiler_params,
        name="s5jax_linear_recurrence" + ("_adjoint" if adjoint else ""),
    )(*inputs)
    outs = tuple(outs)
    return (outs[:n], outs[n:]) if adjoint else outs


def _cmul(p, q):
    if len(p) == 1:
        return (p[0] * q[0],)
    (pr, pi), (qr, qi) = p, q
    return (pr * qr - pi * qi, pr * qi + pi * qr)


def _cadd(p, q):
    return tuple(u + v for u, v in zip(p, q, strict=True))


def _recurrence_kernel(*refs, n_planes, n_chunks, T, reverse, varying, adjoint):
    """One program: `block` lanes, all L_pad steps, state in registers.

    Refs (each a tuple of `n_planes` planes): a, b [, x] inputs; out [, ā] outputs.
    Forward:  x_k = a_k x_prev + b_k.
    Adjoint:  λ_k = a_prev λ_prev + g_k with a_prev the a of the step visited before (per
    step; λ_prev = 0 at the first visit, so its a is irrelevant), and ā_k = λ_k x_j where
    j is the step this walk visits next (k−1 walking backwards, k+1 forwards): the forward's
    previous step, x_j = 0 off the end.
    """
    n = n_planes
    a_refs, b_refs = refs[:n], refs[n : 2 * n]
    if adjoint:
        x_refs, out_refs, abar_refs = refs[2 * n : 3 * n], refs[3 * n : 4 * n], refs[4 * n :]
    else:
        out_refs = refs[2 * n :]
    L_pad, block = b_refs[0].shape
    dtype = b_refs[0].dtype
    zero = tuple(jnp.zeros((block,), dtype) for _ in range(n))
    a_const = None if varying else tuple(r[...] for r in a_refs)

    def row(refs_, k):
        return tuple(r[k, :] for r in refs_)

    def chunk(c, carry):
        state, a_prev, acc = carry
        if reverse:
            base = (n_chunks - 1 - c) * T
            ks = [base + (T - 1 - t) for t in range(T)]
        else:
            base = c * T
            ks = [base + t for t in range(T)]
        # Load the chunk's rows first: none depends on the recurrence.
        b_rows = [row(b_refs, k) for k in ks]
        a_rows = [row(a_refs, k) for k in ks] if varying else None
        if adjoint:
            x_rows = []
            for k in ks:
                j = k - 1 if reverse else k + 1  # visited next: the forward's previous step
                valid = (j >= 0) & (j < L_pad)
                r = row(x_refs, jnp.clip(j, 0, L_pad - 1))
                x_rows.append(tuple(jnp.where(valid, v, jnp.zeros_like(v)) for v in r))
        for t, k in enumerate(ks):
            if adjoint:
                mult = a_prev if varying else a_const
                state = _cadd(_cmul(mult, state), b_rows[t])
                if varying:
                    a_prev = a_rows[t]
                contrib = _cmul(state, x_rows[t])
                if varying:
                    for r, v in zip(abar_refs, contrib, strict=True):
                        r[k, :] = v
                else:
                    acc = _cadd(acc, contrib)
            else:
                mult = a_rows[t] if varying else a_const
                state = _cadd(_cmul(mult, state), b_rows[t])
            for r, v in zip(out_refs, state, strict=True):
                r[k, :] = v
        return state, a_prev, acc

    _, _, acc = jax.lax.fori_loop(np.int32(0), np.int32(n_chunks), chunk, (zero, zero, zero))
    if adjoint and not varying:
        for r, v in zip(abar_refs, acc, strict=True):
            r[...] = v
