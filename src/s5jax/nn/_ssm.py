"""`S5SSM`: the S5 state space model as an Equinox module (§3; App. A, B).

Holds real parameters only (real and imaginary parts are separate arrays: `jax.grad` of a
complex leaf is the conjugate of the usual gradient and optax does not correct for it) and
builds the complex system inside the forward pass. Handles one (L, H) sequence; use
`jax.vmap` for batches.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray

from .. import core
from ..core._ssm import _apply_continuous, _continuous_step, check_ssm_method
from ._dense import check_precision
from ._tags import param_field

__all__ = ["S5SSM"]


class S5SSM(eqx.Module):
    """A multi-input, multi-output diagonal SSM, discretised from continuous time (Eqs. 5–8).

    **Arguments:**
    - `H`: number of input/output features.
    - `ssm_size`: the paper's latent size P (called P_full in `s5jax.core`). Under conjugate
      symmetry `ssm_size // 2` complex states are stored (the field `P`).
    - `J`: number of HiPPO-N blocks for the block-diagonal initialisation (App. B.1.1).
    - `conj_sym`: store one eigenvalue of each conjugate pair (output doubled).
    - `bidirectional`: add a reverse scan with its own output matrix (App. G.1.2).
    - `discretization`: `"zoh"` or `"bilinear"`.
    - `c_init`: `"trunc_standard_normal"`, `"lecun_normal"` or `"complex_normal"`.
    - `lambda_init`: `"hippo"` (default), `"s4d_inv"`, `"s4d_lin"`, `"antisymmetric"`,
      `"gaussian"` (ablations of App. D).
    - `dt_min`, `dt_max`: range of the log-uniform initial timescales.
    - `scalar_dt`: learn one Δ shared by all states (ablation of Table 6) instead of one each.
    - `clip_eigs`: clip Re Λ ≤ −1e-4 in the forward pass.
    - `scan_method`: how the SSM is computed (`s5jax.core.apply_ssm`'s `method`): `"auto"`
      (on CPU the chunked scan, the fused path for sequences of more than 2²¹ states
      L × P × directions; the parallel scan elsewhere),
      `"fused"`, or a scan method
      (`"sequential"`, `"parallel"`, `"chunked"`, …).
    - `dtype`: real dtype of the parameters.
    - `precision`: `"fp32"`, or `"bf16"`: the products B̃u and C̃x take bfloat16 operands and
      accumulate in float32; Λ, Δ, the discretisation, the recurrence state (complex64, or
      float32 planes on the fused path) and y stay float32.
    - `key`: PRNG key (keyword-only).
    """

    Lambda_re: Float[Array, " P"] = param_field("Lambda")
    Lambda_im: Float[Array, " P"] = param_field("Lambda")
    B_re: Float[Array, "P H"] = param_field("B")
    B_im: Float[Array, "P H"] = param_field("B")
    C_re: Float[Array, "H PC"] = param_field("C")
    C_im: Float[Array, "H PC"] = param_field("C")
    D: Float[Array, " H"] = param_field("D")
    log_step: Float[Array, " PD"] = param_field("log_step")

    H: int = eqx.field(static=True)
    P: int = eqx.field(static=True)
    conj_sym: bool = eqx.field(static=True)
    bidirectional: bool = eqx.field(static=True)
    discretization: str = eqx.field(static=True)
    clip_eigs: bool = eqx.field(static=True)
    scan_method: str = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        H: int,
        ssm_size: int,
        *,
        J: int = 1,
        conj_sym: bool = True,
        bidirectional: bool = False,
        discretization: str = "zoh",
        c_init: str = "trunc_standard_normal",
        lambda_init: str = "hippo",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        scalar_dt: bool = False,
        clip_eigs: bool = False,
        scan_method: str = "auto",
        dtype=jnp.float32,
        precision: str = "fp32",
        key: PRNGKeyArray,
    ):
        _check_positive(H, "H")
        check_precision(precision)
        if discretization not in core.DISCRETIZATIONS:
            raise ValueError(
                f"discretization must be one of {sorted(core.DISCRETIZATIONS)}, "
                f"got {discretization!r}"
            )
        check_ssm_method(scan_method)
        core.check_dt_range(dt_min, dt_max)
        lam_key, b_key, c_key, cb_key, d_key, dt_key = jax.random.split(key, 6)
        Lambda, V, V_inv = core.init_lambda(
            lambda_init, ssm_size, J, conj_sym=conj_sym, key=lam_key
        )
        B = core.init_B_tilde(b_key, V_inv, H, dtype=dtype)
        C = core.init_C_tilde(c_key, V, H, method=c_init, dtype=dtype)
        if bidirectional:
            C_bwd = core.init_C_tilde(cb_key, V, H, method=c_init, dtype=dtype)
            C = jnp.concatenate([C, C_bwd], axis=1)
        P = Lambda.shape[0]
        self.Lambda_re = jnp.asarray(Lambda.real, dtype)
        self.Lambda_im = jnp.asarray(Lambda.imag, dtype)
        self.B_re, self.B_im = B.real, B.imag
        self.C_re, self.C_im = C.real, C.imag
        self.D = core.init_D(d_key, H, dtype=dtype)
        self.log_step = core.init_log_step(
            dt_key, 1 if scalar_dt else P, dt_min, dt_max, dtype=dtype
        )
        self.H, self.P = H, P
        self.conj_sym, self.bidirectional = conj_sym, bidirectional
        self.discretization, self.clip_eigs, self.scan_method = (
            discretization,
            clip_eigs,
            scan_method,
        )
        self.precision = precision

    # --- the continuous-time system --------------------------------------------------------

    def Lambda(self) -> Complex[Array, " P"]:
        """Λ, with Re Λ clipped to ≤ −1e-4 when `clip_eigs`."""
        re = core.clip_eigs(self.Lambda_re) if self.clip_eigs else self.Lambda_re
        return jax.lax.complex(re, self.Lambda_im)

    def B_tilde(self) -> Complex[Array, "P H"]:
        return jax.lax.complex(self.B_re, self.B_im)

    def C_tilde(self) -> Complex[Array, "H PC"]:
        return jax.lax.complex(self.C_re, self.C_im)

    def Delta(self, step_rescale: float | Float[Array, ""] = 1.0) -> Float[Array, " P"]:
        """Δ = step_rescale · exp(log Δ), one timescale per state (§6.2's zero-shot rescale)."""
        Delta = jnp.exp(self.log_step) * jnp.asarray(step_rescale, self.log_step.dtype)
        return jnp.broadcast_to(Delta, (self.P,))

    def discretized(
        self, step_rescale: float | Float[Array, ""] = 1.0
    ) -> tuple[Complex[Array, " P"], Complex[Array, "P H"]]:
        """(Λ̄, B̄) for the timescales Δ·step_rescale."""
        return core.discretize(
            self.discretization, self.Lambda(), self.B_tilde(), self.Delta(step_rescale)
        )

    # --- sequences ---------------------------------------------------------------------------

    def __call__(
        self,
        u: Float[Array, "L H"],
        *,
        step_rescale: float | Float[Array, ""] = 1.0,
        dt: Float[Array, " L"] | None = None,
        resets: Bool[Array, " L"] | None = None,
        initial_state: Complex[Array, " P"] | None = None,
        return_state: bool = False,
        segments: int = 1,
    ):
        """Apply the SSM to one sequence (use `jax.vmap` for batches).

        **Arguments:**
        - `u`: input sequence (L, H).
        - `step_rescale`: multiplies every Δ (e.g. 2 for 8 kHz data on a 16 kHz model).
        - `dt`: per-step multipliers of Δ for irregular sampling, (L,): [1, t_1 − t_0, …]
          (see `s5jax.core.step_multipliers`).
        - `resets`: (L,) booleans marking the first step of each packed episode.
        - `initial_state`: state before u_0 (unidirectional only), e.g. from `step`.
        - `return_state`: also return the final state.
        - `segments`: u is this many independent sequences of L / segments steps laid end to
          end (a Python int), run as a batch: the scan methods that take no resets
          (`"native"` on the products' layout, `"fused"`) stay available. The same result as
          `resets` true at each segment's first step (with `dt`, where each segment's `dt`
          starts with 1, as `core.step_multipliers` gives). Not with `resets`,
          `initial_state` or `return_state`.

        **Returns:** y (L, H); with `return_state`, `(y, final_state)`.
        """
        if u.ndim != 2 or u.shape[1] != self.H:
            raise ValueError(
                f"u must have shape (L, H) = (L, {self.H}), got {u.shape}; use jax.vmap for batches"
            )
        _check_inputs(u, "u", step_rescale)
        if segments != 1:
            _check_segments(u, segments, dt, resets, initial_state, return_state)
            return by_segments(
                lambda u_s, dt_s: self(u_s, step_rescale=step_rescale, dt=dt_s), u, dt, segments
            )
        if self.precision == "bf16":
            return _apply_continuous(
                self.Lambda(), self.B_tilde(), self.C_tilde(), self.D, self.Delta(step_rescale),
                u.astype(jnp.bfloat16), discretization=self.discretization, dt=dt,
                conj_sym=self.conj_sym, bidirectional=self.bidirectional,
                initial_state=initial_state, resets=resets, method=self.scan_method,
                return_state=return_state, matmul_dtype=jnp.bfloat16,
            )  # fmt: skip
        return core.apply_ssm_continuous(
            self.Lambda(), self.B_tilde(), self.C_tilde(), self.D, self.Delta(step_rescale),
            u.astype(self.D.dtype), discretization=self.discretization, dt=dt,
            conj_sym=self.conj_sym, bidirectional=self.bidirectional,
            initial_state=initial_state, resets=resets, method=self.scan_method,
            return_state=return_state,
        )  # fmt: skip

    # --- online use ---------------------------------------------------------------------------

    def init_state(self) -> Complex[Array, " P"]:
        """The zero state before the first input."""
        dtype = jnp.complex128 if self.D.dtype == jnp.float64 else jnp.complex64
        return core.init_state(self.P, dtype)

    def step(
        self,
        state: Complex[Array, " P"],
        u_k: Float[Array, " H"],
        *,
        step_rescale: float | Float[Array, ""] = 1.0,
        dt: float | Float[Array, ""] | None = None,
    ) -> tuple[Complex[Array, " P"], Float[Array, " H"]]:
        """One recurrent step: (state, u_k) → (state′, y_k), equal to the scan's step k.

        **Arguments:**
        - `state`: the state after step k − 1 (`init_state()` before the first input).
        - `u_k`: the input (H,).
        - `step_rescale`: multiplies every Δ, as in `__call__`.
        - `dt`: this step's multiplier of Δ for irregular sampling (t_k − t_{k−1}; 1 at the
          first step), i.e. `dt[k]` of `__call__`; `None` uses Δ itself.

        Costs O(PH): the products B̄u_k and C̃x_k. Under `"bf16"` the products take bfloat16
        operands as the sequence path does.
        """
        if self.bidirectional:
            raise ValueError(
                "step() needs a unidirectional SSM: bidirectional=True sees the future"
            )
        u_k = jnp.asarray(u_k)
        if u_k.shape != (self.H,):
            raise ValueError(f"u_k must have shape (H,) = ({self.H},), got {u_k.shape}")
        _check_inputs(u_k, "u_k", step_rescale)
        bf16 = self.precision == "bf16"
        return _continuous_step(
            self.Lambda(), self.B_tilde(), self.C_tilde(), self.D, self.Delta(step_rescale),
            state, u_k.astype(jnp.bfloat16 if bf16 else self.D.dtype),
            discretization=self.discretization, conj_sym=self.conj_sym, dt=dt,
            matmul_dtype=jnp.bfloat16 if bf16 else None,
        )  # fmt: skip


def _check_segments(u, segments, dt, resets=None, initial_state=None, return_state=False):
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be a positive Python int, got {segments!r}")
    if u.shape[0] % segments:
        raise ValueError(f"segments={segments} must divide the sequence length L = {u.shape[0]}")
    if dt is not None and jnp.shape(dt) != (u.shape[0],):
        raise ValueError(f"dt must have shape (L,) = ({u.shape[0]},), got {jnp.shape(dt)}")
    if resets is not None or initial_state is not None or return_state:
        raise ValueError(
            "segments > 1 cannot be combined with resets, initial_state or return_state "
            "(pass resets alone to mark episodes of different lengths)"
        )


def by_segments(apply, u, dt, segments: int):
    """`apply(u, dt)` on each of `segments` equal parts of u (L, ...) and dt (L,) or `None`, as
    one batch (`jax.vmap`), the outputs laid end to end again: (L, ...)."""
    L = u.shape[0]
    parts = u.reshape(segments, L // segments, *u.shape[1:])
    if dt is None:
        ys = jax.vmap(lambda p: apply(p, None))(parts)
    else:
        ys = jax.vmap(apply)(parts, jnp.asarray(dt).reshape(segments, L // segments))
    return ys.reshape(L, *ys.shape[2:])


def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_inputs(u, name: str, step_rescale) -> None:
    """Float inputs, and a concrete `step_rescale` finite and > 0 (traced values pass)."""
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise TypeError(
            f"{name} has dtype {u.dtype}; S5SSM takes real float inputs: cast them "
            f"({name}.astype(jnp.float32)), and embed integer token ids first"
        )
    if isinstance(step_rescale, (int, float, np.number)) and not (
        math.isfinite(step_rescale) and step_rescale > 0
    ):
        raise ValueError(
            f"step_rescale must be finite and > 0 (it multiplies Δ), got {step_rescale}"
        )
