"""Scans for the diagonal linear recurrence x_k = a_k ⊙ x_{k−1} + b_k (§2.2, App. H).

Several ways to compute the same states:
- `"sequential"`: `jax.lax.scan`, one step at a time. Work O(LP), fastest on CPU.
- `"parallel"`: `jax.lax.associative_scan` with the App. H operator
  (a_i, b_i) • (a_j, b_j) = (a_j a_i, a_j b_i + b_j): depth O(log L), for GPU/TPU.
- `"chunked"`: L split into chunks of T = `CHUNK_SIZE` steps (padded). Time-invariant a: a
  read-only loop gives each chunk's end state from zero, a short `lax.scan` over chunks
  carries the boundary states, then one loop over the T steps runs all chunks side by side
  from their entry states, reading b and writing x in place in strided slices: no transposed
  copy of b or x (the sequential scan under `jax.vmap` makes two) and no L×P copy of a.
  Gradient by a custom VJP (the adjoint recurrence, same kernel); no forward-mode `jax.jvp`.
  Work O(LP).
- `"pallas"` (never chosen by this module's `"auto"`; `apply_ssm`'s `"auto"` picks it for long
  sequences on one NVIDIA GPU, `_ssm.AUTO_GPU_PALLAS_ABOVE`): a fused Pallas kernel written for the
  Triton (GPU) backend, in `_pallas.py`: one program per block of lanes walks time in
  unrolled chunks with the state in registers; gradient by a custom VJP running the same
  kernel backwards. Off GPU it runs in Pallas interpret mode automatically (correct, slow).
  Work O(LP).
- `"matmul"`: the chunked scan as matrix products, for accelerators whose step is a count of
  small kernels rather than of bytes (the parallel scan's O(log L) levels, each a few kernels,
  forward and backward). Time-invariant a: within each chunk of T = `MATMUL_CHUNK` steps the
  states from zero are one batched product with the chunk's T × T lower-triangular matrix of
  powers of a, per state (a^(t−s) for s ≤ t); the states entering the chunks come from an
  associative scan over the L / T chunks; one elementwise pass adds them, decayed. Work
  O(LPT) in products (8T real FLOPs per complex element) at full float32 precision
  (`Precision.HIGHEST`: no TF32 rounding on GPUs); gradient by a custom VJP (the adjoint
  recurrence, same kernel). Per-step a (irregular sampling, or `resets`) runs `"parallel"`.
- `"native"` (CPU): a C++ kernel called through the XLA FFI, in `_native.py`/`_native.cc`,
  compiled on first use with the system C++ compiler and cached: each element of b read once
  and each state written once (streaming stores for large outputs, sequences split over the
  cores); gradient by a custom VJP whose backward pass is one more such loop (the adjoint and
  ā fused). Raises a `RuntimeError` saying why where it cannot run (no compiler, not a CPU
  backend, `S5JAX_NATIVE=0`). Work O(LP).
- `"auto"`: sequential on CPU, parallel elsewhere (decided at trace time).

`a` may be time-invariant (P,) (S5's Λ̄; no L×P copy of it is made by the sequential scan)
or per step (L, P) (irregular sampling). Options: `reverse` (x_k = a_k x_{k+1} + b_k),
`initial_state` (the state before the first step processed), `resets` (a boolean per step:
where set, the state restarts, x_k = b_k, as for episodes packed in one sequence).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Inexact

from ._native import native_recurrence
from ._pallas import pallas_recurrence

__all__ = [
    "CHUNK_SIZE",
    "MATMUL_CHUNK",
    "SCAN_METHODS",
    "linear_recurrence",
    "resolve_scan_method",
]

CHUNK_SIZE = 65536
"""Steps per chunk of the `"chunked"` scan (L is padded to a multiple of it internally).

