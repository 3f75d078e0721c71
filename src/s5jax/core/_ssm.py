"""Applying a discretised diagonal MIMO SSM to one sequence (§3, Eqs. 7–8; App. A).

    x_k = Λ̄ ⊙ x_{k−1} + B̄ u_k,        y_k = f · Re(C̃ x_k) + D ⊙ u_k

with f = 2 under conjugate symmetry (only one eigenvalue of each conjugate pair is stored,
and the pair's contributions are complex conjugates of each other) and f = 1 otherwise.
Bidirectional: a second scan in reverse over the same elements,
x'_k = Σ_{j≥k} Λ̄^{j−k} B̄ u_j, and y_k = f · Re(C_fwd x_k + C_bwd x'_k) + D ⊙ u_k,
where C̃ = [C_fwd | C_bwd] has shape (H, 2P).

Complex products with real operands are done as real matrix products (B̃u = u B_reᵀ + i u B_imᵀ,
Re(C̃x) = x_re C_reᵀ − x_im C_imᵀ): cheaper than complex matmuls and free of dtype promotion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Complex, Float

from ._discretize import discretize, get_coefficients
from ._scan import linear_recurrence

__all__ = [
    "apply_ssm",
    "apply_ssm_continuous",
    "init_state",
    "ssm_step",
    "step_multipliers",
]


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
    - `method`: scan method, `"auto"`, `"sequential"` or `"parallel"`.
    - `return_state`: also return the final forward state.

    **Returns:** y of shape (L, H), real; with `return_state`, `(y, final_state)`.
    """
    Lambda_bar, B_bar, u = jnp.asarray(Lambda_bar), jnp.asarray(B_bar), jnp.asarray(u)
    _check_lambda_b(Lambda_bar, B_bar, u)
    Bu = _complex_matvecs(u, B_bar)
    return _ssm_from_elements(
        Lambda_bar, Bu, Lambda_bar, Bu, C_tilde, D, u,
        conj_sym=conj_sym, bidirectional=bidirectional, initial_state=initial_state,
        resets=resets, method=method, return_state=return_state,
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
    Lambda, B_tilde, u = jnp.asarray(Lambda), jnp.asarray(B_tilde), jnp.asarray(u)
    common = dict(
        conj_sym=conj_sym, bidirectional=bidirectional, initial_state=initial_state,
        resets=resets, method=method, return_state=return_state,
    )  # fmt: skip
    if dt is None:
        Lambda_bar, B_bar = discretize(discretization, Lambda, B_tilde, Delta)
        return apply_ssm(Lambda_bar, B_bar, C_tilde, D, u, **common)
    dt = jnp.asarray(dt)
    _check_lambda_b(Lambda, B_tilde, u, names=("Lambda", "B_tilde"))
    if dt.shape != (u.shape[0],):
        raise ValueError(f"dt must have shape (L,) = ({u.shape[0]},), got {dt.shape}")
    coefficients = get_coefficients(discretization)
    B_tilde_u = _complex_matvecs(u, B_tilde)
    Delta = jnp.asarray(Delta)
    Lambda_f, gamma_f = coefficients(Lambda[None, :], dt[:, None] * Delta[None, :])
    if bidirectional:
        dt_bwd = jnp.concatenate([dt[1:], jnp.ones((1,), dt.dtype)])
        Lambda_b, gamma_b = coefficients(Lambda[None, :], dt_bwd[:, None] * Delta[None, :])
    else:
        Lambda_b, gamma_b = Lambda_f, gamma_f
    return _ssm_from_elements(
        Lambda_f, gamma_f * B_tilde_u, Lambda_b, gamma_b * B_tilde_u, C_tilde, D, u, **common
    )


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
    x_new = Lambda_bar * x + _complex_matvecs(u_k[None], B_bar)[0]
    y = _project(x_new[None], C_tilde)[0]
    return x_new, _scale(y, conj_sym) + jnp.asarray(D) * u_k


def _ssm_from_elements(
    Lambda_f, Bu_f, Lambda_b, Bu_b, C_tilde, D, u,
    *, conj_sym, bidirectional, initial_state, resets, method, return_state,
):  # fmt: skip
    C_tilde, D = jnp.asarray(C_tilde), jnp.asarray(D)
    H = u.shape[1]
    P = Bu_f.shape[1]
    _check_c_d(C_tilde, D, P, H, bidirectional=bidirectional)
    if bidirectional and initial_state is not None:
        raise ValueError(
            "initial_state is only defined for a unidirectional SSM (a bidirectional one "
            "also scans from the end); pass bidirectional=False or initial_state=None"
        )
    xs, final = linear_recurrence(
        Lambda_f, Bu_f, initial_state=initial_state, resets=resets, method=method
    )
    if bidirectional:
        # Episode k starts at a reset: the backward scan restarts at the step before it.
        resets_bwd = None
        if resets is not None:
            resets_bwd = jnp.concatenate([jnp.asarray(resets)[1:], jnp.zeros((1,), jnp.bool_)])
        xs_b, _ = linear_recurrence(Lambda_b, Bu_b, reverse=True, resets=resets_bwd, method=method)
        y = _project(xs, C_tilde[:, :P]) + _project(xs_b, C_tilde[:, P:])
    else:
        y = _project(xs, C_tilde)
    y = _scale(y, conj_sym) + D[None, :] * u
    return (y, final) if return_state else y


def _complex_matvecs(u, M):
    """M u_k for every row u_k of real `u` (L, H) and complex `M` (P, H): complex (L, P)."""
    real = u.astype(M.real.dtype)
    return jax.lax.complex(real @ M.real.T, real @ M.imag.T)


def _project(xs, C):
    """Re(C x_k) for every row of complex `xs` (L, P) and complex `C` (H, P): real (L, H)."""
    return xs.real @ C.real.T - xs.imag @ C.imag.T


def _scale(y, conj_sym):
    return 2 * y if conj_sym else y


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


def _check_c_d(C, D, P, H, *, bidirectional) -> None:
    width = 2 * P if bidirectional else P
    if C.shape != (H, width):
        what = "(H, 2P) = [C_fwd | C_bwd]" if bidirectional else "(H, P)"
        raise ValueError(f"C_tilde must have shape {what} = ({H}, {width}), got {C.shape}")
    if D.shape != (H,):
        raise ValueError(f"D must have shape (H,) = ({H},), got {D.shape}")
