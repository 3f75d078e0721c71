"""Discretisation of the diagonal continuous-time SSM (§2.1, §3.2, Eq. 6; App. A).

Each method maps (Λ, Δ) to (Λ̄, γ) with B̄ = γ[:, None] · B̃. Keeping γ separate lets per-step
timescales (irregular sampling, §6.3) scale B̃u_k per step instead of materialising an
(L, P, H) B̄. A new method is one function registered in `DISCRETIZATIONS`.

- ZOH (Eq. 6):      Λ̄ = exp(ΛΔ),                   γ = (Λ̄ − 1) / Λ
- Bilinear:         Λ̄ = (1 + ΔΛ/2) / (1 − ΔΛ/2),   γ = Δ / (1 − ΔΛ/2)
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, Complex, Float

__all__ = [
    "DISCRETIZATIONS",
    "bilinear_coefficients",
    "clip_eigs",
    "discretize",
    "discretize_bilinear",
    "discretize_zoh",
    "zoh_coefficients",
]

Coefficients = Callable[[Array, Array], tuple[Array, Array]]


def zoh_coefficients(
    Lambda: Complex[Array, "*#L #P"], Delta: Float[Array, "*#L #P"]
) -> tuple[Complex[Array, "..."], Complex[Array, "..."]]:
    """Zero-order hold: Λ̄ = exp(ΛΔ), γ = (Λ̄ − 1)/Λ (Eq. 6). Broadcasts over leading axes."""
    Lambda_bar = jnp.exp(Lambda * Delta.astype(Lambda.dtype))
    return Lambda_bar, (Lambda_bar - 1) / Lambda


def bilinear_coefficients(
    Lambda: Complex[Array, "*#L #P"], Delta: Float[Array, "*#L #P"]
) -> tuple[Complex[Array, "..."], Complex[Array, "..."]]:
    """Bilinear (Tustin): Λ̄ = (1 + ΔΛ/2)/(1 − ΔΛ/2), γ = Δ/(1 − ΔΛ/2)."""
    half = Delta.astype(Lambda.dtype) * Lambda / 2
    denom = 1 - half
    return (1 + half) / denom, Delta.astype(Lambda.dtype) / denom


DISCRETIZATIONS: dict[str, Coefficients] = {
    "zoh": zoh_coefficients,
    "bilinear": bilinear_coefficients,
}


def discretize_zoh(
    Lambda: Complex[Array, " P"], B_tilde: Complex[Array, "P H"], Delta: Float[Array, " P"]
) -> tuple[Complex[Array, " P"], Complex[Array, "P H"]]:
    """Discretise with zero-order hold (Eq. 6). Fixed public API.

    **Arguments:**
    - `Lambda`: diagonal continuous-time state matrix, complex (P,).
    - `B_tilde`: input matrix in the eigenbasis, complex (P, H).
    - `Delta`: one timescale per state, real (P,).

    **Returns:** `(Lambda_bar, B_bar)` of shapes (P,) and (P, H).
    """
    return discretize("zoh", Lambda, B_tilde, Delta)


def discretize_bilinear(
    Lambda: Complex[Array, " P"], B_tilde: Complex[Array, "P H"], Delta: Float[Array, " P"]
) -> tuple[Complex[Array, " P"], Complex[Array, "P H"]]:
    """Discretise with the bilinear transform. Fixed public API; arguments as `discretize_zoh`."""
    return discretize("bilinear", Lambda, B_tilde, Delta)


def discretize(
    method: str,
    Lambda: Complex[Array, " P"],
    B_tilde: Complex[Array, "P H"],
    Delta: Float[Array, " P"],
) -> tuple[Complex[Array, " P"], Complex[Array, "P H"]]:
    """Discretise (Λ, B̃) with step sizes Δ by the method registered under `method`."""
    Lambda, B_tilde, Delta = jnp.asarray(Lambda), jnp.asarray(B_tilde), jnp.asarray(Delta)
    _check_discretize_args(Lambda, B_tilde, Delta)
    Lambda_bar, gamma = get_coefficients(method)(Lambda, Delta)
    return Lambda_bar, gamma[:, None] * B_tilde.astype(Lambda_bar.dtype)


def get_coefficients(method: str) -> Coefficients:
    """The (Λ, Δ) → (Λ̄, γ) function registered under `method`."""
    try:
        return DISCRETIZATIONS[method]
    except KeyError:
        raise ValueError(
            f"discretization must be one of {sorted(DISCRETIZATIONS)}, got {method!r}"
        ) from None


def clip_eigs(Lambda_re: Float[Array, "*P"], max_value: float = -1e-4) -> Float[Array, "*P"]:
    """Hard-clip Re Λ ≤ `max_value` (the authors' `clip_eigs`), keeping the system stable."""
    return jnp.minimum(Lambda_re, max_value)


def _check_discretize_args(Lambda, B_tilde, Delta) -> None:
    if Lambda.ndim != 1:
        raise ValueError(f"Lambda must have shape (P,), got {Lambda.shape}")
    (P,) = Lambda.shape
    if not jnp.issubdtype(Lambda.dtype, jnp.complexfloating):
        raise ValueError(f"Lambda must be complex, got dtype {Lambda.dtype}")
    if B_tilde.ndim != 2 or B_tilde.shape[0] != P:
        raise ValueError(f"B_tilde must have shape (P, H) = ({P}, H), got {B_tilde.shape}")
    if Delta.shape != (P,):
        raise ValueError(f"Delta must have shape (P,) = ({P},), got {Delta.shape}")
    if jnp.issubdtype(Delta.dtype, jnp.complexfloating):
        raise ValueError(f"Delta must be real, got dtype {Delta.dtype}")
