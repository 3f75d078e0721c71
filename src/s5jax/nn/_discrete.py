"""`DiscreteSSM`: the discrete-time parameterisation ablation (App. D.2, Table 6).

Learns Λ̄ and B̄ directly, as earlier parallelised linear RNNs did: no timescale Δ and no
discretisation in the forward pass. It starts from the continuous model's initialisation,
Λ̄ = exp(ΛΔ) and B̄ = ((Λ̄ − 1)/Λ) B̃ (ZOH; or the bilinear rule), so at initialisation it computes
exactly what `S5SSM` computes with the same key. Λ̄ and B̄ keep the roles "Lambda" and "B", so
they stay in the SSM optimiser group.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray

from .. import core
from ._ssm import S5SSM, _check_segments, by_segments
from ._tags import param_field

__all__ = ["DiscreteSSM"]


class DiscreteSSM(eqx.Module):
    """A diagonal MIMO SSM whose discrete-time Λ̄ (P,) and B̄ (P, H) are the parameters.

    **Arguments:** those of `S5SSM` (the continuous system is built with the same key and
    discretised once, to initialise Λ̄ and B̄); `clip_eigs` and `scalar_dt` only shape that
    initial system.
    """

    Lambda_bar_re: Float[Array, " P"] = param_field("Lambda")
    Lambda_bar_im: Float[Array, " P"] = param_field("Lambda")
    B_bar_re: Float[Array, "P H"] = param_field("B")
    B_bar_im: Float[Array, "P H"] = param_field("B")
    C_re: Float[Array, "H PC"] = param_field("C")
    C_im: Float[Array, "H PC"] = param_field("C")
    D: Float[Array, " H"] = param_field("D")

    H: int = eqx.field(static=True)
    P: int = eqx.field(static=True)
    conj_sym: bool = eqx.field(static=True)
    bidirectional: bool = eqx.field(static=True)
    scan_method: str = eqx.field(static=True)

    def __init__(self, H: int, ssm_size: int, *, key: PRNGKeyArray, **ssm_options):
        continuous = S5SSM(H, ssm_size, key=key, **ssm_options)
        Lambda_bar, B_bar = continuous.discretized()
        self.Lambda_bar_re, self.Lambda_bar_im = Lambda_bar.real, Lambda_bar.imag
        self.B_bar_re, self.B_bar_im = B_bar.real, B_bar.imag
        self.C_re, self.C_im, self.D = continuous.C_re, continuous.C_im, continuous.D
        self.H, self.P = continuous.H, continuous.P
        self.conj_sym, self.bidirectional = continuous.conj_sym, continuous.bidirectional
        self.scan_method = continuous.scan_method

    def discretized(self) -> tuple[Complex[Array, " P"], Complex[Array, "P H"]]:
        """(Λ̄, B̄), the learned discrete-time system."""
        return (
            jax.lax.complex(self.Lambda_bar_re, self.Lambda_bar_im),
            jax.lax.complex(self.B_bar_re, self.B_bar_im),
        )

    def __call__(
        self,
        u: Float[Array, "L H"],
        *,
        step_rescale: float | Float[Array, ""] = 1.0,
        dt: Float[Array, " L"] | None = None,
        resets: Bool[Array, " L"] | None = None,
        segments: int = 1,
    ) -> Float[Array, "L H"]:
        """Apply the SSM to one sequence (use `jax.vmap` for batches).

        **Arguments:**
        - `u`: input sequence (L, H).
        - `step_rescale`, `dt`: must be 1 and `None`: a discrete-time system has no Δ to scale
          (a traced `step_rescale`, as a jitted evaluation step passes, cannot be checked and
          is ignored).
        - `resets`: (L,) booleans marking the first step of each packed episode.
        - `segments`: u is this many independent sequences laid end to end (`S5SSM.__call__`).

        **Returns:** y (L, H).
        """
        _check_no_timescale(step_rescale, dt)
        if u.ndim != 2 or u.shape[1] != self.H:
            raise ValueError(f"u must have shape (L, {self.H}), got {u.shape}")
        if segments != 1:
            _check_segments(u, segments, dt, resets)
            return by_segments(lambda u_s, _: self(u_s), u, None, segments)
        Lambda_bar, B_bar = self.discretized()
        return core.apply_ssm(
            Lambda_bar, B_bar, jax.lax.complex(self.C_re, self.C_im), self.D,
            u.astype(self.D.dtype), conj_sym=self.conj_sym, bidirectional=self.bidirectional,
            resets=resets, method=self.scan_method,
        )  # fmt: skip

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
        """One recurrent step, equal to the scan's step k; `step_rescale` and `dt` as in
        `__call__` (1 and `None`: a discrete-time system has no Δ)."""
        _check_no_timescale(step_rescale, dt)
        if self.bidirectional:
            raise ValueError(
                "step() needs a unidirectional SSM: bidirectional=True sees the future"
            )
        Lambda_bar, B_bar = self.discretized()
        return core.ssm_step(
            Lambda_bar, B_bar, jax.lax.complex(self.C_re, self.C_im), self.D, state,
            jnp.asarray(u_k).astype(self.D.dtype), conj_sym=self.conj_sym,
        )  # fmt: skip


def _check_no_timescale(step_rescale, dt) -> None:
    concrete = isinstance(step_rescale, int | float)
    if dt is not None or (concrete and step_rescale != 1):
        raise ValueError(
            "the discrete parameterisation has no timescale Δ: step_rescale must be 1 and "
            "dt None (use parameterization='continuous' for rescaled or irregular steps)"
        )
