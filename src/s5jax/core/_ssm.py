"""Applying a discretised diagonal MIMO SSM to one sequence (§3, Eqs. 7–8; App. A).

    x_k = Λ̄ ⊙ x_{k−1} + B̄ u_k,        y_k = f · Re(C̃ x_k) + D ⊙ u_k

with f = 2 under conjugate symmetry (only one eigenvalue of each conjugate pair is stored,
and the pair's contributions are complex conjugates of each other) and f = 1 otherwise.
Bidirectional: a second scan in reverse over the same elements,
x'_k = Σ_{j≥k} Λ̄^{j−k} B̄ u_j, and y_k = f · Re(C_fwd x_k + C_bwd x'_k) + D ⊙ u_k,
where C̃ = [C_fwd | C_bwd] has shape (H, 2P).

Complex products with real operands are done as real matrix products, one per side of the
recurrences: [Re B̃u | Im B̃u] = u [B_reᵀ | B_imᵀ] and Re(C̃x) = [x_re | x_im] [C_reᵀ; −C_imᵀ]
(both directions' states side by side in one product when bidirectional): cheaper than complex
matmuls, free of dtype promotion, and each (L, H) array is read or written once.

Two ways to compute y (the `method` argument): a scan method of `linear_recurrence`
(`"sequential"`, `"parallel"`, `"chunked"`, `"native"`, …) on complex (L, P) arrays, or
`"fused"`: B̃u, the recurrences and C̃x blockwise in real (re, im) planes with its own VJP
(below). `"auto"` is `"native"` on CPU where the C++ kernel builds (`AUTO_CPU_NATIVE`; else
`"chunked"`), `"fused"` there for long sequences (`AUTO_CPU_FUSED_ABOVE`); on one NVIDIA GPU
the Pallas kernel for long sequences (`AUTO_GPU_PALLAS_ABOVE`) and `"parallel"` otherwise
(see `resolve_ssm_method`).
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jaxtyping import Array, Bool, Complex, Float

from . import _mixed
from ._discretize import discretize, get_coefficients
from ._native import native_available, native_planar_states, planar_lanes
from ._pallas import pallas_available
from ._products import matmul, scale_columns
from ._scan import SCAN_METHODS, linear_recurrence, resolve_scan_method

__all__ = [
    "FUSED_BLOCK",
    "apply_ssm",
    "apply_ssm_continuous",
    "init_state",
    "resolve_ssm_method",
    "ssm_step",
    "step_multipliers",
]


AUTO_CPU = "chunked"
"""What `"auto"` picks on CPU for sequences up to `AUTO_CPU_FUSED_ABOVE` stored states
where it does not run the native scan (`AUTO_CPU_NATIVE`). Measured on the 2-core AMD EPYC
(AVX2), jax 0.10.2, one interleaved run of `benchmarks/train_step.py --methods auto,fused
--ceiling` (2026-11-26; `docs/results.md`):
the whole training step was faster with `"chunked"` than with `"fused"` on 9 of the 11
paper configs (e.g. ListOps 534 vs 663 ms, Speech 328 vs 644 ms), slower on Retrieval
(1,882 vs 1,557 ms; 1,829 vs 1,744 ms in a 5-round rerun) and the pendulum (252 vs 239 ms,
where per-step Δ makes both run the sequential scan). `"fused"` stays available by name."""

AUTO_CPU_NATIVE = True
"""Whether `"auto"` on CPU runs the C++ scan (`"native"`, `_native.py`) instead of `AUTO_CPU`
where the kernel is available: a C++ compiler found, the build succeeded (once per host,
cached; about 7 s on a 2-core Intel Xeon), `S5JAX_NATIVE` not `0`. It also needs a single
device (`jax.device_count() == 1`): XLA's partitioner cannot split a custom call over
devices, so with the batch sharded it gathers the whole batch onto every device first
(the compiled step has an all-gather before the call); several devices keep `AUTO_CPU`.
Elsewhere `"auto"` falls back to `AUTO_CPU`, silently (`s5jax.core.native_build_error()`
says why). Same results as `"chunked"` to float rounding (the same recurrence, one pass
over memory each way). Measured as whole training steps of the 11 paper configs, both
scans in one interleaved run per precision (2-core Intel Xeon, 2026-11-28, load 1.5–1.6;
`benchmarks/train_step.py --methods chunked,native --precision fp32,bf16 --repeats 3 --out
train-step-native-auto`; `docs/results.md`), chunked / native ms: Retrieval 1,617 / 1,017
(fp32) and 1,439 / 1,096 (bf16), Speech 259 / 233 and 244 / 228, Path-X (L 4096) 298 / 254
and 232 / 240; over all 11 the geometric mean of chunked / native is 1.08 (fp32) and 1.04
(bf16), single configs 0.88–1.59, the ones under 1 within that run's noise (sMNIST fp32
626 / 711 ms, while its bf16 step, which should be the faster, took 708)."""

AUTO_CPU_FUSED_ABOVE = 2**21
"""Above this many stored states per sequence (L × P, × 2 when bidirectional), `"auto"` on
CPU picks `"fused"`. The chunked scan's backward pass holds about seven complex (L, P) arrays
per sequence where the fused path holds about one (one bidirectional layer, batch 32,
L 16,384, P 128: 3.5 GiB of compiled scratch against 0.5 GiB), and its speed advantage
shrinks as sequences grow. Measured on the 2-core AMD EPYC, 2026-11-26, at the paper's
lengths: Path-X (L 16,384, 2 × 128 states: 4.2 M) needs 24.5 GiB of training-step scratch
chunked at the paper's batch 32, more than a 24 GiB host, against 12.6 GiB fused, and at
batch 4 a step took 7,757 ms chunked, 7,594 ms fused; Speech (L 16,000, 2 × 64: 2.05 M,
kept chunked) 3,592 ms chunked, 3,855 ms fused at batch 4 (`benchmarks/train_step.py
--configs pathx,speech --paper --batch 4 --methods chunked,fused`; memory:
`benchmarks/train_step_memory.py`)."""


AUTO_CPU_FUSED_FOR_BF16 = False
"""Whether, under bfloat16 products (`S5SSM(precision="bf16")`, `model.precision = "bf16"`),
`"auto"` on CPU picks `"fused"` (True) or the same path as in float32 (False, the default).