Measured on a 2-core AMD EPYC (benchmarks/README.md): with a batch of ≥ 4096 lanes the
single-phase pass (one chunk, T = L) ran at ≈ 0.7 of an elementwise pass, while T = 256 …
4096 ran at ≈ 0.35–0.45: the chunk-end reduction is one more read of b, which costs more
than it saves in loop steps. So chunks only start beyond 65536 steps on CPU.
"""


def _sequential(a, b, reverse):
    if a.ndim == 1:  # time-invariant: close over a, scan only over b (no L×P copy of a)

        def step(x, b_k):
            x = a * x + b_k
            return x, x

        _, xs = jax.lax.scan(step, jnp.zeros_like(b[0]), b, reverse=reverse)
        return xs

    def step_varying(x, ab):
        a_k, b_k = ab
        x = a_k * x + b_k
        return x, x

    _, xs = jax.lax.scan(step_varying, jnp.zeros_like(b[0]), (a, b), reverse=reverse)
    return xs


def binary_operator(element_i, element_j):
    """The App. H operator (a_i, b_i) • (a_j, b_j) = (a_j a_i, a_j b_i + b_j), i before j."""
    a_i, b_i = element_i
    a_j, b_j = element_j
    return a_j * a_i, a_j * b_i + b_j


def _parallel(a, b, reverse):
    a = jnp.broadcast_to(a, b.shape)
    _, xs = jax.lax.associative_scan(binary_operator, (a, b), reverse=reverse)
    return xs


def _chunked(a, b, reverse, chunk_size=None):
    """Chunked scan; its gradient is the adjoint recurrence, computed by the same scan.

    `jax.grad`/`jax.vjp` work (custom VJP); forward-mode `jax.jvp` does not (use
    `"sequential"` or `"parallel"` for that, with `s5jax.core._products.VMAP_FRIENDLY_GRADIENT
    = False` so that the SSM's products support it too).
    """
    L = b.shape[0]
    T = max(1, min(CHUNK_SIZE if chunk_size is None else int(chunk_size), L))
    return _chunked_vjp(a, b, reverse, T)


def _with_adjoint(kernel):
    """`kernel(a, b, reverse, T)` (x for x_k = a_k x_{k∓1} + b_k) as a custom VJP whose backward
    pass is `_adjoint` run by the same kernel (reverse and T static)."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
    def scan(a, b, reverse, T):
        return kernel(a, b, reverse, T)

    def fwd(a, b, reverse, T):
        xs = kernel(a, b, reverse, T)
        return xs, (a, xs)

    def bwd(reverse, T, residuals, g):
        return _adjoint(kernel, reverse, T, residuals, g)

    scan.defvjp(fwd, bwd)
    return scan


def _adjoint(kernel, reverse, T, residuals, g):
    """The VJP of x_k = a_k x_{k−1} + b_k computed by `kernel(a, b, reverse, T)`.

    Forward x_k = a_k x_{k−1} + b_k is linear in b: b̄ = λ with λ_k = g_k + a_{k+1} λ_{k+1}
    (the same recurrence run the other way; JAX's VJPs of complex products do not
    conjugate), and ā_k = λ_k x_{k−1}. With reverse, swap k+1 and k−1.
    """
    a, xs = residuals
    zero = jnp.zeros_like(xs[:1])
    if a.ndim == 2:
        a_adj = jnp.concatenate([zero, a[:-1]]) if reverse else jnp.concatenate([a[1:], zero])
    else:
        a_adj = a
    lam = kernel(a_adj, g, not reverse, T)
    x_prev = jnp.concatenate([xs[1:], zero]) if reverse else jnp.concatenate([zero, xs[:-1]])
    a_bar = lam * x_prev
    if a.ndim == 1:
        a_bar = jnp.sum(a_bar, axis=0)
    return a_bar, lam


def _chunked_kernel(a, b, reverse, T):
    """x for x_k = a_k x_{k∓1} + b_k, with L split into N chunks of T steps (padded).

    Time-invariant a, three steps, none of which copies b into another layout or tiles a:
    1. each chunk's last state from a zero start, h_c (a read-only loop over the T steps,
       all chunks side by side), and a^T;
    2. the state entering each chunk, s_c = a^T s_{c−1} + h_{c−1}: `lax.scan` over N chunks;
    3. all chunks side by side from their entry states: x_{c,t} = a x_{c,t−1} + b_{c,t} with
       x_{c,−1} = s_c, a loop over the T steps, each step reading b and writing x in one
       (N, P) strided slice of one buffer, in place (N·P lanes per step, not P).
    With one chunk (T ≥ L) steps 1–2 are skipped: one read and one write of each element.
    Per-step a: the within-chunk states from zero and the running products of a by one
    `lax.scan` over t (all chunks at once), then the carries, then one elementwise pass.
    Padding (b = 0 after the end) changes nothing: forward, it comes after every real step;
    in reverse, it is processed first from a zero state and stays zero.
    """
    L, P = b.shape
    N = -(-L // T)
    pad = N * T - L

    def pad_to_chunks(z, fill):  # (L, P) -> (N, T, P), a reshape
        if pad:
            z = jnp.concatenate([z, jnp.full((pad, P), fill, z.dtype)])
        return z.reshape(N, T, P)

    b_c = pad_to_chunks(b, 0)
    if a.ndim == 1:
        if N == 1:
            s_in = jnp.zeros((1, P), b.dtype)
        else:

            def chunk_end(i, carry):  # read-only pass: each chunk's last state from zero
                h, power = carry
                t = T - 1 - i if reverse else i
                h = a[None] * h + jax.lax.dynamic_index_in_dim(b_c, t, axis=1, keepdims=False)
                return h, a * power

            init = (jnp.zeros((N, P), b.dtype), jnp.ones((P,), a.dtype))
            h_end, a_T = jax.lax.fori_loop(0, T, chunk_end, init)
            s_in = _chunk_carries(jnp.broadcast_to(a_T, (N, P)), h_end, reverse)

        def body(i, carry):  # one buffer: read b at step t, overwrite it with x
            x, buf = carry
            t = T - 1 - i if reverse else i
            x = a[None] * x + jax.lax.dynamic_index_in_dim(buf, t, axis=1, keepdims=False)
            return x, jax.lax.dynamic_update_index_in_dim(buf, x, t, axis=1)

        _, xs = jax.lax.fori_loop(0, T, body, (s_in, b_c))
        return xs.reshape(N * T, P)[:L]

    a_c = pad_to_chunks(a, 1).transpose(1, 0, 2)  # (T, N, P)

    def step_varying(carry, ab):
        h, prod = carry
        a_t, b_t = ab
        h = a_t * h + b_t
        prod = a_t * prod
        return (h, prod), (h, prod)

    init = (jnp.zeros((N, P), b.dtype), jnp.ones((N, P), a.dtype))
    _, (h, decay) = jax.lax.scan(step_varying, init, (a_c, b_c.transpose(1, 0, 2)), reverse=reverse)
    last = 0 if reverse else -1  # the within-chunk step processed last
    s_in = _chunk_carries(decay[last], h[last], reverse)
    xs = h + decay * s_in[None]
    return xs.transpose(1, 0, 2).reshape(N * T, P)[:L]


def _chunk_carries(a_chunk, h_end, reverse):
    """States entering each chunk: s_c = A_{c−1} s_{c−1} + h_{c−1} (c+1 with reverse)."""

    def step(s, elements):
        a_k, h_k = elements
        return a_k * s + h_k, s  # emit the state entering this chunk

    _, s_in = jax.lax.scan(
        step, jnp.zeros(h_end.shape[1:], h_end.dtype), (a_chunk, h_end), reverse=reverse
    )
    return s_in


_chunked_vjp = _with_adjoint(_chunked_kernel)


MATMUL_CHUNK = 64
"""Steps per chunk of the `"matmul"` scan: each complex state costs 8 × `MATMUL_CHUNK` real
FLOPs in products, and the carries' associative scan has log2(L / `MATMUL_CHUNK`) levels.
Not tuned on any GPU yet (`scripts/gpu_session.sh`'s `methods` step times 16 to 128)."""


def _matmul(a, b, reverse, chunk_size=None):
    """Chunked scan by matrix products (time-invariant a); per-step a runs `_parallel`.

    `jax.grad`/`jax.vjp` work (custom VJP, the adjoint by the same products); forward-mode
    `jax.jvp` does not (as for `"chunked"`).
    """
    if a.ndim == 2:
        return _parallel(a, b, reverse)
    L = b.shape[0]
    T = max(1, min(MATMUL_CHUNK if chunk_size is None else int(chunk_size), L))
    return _matmul_vjp(a, b, reverse, T)


def _powers(a, n):
    """a^0 … a^(n−1) as an (n, P) array, by doubling: log2(n) products, no power series."""
    pw = jnp.ones((1, *a.shape), a.dtype)
    while pw.shape[0] < n:
        pw = jnp.concatenate([pw, pw * (pw[-1] * a)[None]])
    return pw[:n]


def _matmul_kernel(a, b, reverse, T):
    """x for x_k = a ⊙ x_{k∓1} + b_k (a of shape (P,)), L split into N chunks of T steps.

    1. h_{c,t} = Σ_s M[t, s] b_{c,s} with M[t, s] = a^(t−s) for s ≤ t (s ≥ t and a^(s−t) in
       reverse), else 0: one product per state over all chunks (and, under `jax.vmap`, all
       sequences) at once;
    2. the state at the end of each chunk from the previous one, e_c = a^T e_{c−1} + h_{c,end}:
       `lax.associative_scan` over the N chunks;
    3. x_{c,t} = h_{c,t} + a^(t+1) e_{c−1} (a^(T−t) e_{c+1} in reverse).
    Padding (b = 0 after the end) changes nothing, as in `_chunked_kernel`.
    """
    L, P = b.shape
    N = -(-L // T)
    pad = N * T - L
    if pad:
        b = jnp.concatenate([b, jnp.zeros((pad, P), b.dtype)])
    b_c = b.reshape(N, T, P)
    powers = _powers(a, T + 1)  # (T + 1, P)
    k = jnp.arange(T)
    lag = (k[None, :] - k[:, None]) if reverse else (k[:, None] - k[None, :])  # (t, s)
    M = jnp.where((lag >= 0)[..., None], powers[jnp.clip(lag, 0, T)], 0)  # (T, T, P)
    h = jnp.einsum("tsp,nsp->ntp", M, b_c, precision=jax.lax.Precision.HIGHEST)
    if N > 1:
        end = h[:, 0] if reverse else h[:, -1]  # each chunk's last processed state from zero
        decay = jnp.broadcast_to(powers[T], end.shape)
        _, e = jax.lax.associative_scan(binary_operator, (decay, end), reverse=reverse)
        zero = jnp.zeros_like(e[:1])
        s_in = jnp.concatenate([e[1:], zero]) if reverse else jnp.concatenate([zero, e[:-1]])
        into = powers[1:][::-1] if reverse else powers[1:]  # a^(steps since the chunk's entry)
        h = h + into[None] * s_in[:, None]
    return h.reshape(N * T, P)[:L]


_matmul_vjp = _with_adjoint(_matmul_kernel)


def _pallas(a, b, reverse):
    """The fused kernel; interpret mode unless the default backend is a GPU (trace time)."""
    return pallas_recurrence(a, b, reverse=reverse, interpret=None)


def _native(a, b, reverse):
    """The C++ kernel (CPU); a `RuntimeError` that says why where it is unavailable."""
    return native_recurrence(a, b, reverse=reverse)


SCAN_METHODS: dict[str, Callable] = {
    "sequential": _sequential,
    "parallel": _parallel,
    "chunked": _chunked,
    "matmul": _matmul,
    "pallas": _pallas,
    "native": _native,
}


def resolve_scan_method(method: str) -> str:
    """Map `"auto"` to `"sequential"` on CPU and `"parallel"` on accelerators; validate."""
    if method == "auto":
        return "sequential" if jax.default_backend() == "cpu" else "parallel"
    if method not in SCAN_METHODS:
        raise ValueError(
            f"scan method must be 'auto' or one of {sorted(SCAN_METHODS)}, got {method!r}"
        )
    return method


def linear_recurrence(
    a: Inexact[Array, "*La P"],
    b: Inexact[Array, "L P"],
    *,
    reverse: bool = False,
    initial_state: Inexact[Array, " P"] | None = None,
    resets: Bool[Array, " L"] | None = None,
    method: str = "auto",
) -> tuple[Inexact[Array, "L P"], Inexact[Array, " P"]]:
    """All states of x_k = a_k ⊙ x_{k−1} + b_k, and the final state.

    **Arguments:**
    - `a`: decay, (P,) for every step or (L, P) per step.
    - `b`: inputs, (L, P).
    - `reverse`: run from the last step to the first: x_k = a_k ⊙ x_{k+1} + b_k.
    - `initial_state`: the state before the first processed step (zeros if `None`).
    - `resets`: (L,) booleans; where true the state restarts there: x_k = b_k.
    - `method`: `"auto"`, `"sequential"`, `"parallel"`, `"chunked"`, `"matmul"` (the chunked
      scan as matrix products, for accelerators), `"pallas"` (opt-in
      fused kernel; interpret mode off GPU) or `"native"` (the C++ kernel, CPU only).

    **Returns:** `(xs, final_state)`: xs of shape (L, P); the final state is the last one
    processed (xs[-1], or xs[0] when `reverse`).
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    _check_recurrence_args(a, b, initial_state, resets)
    method = resolve_scan_method(method)
    if resets is not None:
        keep = jnp.logical_not(jnp.asarray(resets))[:, None]
        a = jnp.where(keep, jnp.broadcast_to(a, b.shape), jnp.zeros(b.shape, a.dtype))
    if initial_state is not None:
        # Fold x_init into the first processed input: x_first = a_first x_init + b_first.
        first = -1 if reverse else 0
        a_first = a[first] if a.ndim == 2 else a
        b = b.at[first].add(a_first * jnp.asarray(initial_state, b.dtype))
    xs = SCAN_METHODS[method](a, b, reverse)
    return xs, xs[0] if reverse else xs[-1]


def _check_recurrence_args(a, b, initial_state, resets) -> None:
    if b.ndim != 2:
        raise ValueError(f"b must have shape (L, P), got {b.shape}")
    L, P = b.shape
    if a.shape not in ((P,), (L, P)):
        raise ValueError(f"a must have shape (P,) = ({P},) or (L, P) = {b.shape}, got {a.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if initial_state is not None and jnp.shape(initial_state) != (P,):
        raise ValueError(
            f"initial_state must have shape (P,) = ({P},), got {jnp.shape(initial_state)}"
        )
    if resets is not None:
        if jnp.shape(resets) != (L,):
            raise ValueError(f"resets must have shape (L,) = ({L},), got {jnp.shape(resets)}")
        if jnp.asarray(resets).dtype != jnp.bool_:
            raise ValueError(f"resets must be boolean, got dtype {jnp.asarray(resets).dtype}")
