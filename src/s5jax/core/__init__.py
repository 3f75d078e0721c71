"""The S5 layer's mathematics as pure functions on one sequence (imports only jax and numpy).

Notation follows the paper (Smith, Warrington, Linderman, ICLR 2023):

- `H`: number of input/output features; `L`: sequence length.
- `P`: number of *stored* complex latent states. Under conjugate symmetry only one eigenvalue
  of each conjugate pair is stored, so P = P_full / 2, where `P_full` is the paper's P.
- `J`: number of HiPPO-N blocks on the diagonal of the initial state matrix.
- `Lambda` (Λ, (P,)): diagonal continuous-time state matrix; `B_tilde` (B̃ = V⁻¹B, (P, H)),
  `C_tilde` (C̃ = CV, (H, P)), `D` ((H,)), `Delta` (Δ, (P,)): one timescale per state.
- `Lambda_bar`, `B_bar` (Λ̄, B̄): the discretised system (Eq. 6), x_k = Λ̄ x_{k−1} + B̄ u_k,
  y_k = f·Re(C̃ x_k) + D ⊙ u_k with f = 2 under conjugate symmetry.

The fixed public API, a stable contract for code outside this package (Flax, Equinox, plain
JAX): `discretize_zoh`, `discretize_bilinear` and `apply_ssm`.

Batches: every function handles one sequence; use `jax.vmap` for batches.
"""

from ._discretize import (
    DISCRETIZATIONS,
    bilinear_coefficients,
    clip_eigs,
    discretize,
    discretize_bilinear,
    discretize_zoh,
    get_coefficients,
    zoh_coefficients,
)
from ._hippo import block_diagonal_eig, block_size, hippo_legs, hippo_n, hippo_n_eig
from ._init import (
    C_INITS,
    LAMBDA_INITS,
    check_dt_range,
    init_B_tilde,
    init_C_tilde,
    init_D,
    init_lambda,
    init_log_step,
)
from ._native import native_available, native_build_error, native_recurrence
from ._pallas import pallas_available, pallas_recurrence, pallas_unavailable_reason
from ._scan import SCAN_METHODS, binary_operator, linear_recurrence, resolve_scan_method
from ._ssm import (
    apply_ssm,
    apply_ssm_continuous,
    init_state,
    resolve_ssm_method,
    ssm_step,
    step_multipliers,
)

__all__ = [
    "C_INITS",
    "DISCRETIZATIONS",
    "LAMBDA_INITS",
    "SCAN_METHODS",
    "apply_ssm",
    "apply_ssm_continuous",
    "bilinear_coefficients",
    "binary_operator",
    "block_diagonal_eig",
    "block_size",
    "check_dt_range",
    "clip_eigs",
    "discretize",
    "discretize_bilinear",
    "discretize_zoh",
    "get_coefficients",
    "hippo_legs",
    "hippo_n",
    "hippo_n_eig",
    "init_B_tilde",
    "init_C_tilde",
    "init_D",
    "init_lambda",
    "init_log_step",
    "init_state",
    "linear_recurrence",
    "native_available",
    "native_build_error",
    "native_recurrence",
    "pallas_available",
    "pallas_recurrence",
    "pallas_unavailable_reason",
    "resolve_scan_method",
    "resolve_ssm_method",
    "ssm_step",
    "step_multipliers",
    "zoh_coefficients",
]