It was True while the chunked path's gradient products ran in float32: JAX's backward pass of a
bfloat16 product multiplies the float32 cotangent, and the fused path, with its own backward
pass, was 1.27–1.34× faster in bf16 (2-core Intel Xeon with AVX512_BF16 and AMX, 2026-11-26;
whole training steps, chunked / fused ms: Text 2,132 / 1,670, Image 1,454 / 1,089, Pathfinder
430 / 325, sCIFAR 606 / 464), then a tie after the one-product-per-side change (2026-11-27:
Text 1,111 / 1,202, Image 936 / 888). Since `s5jax.core._products.matmul` runs the gradient
products in bfloat16 too (`REDUCED_PRECISION_GRADIENT`), the chunked path is the faster one in
bf16 on every paper config measured (same Xeon, 2026-11-27, one interleaved run of
`benchmarks/train_step.py --methods chunked,fused --precision fp32,bf16 --out
train-step-bf16-rpg`, bf16 chunked / fused ms: Text 723 / 1,035, Image 503 / 664, Pathfinder
197 / 251, Path-X (L 4096, batch 1) 181 / 342, Retrieval 765 / 762; `docs/results.md`). Long
sequences still go to `"fused"` by `AUTO_CPU_FUSED_ABOVE`, for its memory. On CPUs without
bfloat16 arithmetic, bf16 is slower than fp32 either way (`docs/performance.md`)."""


AUTO_GPU_PALLAS_ABOVE = 2**18
"""Above this many stored states per sequence (L × P, × 2 when bidirectional), `"auto"` on a
GPU runs the Pallas kernel (`"pallas"`, `_pallas.py`) instead of `"parallel"`
(`jax.lax.associative_scan`), where `_pallas.pallas_available()` (a CUDA GPU, JAX's Pallas
Triton backend, `S5JAX_PALLAS` not `0`) and there is one device (a custom call, like the native
scan's: XLA cannot split it over devices). Set to None to keep `"parallel"` everywhere.
Measured on one NVIDIA H200, jax 0.11.2, whole training steps at the paper's batches, one
interleaved run per config (2026-12-04, `benchmarks/train_step.py --paper --methods
parallel,pallas`; `docs/results.md`), parallel / pallas ms: Text (4,096 × 96 × 2 = 786 k
states) 36.0 / 31.8, Path-X (16,384 × 128 × 2 = 4.2 M) 75.1 / 68.6, but ListOps (2,048 × 8 × 2
= 33 k) 14.1 / 14.5; the threshold lies between ListOps and Text, where nothing was measured.
The kernel also compiles faster: first calls (compile + one step) 56.7 / 28.0 s (Text), 66.2 /
29.5 (Path-X), 58.6 / 33.0 (ListOps)."""


NATIVE_PLANAR = True
"""Whether `"native"` (time-invariant Λ̄, zero initial state, no resets, P ≥
`NATIVE_PLANAR_MIN_P`) runs the kernel on the products' [Re | Im] rows (`_apply_planar`)
instead of on complex arrays (`linear_recurrence`). Whole bf16 training steps, complex /
planar, one interleaved run per line on a 2-core Intel Xeon, 2026-11-28
(`benchmarks/products.py --switch native-planar --precision bf16 --out
products-native-planar-bf16`; `docs/results.md`): 0.97–1.13 on the nine configs with P ≥ 64
(geometric mean 1.04; Pathfinder 1.13, sMNIST 1.10), and 0.94 on ListOps (P 8) in two runs;
Speech at the paper's batch 16 and length 1.08 (7,471 against 8,080 ms). The step's compiled
memory is lower (no complex copies of the states or their cotangents): at the paper's batch
Speech 5.32 GiB and Text 10.19, against 6.78 and 11.95 with the chunked scan, which the
complex kernels matched to 2 % (`benchmarks/train_step_memory.py`)."""
NATIVE_PLANAR_MIN_P = 16
"""Below this many states (ListOps' P 8) `"native"` keeps the complex-array kernels."""


def resolve_ssm_method(method: str, *, states: int | None = None, matmul_dtype=None) -> str:
    """Validate an SSM `method` and map `"auto"`: on CPU `"native"` (`AUTO_CPU_NATIVE`: where
    the C++ kernel is available and there is one device; this may compile it, once) else
    `AUTO_CPU` (`"chunked"`), or `"fused"` when `states` (L × P × directions of one
    sequence) exceeds `AUTO_CPU_FUSED_ABOVE` (or, with `AUTO_CPU_FUSED_FOR_BF16` set, when
    the products run in a reduced `matmul_dtype`); on a GPU `"pallas"` when `states` exceeds
    `AUTO_GPU_PALLAS_ABOVE` (where the kernel is available and there is one device), else the
    backend's scan (`"parallel"`). Other names pass through (`"fused"` or a scan method).

    `"fused"` falls back to what `"auto"` picks otherwise (`"native"` or `"chunked"` on CPU)
    where it does not apply: `resets` or an L without a block size. With per-step `dt` (a
    per-step Λ̄) `"auto"` runs that scan at any length and `"fused"` the backend's scan
    (`"sequential"` on CPU).
    """
    check_ssm_method(method)
    if method == "fused":
        return method
    if method == "auto" and jax.default_backend() == "cpu":
        if states is not None and states > AUTO_CPU_FUSED_ABOVE:
            return "fused"
        if matmul_dtype is not None and AUTO_CPU_FUSED_FOR_BF16:
            return "fused"
        if AUTO_CPU_NATIVE and jax.device_count() == 1 and native_available():
            return "native"
        return AUTO_CPU
    if method == "auto" and _auto_gpu_pallas(states):
        return "pallas"
    return resolve_scan_method(method)


def _auto_gpu_pallas(states: int | None) -> bool:
    return (
        AUTO_GPU_PALLAS_ABOVE is not None
        and states is not None
        and states > AUTO_GPU_PALLAS_ABOVE
        and jax.default_backend() == "gpu"
        and jax.device_count() == 1
        and pallas_available()
    )


def check_ssm_method(method: str) -> None:
    """Raise a `ValueError` unless `method` is `"auto"`, `"fused"` or a scan method. Builds
    nothing (`resolve_ssm_method("auto")` may compile the native kernel on first use)."""
    if method not in ("auto", "fused") and method not in SCAN_METHODS:
        raise ValueError(
            f"scan method must be 'auto', 'fused' or one of {sorted(SCAN_METHODS)}, got {method!r}"
        )


def apply_ssm(
    Lambda_bar: Complex[Array, " P"],
    B_bar: Complex[Array, "P H"],
    C_tilde: Complex[Array, "H PC"],
    D: Float[Array, " H"],
    u: Float[Array, "L H"],
    *,
    conj_sym: bool = True,
    bidirectional: bool = False,
    initial_state: Complex[Array, " P"] | None = None,
    resets: Bool[Array, " L"] | None = None,
    method: str = "auto",
    return_state: bool = False,
):
    """Output sequence of a discretised S5 SSM (Eqs. 7–8). Fixed public API.

    **Arguments:**
    - `Lambda_bar`: discretised diagonal state matrix, complex (P,).
    - `B_bar`: discretised input matrix, complex (P, H).
    - `C_tilde`: output matrix, complex (H, P); bidirectional: (H, 2P) = [C_fwd | C_bwd].
    - `D`: feed-through, real (H,).
    - `u`: input sequence, real (L, H).
    - `conj_sym`: the P states stand for P conjugate pairs; the output is doubled (f = 2).
    - `bidirectional`: add a reverse scan over the same elements, projected by C_bwd.
    - `initial_state`: forward state before u_0 (unidirectional only); zeros if `None`.
    - `resets`: (L,) booleans marking where a new episode starts; neither direction carries
      state across such a boundary.
    - `method`: `"auto"` (on CPU the native scan where it builds, else the chunked scan;
      `"fused"` above
      `AUTO_CPU_FUSED_ABOVE` states L × P × directions or under bfloat16 products; the
      parallel scan elsewhere),
      `"fused"` (blockwise real matrix products and recurrences, reverse-mode
      differentiable only; falls back to `"auto"`'s scan with `resets` or an L without a
      block size) or a scan method of `linear_recurrence` (`"sequential"`, `"parallel"`,
      `"chunked"`, `"native"`, …). With per-step `dt` (`apply_ssm_continuous`), `"auto"` runs
      its scan at any length and `"fused"` the backend's scan (`"sequential"` on CPU).
    - `return_state`: also return the final forward state.

    **Returns:** y of shape (L, H), real; with `return_state`, `(y, final_state)`.
    """
    return _apply(
        Lambda_bar, B_bar, C_tilde, D, u, conj_sym=conj_sym, bidirectional=bidirectional,
        initial_state=initial_state, resets=resets, method=method, return_state=return_state,
    )  # fmt: skip


def _apply(
    Lambda_bar, B_bar, C_tilde, D, u, *, conj_sym=True, bidirectional=False, initial_state=None,
    resets=None, method="auto", return_state=False, matmul_dtype=None,
):  # fmt: skip
    """`apply_ssm`, plus `matmul_dtype`: when given (e.g. bfloat16), the operands of B̃u and C̃x
    are cast to it and the products accumulate in the system's real dtype; Λ̄, the recurrence
    state and y stay in that dtype (complex64 / float32)."""
    Lambda_bar, B_bar, u = jnp.asarray(Lambda_bar), jnp.asarray(B_bar), jnp.asarray(u)
    _check_lambda_b(Lambda_bar, B_bar, u)
    directions = 2 if bidirectional else 1
    states = u.shape[0] * Lambda_bar.shape[0] * directions
    method = resolve_ssm_method(method, states=states, matmul_dtype=matmul_dtype)
    if method == "fused":
        if _fused_supported(u.shape[0], resets):
            _check_c_d(jnp.asarray(C_tilde), jnp.asarray(D), Lambda_bar.shape[0], u.shape[1],
                       bidirectional=bidirectional)  # fmt: skip
            _check_initial_state(initial_state, bidirectional)
            return _apply_fused(
                Lambda_bar, B_bar, C_tilde, D, u, conj_sym=conj_sym,
                bidirectional=bidirectional, initial_state=initial_state,
                return_state=return_state, matmul_dtype=matmul_dtype,
            )  # fmt: skip
        method = resolve_ssm_method("auto")
    if (method == "native" and NATIVE_PLANAR and Lambda_bar.shape[0] >= NATIVE_PLANAR_MIN_P
            and resets is None and initial_state is None):  # fmt: skip
        return _apply_planar(
            Lambda_bar, B_bar, C_tilde, D, u, conj_sym=conj_sym, bidirectional=bidirectional,
            return_state=return_state, matmul_dtype=matmul_dtype,
        )  # fmt: skip
    Bu = _complex_matvecs(u, B_bar, matmul_dtype)
    return _ssm_from_elements(
        Lambda_bar, Bu, Lambda_bar, Bu, C_tilde, D, u,
        conj_sym=conj_sym, bidirectional=bidirectional, initial_state=initial_state,
        resets=resets, method=method, return_state=return_state, matmul_dtype=matmul_dtype,
    )  # fmt: skip


def apply_ssm_continuous(
    Lambda: Complex[Array, " P"],
    B_tilde: Complex[Array, "P H"],
    C_tilde: Complex[Array, "H PC"],
    D: Float[Array, " H"],
    Delta: Float[Array, " P"],
    u: Float[Array, "L H"],
    *,
    discretization: str = "zoh",
    dt: Float[Array, " L"] | None = None,
    conj_sym: bool = True,
    bidirectional: bool = False,
    initial_state: Complex[Array, " P"] | None = None,
    resets: Bool[Array, " L"] | None = None,
    method: str = "auto",
    return_state: bool = False,
):
    """Discretise and apply, with optional per-step timescales for irregular sampling (§6.3).

    Without `dt` this is `discretize` followed by `apply_ssm`. With `dt`, step k of the
    forward scan is discretised with Δ·dt[k] and step k of the backward scan with
    Δ·dt[k+1] (Δ·1 for the last step): `dt` holds the forward multipliers
    [1, τ_1, …, τ_{L−1}] of `step_multipliers`. B̄_k u_k is computed as γ_k ⊙ (B̃ u_k), so no
    (L, P, H) tensor is formed.

    **Arguments:** as `apply_ssm`, with the continuous-time `Lambda` (P,), `B_tilde` (P, H),
    `Delta` (P,), the `discretization` name, and `dt` (L,) per-step multipliers of Δ.

    **Returns:** as `apply_ssm`.
    """
    return _apply_continuous(
        Lambda, B_tilde, C_tilde, D, Delta, u, discretization=discretization, dt=dt,
        conj_sym=conj_sym, bidirectional=bidirectional, initial_state=initial_state,
        resets=resets, method=method, return_state=return_state,
    )  # fmt: skip


def _apply_continuous(
    Lambda, B_tilde, C_tilde, D, Delta, u, *, discretization="zoh", dt=None, conj_sym=True,
    bidirectional=False, initial_state=None, resets=None, method="auto", return_state=False,
    matmul_dtype=None,
):  # fmt: skip
    """`apply_ssm_continuous`, plus `matmul_dtype` (see `_apply`)."""
    Lambda, B_tilde, u = jnp.asarray(Lambda), jnp.asarray(B_tilde), jnp.asarray(u)
    common = dict(
        conj_sym=conj_sym, bidirectional=bidirectional, initial_state=initial_state,
        resets=resets, method=method, return_state=return_state,
    )  # fmt: skip
    if dt is None:
        Lambda_bar, B_bar = discretize(discretization, Lambda, B_tilde, Delta)
        return _apply(Lambda_bar, B_bar, C_tilde, D, u, matmul_dtype=matmul_dtype, **common)
    dt = jnp.asarray(dt)
    _check_lambda_b(Lambda, B_tilde, u, names=("Lambda", "B_tilde"))
    if dt.shape != (u.shape[0],):
        raise ValueError(f"dt must have shape (L,) = ({u.shape[0]},), got {dt.shape}")
    coefficients = get_coefficients(discretization)
    method = resolve_ssm_method(method)
    if method == "fused":  # per-step Λ̄: the scan path
        common["method"] = resolve_scan_method("auto")
    B_tilde_u = _complex_matvecs(u, B_tilde, matmul_dtype)
    Delta = jnp.asarray(Delta)
    Lambda_f, gamma_f = coefficients(Lambda[None, :], dt[:, None] * Delta[None, :])
    if bidirectional:
        dt_bwd = jnp.concatenate([dt[1:], jnp.ones((1,), dt.dtype)])
        Lambda_b, gamma_b = coefficients(Lambda[None, :], dt_bwd[:, None] * Delta[None, :])
    else:
        Lambda_b, gamma_b = Lambda_f, gamma_f
    return _ssm_from_elements(
        Lambda_f, gamma_f * B_tilde_u, Lambda_b, gamma_b * B_tilde_u, C_tilde, D, u,
        matmul_dtype=matmul_dtype, **common,
    )  # fmt: skip


def step_multipliers(t: Float[Array, " L"]) -> Float[Array, " L"]:
    """Forward per-step multipliers of Δ from observation times: [1, t_1 − t_0, …]."""
    t = jnp.asarray(t)
    return jnp.concatenate([jnp.ones((1,), t.dtype), jnp.diff(t)])


def init_state(P: int, dtype=jnp.complex64) -> Complex[Array, " P"]:
    """The zero state x_{−1} before the first input."""
    return jnp.zeros((P,), dtype)


def ssm_step(
    Lambda_bar: Complex[Array, " P"],
    B_bar: Complex[Array, "P H"],
    C_tilde: Complex[Array, "H P"],
    D: Float[Array, " H"],
    x: Complex[Array, " P"],
    u_k: Float[Array, " H"],
    *,
    conj_sym: bool = True,
) -> tuple[Complex[Array, " P"], Float[Array, " H"]]:
    """One recurrent step for online use: x' = Λ̄x + B̄u_k, y_k = f·Re(C̃x') + D⊙u_k.

    Equal to the k-th output of `apply_ssm` when `x` is the state after step k−1.
    Unidirectional only: a bidirectional model needs the future inputs.
    """
    Lambda_bar, B_bar, C_tilde = jnp.asarray(Lambda_bar), jnp.asarray(B_bar), jnp.asarray(C_tilde)
    u_k = jnp.asarray(u_k)
    if u_k.ndim != 1:
        raise ValueError(f"u_k must have shape (H,), got {u_k.shape}")
    _check_lambda_b(Lambda_bar, B_bar, u_k[None])
    _check_c_d(C_tilde, D, Lambda_bar.shape[0], u_k.shape[0], bidirectional=False)
    return _step_from_input(
        Lambda_bar, _complex_matvecs(u_k[None], B_bar)[0], C_tilde, D, x, u_k, conj_sym=conj_sym
    )


def _step_from_input(Lambda_bar, Bu, C_tilde, D, x, u_k, *, conj_sym, matmul_dtype=None):
    """One recurrent step from the input term B̄u_k (P,): x' = Λ̄x + B̄u_k and
    y_k = f·Re(C̃x') + D⊙u_k, with the products and casts of `_ssm_from_elements` (so a step
    equals the scan's step k under both precision policies)."""
    x_new = Lambda_bar * x + Bu
    y = _project(x_new[None], C_tilde, matmul_dtype, _factor(conj_sym))[0]
    if matmul_dtype is not None:  # the feed-through in the state's real dtype
        u_k = u_k.astype(y.dtype)
    return x_new, y + jnp.asarray(D) * u_k


def _continuous_step(
    Lambda, B_tilde, C_tilde, D, Delta, x, u_k, *, discretization, conj_sym, dt=None,
    matmul_dtype=None,
):  # fmt: skip
    """One step of the continuous-time system, discretised as `_apply_continuous` does: with
    Δ (B̄ = γB̃, B̄u_k) without `dt`, and with Δ·dt (γ ⊙ B̃u_k) for a per-step multiplier `dt`."""
    if dt is None:
        Lambda_bar, B_bar = discretize(discretization, Lambda, B_tilde, Delta)
        Bu = _complex_matvecs(u_k[None], B_bar, matmul_dtype)[0]
    else:
        Delta = jnp.asarray(Delta) * jnp.asarray(dt, jnp.asarray(Delta).dtype)
        Lambda_bar, gamma = get_coefficients(discretization)(Lambda, Delta)
        Bu = gamma * _complex_matvecs(u_k[None], B_tilde, matmul_dtype)[0]
    return _step_from_input(
        Lambda_bar, Bu, C_tilde, D, x, u_k, conj_sym=conj_sym, matmul_dtype=matmul_dtype
    )


def _ssm_from_elements(
    Lambda_f, Bu_f, Lambda_b, Bu_b, C_tilde, D, u,
    *, conj_sym, bidirectional, initial_state, resets, method, return_state, matmul_dtype=None,
):  # fmt: skip
    C_tilde, D = jnp.asarray(C_tilde), jnp.asarray(D)
    H = u.shape[1]
    P = Bu_f.shape[1]
    _check_c_d(C_tilde, D, P, H, bidirectional=bidirectional)
    _check_initial_state(initial_state, bidirectional)
    xs, final = linear_recurrence(
        Lambda_f, Bu_f, initial_state=initial_state, resets=resets, method=method
    )
    if bidirectional:
        # Episode k starts at a reset: the backward scan restarts at the step before it.
        resets_bwd = None
        if resets is not None:
            resets_bwd = jnp.concatenate([jnp.asarray(resets)[1:], jnp.zeros((1,), jnp.bool_)])
        xs_b, _ = linear_recurrence(Lambda_b, Bu_b, reverse=True, resets=resets_bwd, method=method)
        y = _project_states((xs, xs_b), C_tilde, matmul_dtype, _factor(conj_sym))
    else:
        y = _project(xs, C_tilde, matmul_dtype, _factor(conj_sym))
    y = _feed_through(y, D, u)
    return (y, final) if return_state else y


def _feed_through(y, D, u):
    """y + D ⊙ u, the feed-through in the state's real dtype (y already carries f, the
    conjugate-symmetry factor, from its product's weight: `_output_weight`). A narrower u
    (bfloat16 under mixed precision) is widened inside the product, exactly, and kept narrow as
    the residual of ∂D: no float32 copy of it is written (`_products.scale_columns`)."""
    return y + scale_columns(u, D)  # ∂D as a contraction over time: `_products.scale_columns`


def _apply_planar(Lambda_bar, B_bar, C_tilde, D, u, *, conj_sym, bidirectional, return_state,
                  matmul_dtype):  # fmt: skip
    """`_apply` with the native kernel on the products' own layout (`native_planar_states`):
    B̃u comes out of its product as real rows [Re | Im] and the states go into C̃'s product the
    same way, with no complex arrays between them. Same results as the complex path (the
    same recurrence and products, in another memory layout); a zero initial state, no resets.
    Under bfloat16 products (one CPU device) the scan and both products are one custom VJP,
    `s5jax.core._mixed.planar_ssm`, with the same values and fewer passes."""
    C_tilde, D = jnp.asarray(C_tilde), jnp.asarray(D)
    P, H = B_bar.shape
    _check_c_d(C_tilde, D, P, H, bidirectional=bidirectional)
    dtype = B_bar.real.dtype
    if not return_state and _mixed.applies(matmul_dtype, dtype):  # one VJP, fewer passes
        y = _mixed.planar_ssm(
            u, _input_weight(B_bar), planar_lanes(Lambda_bar, dtype),
            _output_weight(C_tilde, _factor(conj_sym)), bidirectional,
        )  # fmt: skip
        return _feed_through(y, D, u)
    X = native_planar_states(Lambda_bar, _planar_matvecs(u, B_bar, matmul_dtype), bidirectional)
    y = _weight_product(X, _output_weight(C_tilde, _factor(conj_sym)), matmul_dtype,
                        B_bar.real.dtype)  # fmt: skip
    y = _feed_through(y, D, u)
    if not return_state:
        return y
    re_im = X.shape[1] // 2  # the forward direction's state: columns :P and re_im:re_im + P
    return y, jax.lax.complex(X[-1, :P], X[-1, re_im : re_im + P])


def _complex_matvecs(u, M, matmul_dtype=None):
    """M u_k for every row u_k of real `u` (L, H) and complex `M` (P, H): complex (L, P)."""
    b = _planar_matvecs(u, M, matmul_dtype)
    P = M.shape[0]
    return jax.lax.complex(b[:, :P], b[:, P:])


def _planar_matvecs(u, M, matmul_dtype=None):
    """[Re(M u_k) | Im(M u_k)] for every row of real `u` (L, H): real (L, 2P), by one product
    u @ [Re Mᵀ | Im Mᵀ] (u is read once; see `_project_states`)."""
    acc = M.real.dtype
    if matmul_dtype is None:
        u = u.astype(acc)
    return _weight_product(u, _input_weight(M), matmul_dtype, acc)


def _input_weight(M):
    """[Re Mᵀ | Im Mᵀ] (H, 2P) for complex `M` (P, H): u @ it = [Re(Mu) | Im(Mu)] row-wise."""
    return jnp.concatenate([M.real.T, M.imag.T], axis=1)


def _output_weight(C, f=1.0):
    """f·[Re Cᵀ; −Im Cᵀ] (2nP, H) for complex `C` (H, nP): [Re x | Im x] @ it = f·Re(C x).

    The conjugate-symmetry factor f = 2 goes into this small weight rather than onto the
    product's (L, H) output: the same values (a power of two scales exactly, in float32 and
    bfloat16 alike), without a pass over the output forward and two over its cotangent
    backward (one per gradient product), which XLA does not fold into the products."""
    W = jnp.concatenate([C.real.T, -C.imag.T], axis=0)
    return W if f == 1.0 else f * W


def _project(xs, C, matmul_dtype=None, f=1.0):
    """f·Re(C x_k) for every row of complex `xs` (L, P) and complex `C` (H, P): real (L, H)."""
    return _project_states((xs,), C, matmul_dtype, f)


def _project_states(xs, C, matmul_dtype=None, f=1.0):
    """f·Σ_d Re(C_d x_{d,k}) for complex states `xs` = (x_1, …, x_n), each (L, P), and complex
    `C` = [C_1 … C_n] (H, nP), as one product [Re x_1 … Re x_n | Im x_1 … Im x_n] @
    f·[Re Cᵀ; −Im Cᵀ]: real (L, H).

    One product instead of 2n: each writes or (backward) reads an (L, H) array, which costs
    more than the product itself when P is small. On a 2-core Intel Xeon (2026-11-27, medians
    of 21 interleaved, `"chunked"`, forward+backward under `jax.vmap`), this and the one
    product of `_complex_matvecs` took a bidirectional SSM at ListOps' shape (batch 8, L 2048,
    H 128, P 8) from 19.5 to 12.0 ms, and a unidirectional one at sMNIST's (batch 8, L 784,
    H 96, P 64) from 9.6 to 7.7 ms.
    """
    acc = xs[0].real.dtype
    X = jnp.concatenate([x.real for x in xs] + [x.imag for x in xs], axis=1)
    return _weight_product(X, _output_weight(C, f), matmul_dtype, acc)


def _matmul(a, b, matmul_dtype, acc_dtype):
    """a @ b; with `matmul_dtype` (e.g. bfloat16) the operands are cast to it and the product
    accumulates in (and is returned as) `acc_dtype`. The plain product: for the fused path's
    own forward and backward passes, which autodiff never sees."""
    if matmul_dtype is None:
        return a @ b
    return jnp.matmul(
        a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=acc_dtype
    )


def _weight_product(a, b, matmul_dtype, acc_dtype):
    """`_matmul` for a 2-D `a` (L, K) and a weight `b` (K, N) on the autodiff paths: the
    product with a vmap-friendly gradient (`s5jax.core._products.matmul`), the cast inside it
    (the float32 weight's gradient is not rounded to `matmul_dtype`)."""
    if matmul_dtype is None:
        return matmul(a, b)
    return matmul(a, b, acc_dtype, operand_dtype=matmul_dtype)


def _factor(conj_sym) -> float:
    """f in y = f·Re(C̃x) + D⊙u: 2 with conjugate symmetry (the other half's contribution)."""
    return 2.0 if conj_sym else 1.0


def _check_lambda_b(Lambda, B, u, names=("Lambda_bar", "B_bar")) -> None:
    lam, b = names
    if Lambda.ndim != 1:
        raise ValueError(f"{lam} must have shape (P,), got {Lambda.shape}")
    if not jnp.issubdtype(Lambda.dtype, jnp.complexfloating):
        raise ValueError(f"{lam} must be complex, got dtype {Lambda.dtype}")
    (P,) = Lambda.shape
    if u.ndim != 2:
        raise ValueError(f"u must have shape (L, H), got {u.shape}")
    if jnp.issubdtype(u.dtype, jnp.complexfloating) or not jnp.issubdtype(u.dtype, jnp.inexact):
        raise ValueError(f"u must be a real floating array, got dtype {u.dtype}")
    H = u.shape[1]
    if B.shape != (P, H):
        raise ValueError(f"{b} must have shape (P, H) = ({P}, {H}), got {B.shape}")


def _check_initial_state(initial_state, bidirectional) -> None:
    if bidirectional and initial_state is not None:
        raise ValueError(
            "initial_state is only defined for a unidirectional SSM (a bidirectional one "
            "also scans from the end); pass bidirectional=False or initial_state=None"
        )


def _check_c_d(C, D, P, H, *, bidirectional) -> None:
    width = 2 * P if bidirectional else P
    if C.shape != (H, width):
        what = "(H, 2P) = [C_fwd | C_bwd]" if bidirectional else "(H, P)"
        raise ValueError(f"C_tilde must have shape {what} = ({H}, {width}), got {C.shape}")
    if D.shape != (H,):
        raise ValueError(f"D must have shape (H,) = ({H},), got {D.shape}")


# --- the fused path: B̃u, the recurrences and C̃x blockwise, in real planes ---------------------
#
# `method="fused"` computes the same y as the scan path, for a
# time-invariant Λ̄, without complex arrays and without (L, P) intermediates in memory:
#
# - planes: a complex vector z (P,) is held as a real (2, P) array [Re z; Im z], so
#   B̄u = u @ W_B with W_B = [Re B̄ᵀ | Im B̄ᵀ] (H, 2P) and f·Re(C x) = [Re x | Im x] @ W_C with
#   W_C = f·[Re Cᵀ; −Im Cᵀ] (2P, H): real matrix products, the factor f and the sign of the
#   imaginary part folded into the weight.
# - blocks: time is cut into blocks of T steps. Per block, one matrix product makes B̄u for the
#   block, a loop over its T steps runs the recurrence in place on that (B, T, 2, P) buffer
#   (all examples of a batch side by side), and one product makes the block's C̃x. Each block's
#   arrays stay in cache; only u, y and (backward) their cotangents are full-length arrays.
#   Bidirectional: the forward scan of block i and the backward scan of block N−1−i share one
#   loop over the T steps. Each block's B̄u is made once and kept for its second use, in an
#   (B, L, 2P) buffer, when that takes at most `FUSED_REUSE_BYTES`; the buffer is also a
#   residual of the VJP, so the backward pass makes no B̄u. Above the limit (long sequences,
#   large batches) B̄u is made twice per pass, once per direction, to keep memory at O(block).
# - gradient: a custom VJP. The backward pass keeps only the state entering each block, reruns
#   each block's recurrence from it and runs the adjoint recurrence λ_k = ∂y-part + Λ̄ᴴ λ_{k±1}
#   in the same loop (the backward-direction scan's adjoint runs forward in time; its state
#   entering each block comes from a pre-pass of block sums, whose ∂x are kept for the main
#   loop under the same `FUSED_REUSE_BYTES` rule). ∂Λ̄ = Σ_k conj(x_{k∓1}) λ_k.
# - batches: the kernels carry a `custom_vmap` rule, so under `jax.vmap` (the model's batch)
#   one call handles the whole batch with matrix products over B·T rows. Weight gradients are
#   computed per example (the VJP of one example), as `jax.vmap(jax.grad(...))` requires.
#
# Supported: conj_sym, bidirectional, initial_state, return_state, any L with a block size (see
# `_block_size`). Otherwise (`resets`, per-step Δ via `dt`, or an L with no block size) the scan
# path runs. Reverse mode only (custom VJP): use a scan method for `jax.jvp`, with
# `_products.VMAP_FRIENDLY_GRADIENT = False` (the products B̄u and C̃x have a custom VJP too).

FUSED_BLOCK = 256
"""Largest block of the fused path (steps per block). On the 2-core CPU, at the layer
benchmark's shape (batch 8, H 128, P 128, L 4096), blocks of 64, 128 and 512 steps were within
the noise (±10 %) of 256 in interleaved runs."""

FUSED_REUSE_BYTES = 64 * 2**20
"""Bidirectional fused path: B̄u of the whole sequence (B·L·2P values, forward pass) and the
backward scan's ∂x (the same size, backward pass) are kept for their second use when each takes
at most this many bytes, else made again: one matrix product per block less in each pass. The
kept B̄u is also saved for the backward pass (which then makes none: one product per block
less again), so training holds one such buffer per layer from forward to backward. At the
layer benchmark's shape (batch 8, L 4096, P 128 stored: 32 MiB) on the AVX2 AMD host a layer's
forward pass took a median 55.4 ms kept vs 65.8 ms made again, its backward pass 152.9 vs
163.8 ms (`benchmarks/fused_reuse.py`, 31 interleaved calls)."""


def _cmul(a, z):
    """a ⊙ z for complex vectors in planes (..., 2, P) (a broadcasts over z's leading axes)."""
    a = a.reshape((1,) * (z.ndim - a.ndim) + a.shape)
    a_re, a_im = a[..., 0:1, :], a[..., 1:2, :]
    return a_re * z + jnp.concatenate([-a_im, a_im], axis=-2) * jnp.flip(z, axis=-2)


def _affine(a, x, b):
    """a ⊙ x + b in planes, written as (Re a·x + b) + (±Im a)·flip(x): every addition has
    one product operand, so the compiler's multiply-add contraction is unambiguous and a
    batch gives bit-for-bit the results of its examples run one by one."""
    a = a.reshape((1,) * (x.ndim - a.ndim) + a.shape)
    a_re, a_im = a[..., 0:1, :], a[..., 1:2, :]
    return (a_re * x + b) + jnp.concatenate([-a_im, a_im], axis=-2) * jnp.flip(x, axis=-2)


def _conj(a):
    return jnp.concatenate([a[..., 0:1, :], -a[..., 1:2, :]], axis=-2)


def _conj_dot(x, lam, axis=None):
    """conj(x) ⊙ λ in planes (…, 2, P), summed over `axis` when given."""
    x_re, x_im = x[..., 0, :], x[..., 1, :]
    l_re, l_im = lam[..., 0, :], lam[..., 1, :]
    re, im = x_re * l_re + x_im * l_im, x_re * l_im - x_im * l_re
    if axis is not None:
        re, im = jnp.sum(re, axis=axis), jnp.sum(im, axis=axis)
    return jnp.stack([re, im], axis=-2)


def _powers(a, n):
    """[a⁰, a¹, …, a^(n−1)] in planes, (n, 2, P), by doubling."""
    P = a.shape[-1]
    one = jnp.concatenate([jnp.ones((1, P), a.dtype), jnp.zeros((1, P), a.dtype)])
    pw, a_k = jnp.stack([one, a]), _cmul(a, a)
    while pw.shape[0] < n:
        pw = jnp.concatenate([pw, _cmul(a_k, pw)])
        a_k = _cmul(a_k, a_k)
    return pw[:n]


def _block_size(L: int) -> int | None:
    """Steps per block: L itself up to `FUSED_BLOCK`, else the largest divisor of L in
    [FUSED_BLOCK/4, FUSED_BLOCK]; None when there is none (the scan path is used)."""
    largest = FUSED_BLOCK
    if L <= largest:
        return L
    for T in range(largest, largest // 4 - 1, -1):
        if L % T == 0:
            return T
    return None


def _rows(z, start, size):
    return jax.lax.dynamic_slice_in_dim(z, start, size, axis=1)


def _put_rows(z, rows, start):
    return jax.lax.dynamic_update_slice_in_dim(z, rows, start, axis=1)


def _index(z, i, axis):
    return jax.lax.dynamic_index_in_dim(z, i, axis=axis, keepdims=False)


_NO_WRAP = (
    {"allow_negative_indices": False}
    if "allow_negative_indices" in inspect.signature(jax.lax.dynamic_index_in_dim).parameters
    else {}
)


def _dyn_row(buf, t):
    """buf[:, t] for a traced t known to be in range (no negative-index wrapping: one op less
    per step of the loop)."""
    return jax.lax.dynamic_index_in_dim(buf, t, axis=1, keepdims=False, **_NO_WRAP)


def _recur(a_fwd, b_fwd, x_fwd, a_bwd, b_bwd, x_bwd):
    """One loop over a block's T steps, in place: x ← a_fwd ⊙ x + b_fwd[:, t] overwrites
    b_fwd[:, t] for t = 0 … T−1, and x ← a_bwd ⊙ x + b_bwd[:, s] overwrites b_bwd[:, s] for
    s = T−1 … 0. b_* (B, T, k, 2, P), a_* (k, 2, P), x_* (B, k, 2, P) the states before the
    block; either direction may be None. Returns (states_fwd, last_fwd, states_bwd, last_bwd)."""
    T = (b_fwd if b_fwd is not None else b_bwd).shape[1]

    def step(t, carry):
        x_f, buf_f, x_b, buf_b = carry
        if buf_f is not None:
            x_f = _affine(a_fwd, x_f, _dyn_row(buf_f, t))
            buf_f = jax.lax.dynamic_update_index_in_dim(buf_f, x_f, t, axis=1)
        if buf_b is not None:
            s = T - 1 - t
            x_b = _affine(a_bwd, x_b, _dyn_row(buf_b, s))
            buf_b = jax.lax.dynamic_update_index_in_dim(buf_b, x_b, s, axis=1)
        return x_f, buf_f, x_b, buf_b

    x_fwd, b_fwd, x_bwd, b_bwd = jax.lax.fori_loop(0, T, step, (x_fwd, b_fwd, x_bwd, b_bwd))
    return b_fwd, x_fwd, b_bwd, x_bwd


def _recur_bidirectional_adjoint(a, g, dx, s_f, s_b, l_b, l_f):
    """The four recurrences of a block of the bidirectional VJP in one loop over its T steps:
    forward in time x_f (Λ̄, from s_f) and the backward scan's adjoint λ_b (Λ̄ᴴ, from l_b);
    backward in time x_b (Λ̄, from s_b) and the forward scan's adjoint λ_f (Λ̄ᴴ, from l_f).
    g (B, T, 1, 2, P) is B̄u (used twice: x_f overwrites it, x_b a copy); dx (B, T, 2, 2, P)
    holds [∂x_f, ∂x_b] and is overwritten by [λ_f, λ_b]. Returns x_f, x_b (B, T, 2, P), the
    λ buffer and λ_f at the block's first step."""
    T = g.shape[1]
    a_h = _conj(a)[None]
    a = a[None]

    def lane(z, t, d):  # z[:, t, d] as (B, 2, P)
        return _dyn_row(z, t)[:, d]

    def put(z, x, t, d):
        return jax.lax.dynamic_update_slice(z, x[:, None, None], (0, t, d, 0, 0))

    def step(t, carry):
        x_f, buf_f, x_b, buf_b, lb, lf, lam = carry
        s = T - 1 - t
        x_f = _affine(a, x_f, _dyn_row(buf_f, t)[:, 0])
        buf_f = put(buf_f, x_f, t, 0)
        lb = _affine(a_h, lb, lane(lam, t, 1))
        lam = put(lam, lb, t, 1)
        x_b = _affine(a, x_b, _dyn_row(buf_b, s)[:, 0])
        buf_b = put(buf_b, x_b, s, 0)
        lf = _affine(a_h, lf, lane(lam, s, 0))
        lam = put(lam, lf, s, 0)
        return x_f, buf_f, x_b, buf_b, lb, lf, lam

    init = (s_f, g, s_b, g, l_b, l_f, dx)
    _, buf_f, _, buf_b, _, l_f, lam = jax.lax.fori_loop(0, T, step, init)
    return buf_f[:, :, 0], buf_b[:, :, 0], lam, l_f


def _fused_forward(U, W_B, a, W_Cf, W_Cb, D, x0, T, mm=None):
    """Batched forward pass. U (B, L, H); a (2, P); x0 (B, 2, P). Returns y (B, L, H), the
    states entering each block (N, B, 2, P) of each direction, and the final forward state.
    With `mm` (e.g. bfloat16) the products take operands in that dtype (see `_apply`)."""
    B, L, _ = U.shape
    P = a.shape[-1]
    N = L // T
    a1 = a[None]
    dtype = a.dtype

    def gemm(x, w):
        return _matmul(x, w, mm, dtype)

    if W_Cb is None:

        def block(c, carry):
            x, Y, S = carry
            S = jax.lax.dynamic_update_index_in_dim(S, x, c, axis=0)
            u = _rows(U, c * T, T)
            g = gemm(u, W_B).reshape(B, T, 1, 2, P)
            xs, x, _, _ = _recur(a1, g, x[:, None], None, None, None)
            x = x[:, 0]
            y = gemm(xs.reshape(B, T, 2 * P), W_Cf) + u.astype(dtype) * D[None, None]
            return x, _put_rows(Y, y, c * T), S

        S = jnp.zeros((N, B, 2, P), dtype)
        x, Y, S = jax.lax.fori_loop(0, N, block, (x0, jnp.zeros(U.shape, dtype), S))
        return Y, S, S[:0], x, jnp.zeros((B, 0, 2 * P), dtype)

    # Block c's B̄u is used twice: by the forward scan at step c and by the backward scan at step
    # N−1−c. The first half of the steps makes both of its blocks' B̄u and keeps a copy in G (an
    # (B, L, 2P) buffer) for the second half, which makes none: one product per block instead of
    # two. Above `FUSED_REUSE_BYTES` (e.g. Path-X training) G is not kept and B̄u is made twice.
    reuse = N > 1 and B * L * 2 * P * jnp.dtype(dtype).itemsize <= FUSED_REUSE_BYTES
    half = (N + 1) // 2

    def pair(i, carry, load):  # forward scan over block i, backward scan over block N−1−i
        x_f, x_b, Y, S_f, S_b, G = carry
        c_f, c_b = i, N - 1 - i
        S_f = jax.lax.dynamic_update_index_in_dim(S_f, x_f, c_f, axis=0)
        S_b = jax.lax.dynamic_update_index_in_dim(S_b, x_b, c_b, axis=0)
        if load:  # both blocks' B̄u were made in the first half
            g_f, g_b = _rows(G, c_f * T, T), _rows(G, c_b * T, T)
        else:
            g_f = gemm(_rows(U, c_f * T, T), W_B)
            g_b = g_f if N == 1 else gemm(_rows(U, c_b * T, T), W_B)
            if reuse:
                G = _put_rows(_put_rows(G, g_f, c_f * T), g_b, c_b * T)
        g_f, g_b = g_f.reshape(B, T, 1, 2, P), g_b.reshape(B, T, 1, 2, P)
        xs_f, x_f, xs_b, x_b = _recur(a1, g_f, x_f[:, None], a1, g_b, x_b[:, None])
        y_f = _rows(Y, c_f * T, T) + gemm(xs_f.reshape(B, T, 2 * P), W_Cf)
        Y = _put_rows(Y, y_f, c_f * T)
        y_b = _rows(Y, c_b * T, T) + gemm(xs_b.reshape(B, T, 2 * P), W_Cb)
        Y = _put_rows(Y, y_b, c_b * T)
        return x_f[:, 0], x_b[:, 0], Y, S_f, S_b, G

    S = jnp.zeros((N, B, 2, P), dtype)
    G = jnp.zeros((B, L if reuse else 0, 2 * P), dtype)
    carry = (x0, jnp.zeros_like(x0), U.astype(dtype) * D[None, None], S, S, G)
    if reuse:
        carry = jax.lax.fori_loop(0, half, functools.partial(pair, load=False), carry)
        carry = jax.lax.fori_loop(half, N, functools.partial(pair, load=True), carry)
    else:
        carry = jax.lax.fori_loop(0, N, functools.partial(pair, load=False), carry)
    x_f, _, Y, S_f, S_b, G = carry
    return Y, S_f, S_b, x_f, G


UNROLL_BATCH = 16
"""Up to this batch size the per-example weight gradients are one matrix product per example
(XLA's CPU backend runs those with its fast GEMM; a batched product takes a slower path)."""


def _weight_grads(dW_Ct, dW_B, xs, lam, u, dy, mm):
    """Add one block's per-example Σ_t dy_t x_tᵀ (to each dW_Cᵀ (B, H, 2P), one per x in the
    tuple `xs`) and Σ_t u_t λ_tᵀ (to dW_B (B, H, 2P))."""
    dy_t, u_t = jnp.swapaxes(dy, 1, 2), jnp.swapaxes(u, 1, 2)  # (B, H, T): plain products
    acc = dW_B.dtype
    if dy.shape[0] > UNROLL_BATCH:

        def prod(a, b):
            return _matmul(a, b, mm, acc)
    else:

        def prod(a, b):
            return jnp.stack([_matmul(a[i], b[i], mm, acc) for i in range(a.shape[0])])

    dW_Ct = tuple(w + prod(dy_t, x) for w, x in zip(dW_Ct, xs, strict=True))
    return dW_Ct, dW_B + prod(u_t, lam)


def _fused_backward(U, W_B, a, W_Cf, W_Cb, D, S_f, S_b, G, dY, d_final, T, mm=None):
    """Batched VJP of `_fused_forward` (per-example weight cotangents, leading axis B). G: the
    forward pass's B̄u (B, L, 2P) when it kept it, else (B, 0, 2P) (made again here)."""
    B, L, H = U.shape
    P = a.shape[-1]
    N = L // T
    dtype = a.dtype

    def gemm(x, w):
        return _matmul(x, w, mm, dtype)

    a_h = _conj(a)
    bidirectional = W_Cb is not None
    W_C = jnp.concatenate([W_Cf, W_Cb], axis=0) if bidirectional else W_Cf
    n_dir = 2 if bidirectional else 1
    zero = jnp.zeros((B, 2, P), dtype)
    lam_in = jnp.zeros((N, B, 2, P), dtype)
    # ∂x of the backward scan for block c (B, T, 2P): made by the pre-pass below and kept for
    # the main loop when within `FUSED_REUSE_BYTES`, else made again there.
    keep = (
        bidirectional and N > 1 and B * L * 2 * P * jnp.dtype(dtype).itemsize <= FUSED_REUSE_BYTES
    )
    DX_b = jnp.zeros((B, L, 2 * P) if keep else (0,), dtype)
    if bidirectional and N > 1:
        # The backward scan's adjoint runs forward in time: its value entering block c is
        # made from each earlier block's sum Σ_t (Λ̄ᴴ)^(T−1−t) ∂x_t (a pre-pass over blocks).
        powers = _powers(a_h, T)
        weights = jnp.flip(powers, axis=0)[None]
        a_h_T = _cmul(a_h, powers[T - 1])

        def entering(c, carry):
            lam, lam_in, DX_b = carry
            dx_b = gemm(_rows(dY, c * T, T), W_Cb.T)
            if keep:
                DX_b = _put_rows(DX_b, dx_b, c * T)
            lam = _affine(a_h_T, lam, jnp.sum(_cmul(weights, dx_b.reshape(B, T, 2, P)), axis=1))
            return lam, jax.lax.dynamic_update_index_in_dim(lam_in, lam, c + 1, axis=0), DX_b

        _, lam_in, DX_b = jax.lax.fori_loop(0, N - 1, entering, (zero, lam_in, DX_b))
        if keep:  # the last block's (its sum enters no later block)
            last = (N - 1) * T
            DX_b = _put_rows(DX_b, gemm(_rows(dY, last, T), W_Cb.T), last)

    def block(i, carry):
        lam_f, dA, dW_C, dW_B, dD, dU = carry
        c = N - 1 - i
        u, dy = _rows(U, c * T, T), _rows(dY, c * T, T)
        g = (_rows(G, c * T, T) if G.shape[1] else gemm(u, W_B)).reshape(B, T, 1, 2, P)
        if keep:
            dx_f = gemm(dy, W_Cf.T).reshape(B, T, 1, 2, P)
            dx = jnp.concatenate([dx_f, _rows(DX_b, c * T, T).reshape(B, T, 1, 2, P)], axis=2)
        else:
            dx = gemm(dy, W_C.T).reshape(B, T, n_dir, 2, P)
        if d_final is not None:  # the cotangent of the returned final state enters at L−1
            last = jnp.where(c == N - 1, d_final, jnp.zeros_like(d_final))
            dx = dx.at[:, T - 1, 0].add(last)
        s_f = _index(S_f, c, 0)
        if bidirectional:
            s_b, l_b = _index(S_b, c, 0), _index(lam_in, c, 0)
            xs_f, xs_b, dx, lam_f = _recur_bidirectional_adjoint(a, g, dx, s_f, s_b, l_b, lam_f)
            lams_f, lams_b = dx[:, :, 0], dx[:, :, 1]
            dA = (
                dA
                + _conj_dot(xs_f[:, :-1], lams_f[:, 1:], 1) + _conj_dot(s_f, lams_f[:, 0])
                + _conj_dot(xs_b[:, 1:], lams_b[:, :-1], 1) + _conj_dot(s_b, lams_b[:, -1])
            )  # fmt: skip
            xs = (xs_f.reshape(B, T, 2 * P), xs_b.reshape(B, T, 2 * P))
            lam = (lams_f + lams_b).reshape(B, T, 2 * P)
        else:
            xs_f, _, lams_f, last_b = _recur(
                a[None], g, s_f[:, None], a_h[None], dx, lam_f[:, None]
            )
            lam_f = last_b[:, 0]
            xs_f, lams_f = xs_f[:, :, 0], lams_f[:, :, 0]
            dA = dA + _conj_dot(xs_f[:, :-1], lams_f[:, 1:], 1) + _conj_dot(s_f, lams_f[:, 0])
            xs = (xs_f.reshape(B, T, 2 * P),)
            lam = lams_f.reshape(B, T, 2 * P)
        dW_C, dW_B = _weight_grads(dW_C, dW_B, xs, lam, u, dy, mm)
        dD = dD + jnp.sum(u.astype(dtype) * dy, axis=1)
        du = (gemm(lam, W_B.T) + dy * D[None, None]).astype(U.dtype)
        return lam_f, dA, dW_C, dW_B, dD, _put_rows(dU, du, c * T)

    init = (
        zero, zero, (jnp.zeros((B, H, 2 * P), dtype),) * n_dir,
        jnp.zeros((B, *W_B.shape), dtype),
        jnp.zeros((B, H), dtype), jnp.zeros_like(U),
    )  # fmt: skip
    lam_f, dA, dW_C, dW_B, dD, dU = jax.lax.fori_loop(0, N, block, init)
    dW_Cf, *dW_Cb = (jnp.swapaxes(w, 1, 2) for w in dW_C)  # back from (B, H, 2P)
    dW_Cb = dW_Cb[0] if bidirectional else None
    return dU, dW_B, dA, dW_Cf, dW_Cb, dD, _cmul(a_h, lam_f)


def _at_front(z, batched, n):
    return z if batched else jnp.broadcast_to(z, (n, *z.shape))


def _generic_batching(fun, n, in_batched, args):
    """vmap of the unbatched kernel (e.g. weights batched too): correct, not the fast path."""
    axes = tuple(
        None if x is None else (0 if b else None) for x, b in zip(args, in_batched, strict=True)
    )
    out = jax.vmap(fun, in_axes=axes, axis_size=n)(*args)
    return out, jax.tree_util.tree_map(lambda _: True, out)


@functools.cache
def _fused_ssm(T: int, return_state: bool, mm=None):
    """The custom-VJP, custom-vmap function y, x_final = f(U, W_B, a, W_Cf, W_Cb, D, x0) of one
    example, for blocks of T steps (W_Cb None: unidirectional), products in `mm` (or exact)."""

    @custom_vmap
    def forward(U, W_B, a, W_Cf, W_Cb, D, x0):
        Y, S_f, S_b, x, G = _fused_forward(U[None], W_B, a, W_Cf, W_Cb, D, x0[None], T, mm)
        return Y[0], S_f[:, 0], S_b[:, 0], x[0], G[0]

    @forward.def_vmap
    def _forward_batched(n, in_batched, U, W_B, a, W_Cf, W_Cb, D, x0):
        args = (U, W_B, a, W_Cf, W_Cb, D, x0)
        if any(jax.tree_util.tree_leaves(in_batched[1:6])):
            return _generic_batching(forward.fun, n, in_batched, args)
        U, x0 = _at_front(U, in_batched[0], n), _at_front(x0, in_batched[6], n)
        Y, S_f, S_b, x, G = _fused_forward(U, W_B, a, W_Cf, W_Cb, D, x0, T, mm)
        return (Y, jnp.moveaxis(S_f, 1, 0), jnp.moveaxis(S_b, 1, 0), x, G), (True,) * 5

    @custom_vmap
    def backward(U, W_B, a, W_Cf, W_Cb, D, S_f, S_b, G, dY, d_final):
        out = _fused_backward(
            U[None], W_B, a, W_Cf, W_Cb, D, S_f[:, None], S_b[:, None], G[None], dY[None],
            None if d_final is None else d_final[None], T, mm,
        )  # fmt: skip
        return jax.tree_util.tree_map(lambda z: z[0], out)

    @backward.def_vmap
    def _backward_batched(n, in_batched, U, W_B, a, W_Cf, W_Cb, D, S_f, S_b, G, dY, d_final):
        args = (U, W_B, a, W_Cf, W_Cb, D, S_f, S_b, G, dY, d_final)
        if any(jax.tree_util.tree_leaves(in_batched[1:6])):
            return _generic_batching(backward.fun, n, in_batched, args)
        b = dict(zip(("U", "S_f", "S_b", "G", "dY", "d"), (0, 6, 7, 8, 9, 10), strict=True))
        out = _fused_backward(
            _at_front(U, in_batched[b["U"]], n), W_B, a, W_Cf, W_Cb, D,
            jnp.moveaxis(_at_front(S_f, in_batched[b["S_f"]], n), 0, 1),
            jnp.moveaxis(_at_front(S_b, in_batched[b["S_b"]], n), 0, 1),
            _at_front(G, in_batched[b["G"]], n), _at_front(dY, in_batched[b["dY"]], n),
            None if d_final is None else _at_front(d_final, in_batched[b["d"]], n), T, mm,
        )  # fmt: skip
        return out, jax.tree_util.tree_map(lambda _: True, out)

    @jax.custom_vjp
    def ssm(U, W_B, a, W_Cf, W_Cb, D, x0):
        Y, _, _, x, _ = forward(U, W_B, a, W_Cf, W_Cb, D, x0)
        return Y, x

    def ssm_fwd(U, W_B, a, W_Cf, W_Cb, D, x0):
        Y, S_f, S_b, x, G = forward(U, W_B, a, W_Cf, W_Cb, D, x0)
        return (Y, x), (U, W_B, a, W_Cf, W_Cb, D, S_f, S_b, G)

    def ssm_bwd(residuals, cotangents):
        dY, d_final = cotangents
        return backward(*residuals, dY, d_final if return_state else None)

    ssm.defvjp(ssm_fwd, ssm_bwd)
    return ssm


def _fused_supported(L: int, resets) -> bool:
    return resets is None and _block_size(L) is not None


def _apply_fused(Lambda_bar, B_bar, C_tilde, D, u, *, conj_sym, bidirectional,
                 initial_state, return_state, matmul_dtype=None):  # fmt: skip
    """apply_ssm by the fused path (arguments already checked)."""
    dtype = B_bar.real.dtype
    P = Lambda_bar.shape[0]
    C_tilde = jnp.asarray(C_tilde)
    f = _factor(conj_sym)

    def output_weight(C):  # f·Re(C x) = [Re x | Im x] @ f·[Re Cᵀ; −Im Cᵀ]
        return _output_weight(C, f).astype(dtype)

    W_B = _input_weight(B_bar).astype(dtype)
    a = jnp.stack([Lambda_bar.real, Lambda_bar.imag]).astype(dtype)
    W_Cf = output_weight(C_tilde[:, :P])
    W_Cb = output_weight(C_tilde[:, P:]) if bidirectional else None
    if initial_state is None:
        x0 = jnp.zeros((2, P), dtype)
    else:
        x0 = jnp.asarray(initial_state)
        x0 = jnp.stack([x0.real, x0.imag]).astype(dtype)
    T = _block_size(u.shape[0])
    if matmul_dtype is None:
        u = u.astype(dtype)
    else:  # keep u as given (e.g. bfloat16); products cast their operands
        matmul_dtype = jnp.dtype(matmul_dtype)
    y, x = _fused_ssm(T, return_state, matmul_dtype)(
        u, W_B, a, W_Cf, W_Cb, jnp.asarray(D).astype(dtype), x0
    )
    if return_state:
        return y, jax.lax.complex(x[0], x[1])
    return y
