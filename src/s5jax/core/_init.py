"""Initialisation of Λ, B̃, C̃, D and log Δ (§3.2, App. B.1; reference semantics §2).

The state matrix initialisers (`LAMBDA_INITS`) return (Λ, V, V⁻¹) in float64 NumPy; B̃ = V⁻¹B
and C̃ = CV are then formed from sampled real B and complex C. Randomness comes only from the
explicit `key` arguments.

State matrix initialisers (each by blocks: J blocks of size R = P_full / J):
- `hippo`: diagonalised HiPPO-N (the paper's default).
- `s4d_inv`, `s4d_lin`: the S4D matrices (App. D.3, Table 8): Λ_n = −1/2 + i·(R/π)(R/(2n+1) − 1)
  and Λ_n = −1/2 + iπn. They are already diagonal, so V is the identity (B̃ = B, C̃ = C).
- `antisymmetric`: K − I/2 with K a random antisymmetric matrix (Gaussian entries), diagonalised
  (App. D.2, Table 7). Its real part matches HiPPO-N's, so only the oscillations differ.
- `gaussian`: a random real Gaussian matrix with N(0, 1/R) entries, diagonalised (Table 7).
  Its real eigenvalues have no conjugate partner, so it requires `conj_sym=False`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Complex, Float, PRNGKeyArray

from ._hippo import _block_diag, block_diagonal_eig, block_size, diagonalize_shifted_skew

__all__ = [
    "C_INITS",
    "LAMBDA_INITS",
    "init_B_tilde",
    "init_C_tilde",
    "init_D",
    "init_lambda",
    "init_log_step",
]

# Standard deviation of a N(0, 1) truncated to [−2, 2]: dividing by it gives unit variance.
_TRUNC_STD = 0.87962566103423978


def _trunc_normal(key, shape, std, dtype):
    """Truncated normal on [−2σ, 2σ] with standard deviation `std` (lecun_normal's sampler)."""
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype) * (std / _TRUNC_STD)


# --- state matrix ---------------------------------------------------------------------------


def _hippo(P_full, J, conj_sym, key):
    del key
    return block_diagonal_eig(P_full, J, conj_sym=conj_sym)


def _diagonal_blocks(Lambda_kept: np.ndarray, R: int, J: int, conj_sym: bool):
    """Λ, V, V⁻¹ for a block whose eigenvalues (negative-imaginary half) are given directly."""
    if conj_sym:
        Lambda_block = Lambda_kept
    else:
        Lambda_block = np.concatenate([Lambda_kept, np.conj(Lambda_kept)[::-1]])
    Lambda_block = Lambda_block[np.argsort(Lambda_block.imag, kind="stable")]
    V_block = np.eye(R, len(Lambda_block), dtype=np.complex128)
    return _tile_blocks(Lambda_block, V_block, V_block.conj().T, J)


def _tile_blocks(Lambda_block, V_block, V_inv_block, J):
    return (
        np.tile(Lambda_block, J),
        _block_diag([V_block] * J),
        _block_diag([V_inv_block] * J),
    )


def _s4d_inv(P_full, J, conj_sym, key):
    del key
    R = block_size(P_full, J, conj_sym=True)
    n = np.arange(R // 2)
    Lambda = -0.5 - 1j * (R / np.pi) * (R / (2 * n + 1) - 1)
    return _diagonal_blocks(Lambda, R, J, conj_sym)


def _s4d_lin(P_full, J, conj_sym, key):
    del key
    R = block_size(P_full, J, conj_sym=True)
    Lambda = -0.5 - 1j * np.pi * np.arange(R // 2)
    return _diagonal_blocks(Lambda, R, J, conj_sym)


def _antisymmetric(P_full, J, conj_sym, key):
    R = block_size(P_full, J, conj_sym=conj_sym)
    M = np.asarray(jax.random.normal(_require_key(key, "antisymmetric"), (R, R)), np.float64)
    K = (M - M.T) / np.sqrt(2.0)
    Lambda, V = diagonalize_shifted_skew(K - 0.5 * np.eye(R))
    if conj_sym:
        Lambda, V = Lambda[: R // 2], V[:, : R // 2]
    return _tile_blocks(Lambda, V, V.conj().T, J)


def _gaussian(P_full, J, conj_sym, key):
    if conj_sym:
        raise ValueError(
            "lambda_init='gaussian' needs conj_sym=False: a real Gaussian matrix has real "
            "eigenvalues, which have no conjugate partner to drop"
        )
    R = block_size(P_full, J, conj_sym=False)
    A = np.asarray(jax.random.normal(_require_key(key, "gaussian"), (R, R)), np.float64)
    Lambda, V = np.linalg.eig(A / np.sqrt(R))
    order = np.argsort(Lambda.imag, kind="stable")
    Lambda, V = Lambda[order].astype(np.complex128), V[:, order].astype(np.complex128)
    return _tile_blocks(Lambda, V, np.linalg.inv(V), J)


def _require_key(key, name):
    if key is None:
        raise ValueError(f"lambda_init={name!r} is random: pass a PRNG key")
    return key


LAMBDA_INITS: dict[str, Callable] = {
    "hippo": _hippo,
    "s4d_inv": _s4d_inv,
    "s4d_lin": _s4d_lin,
    "antisymmetric": _antisymmetric,
    "gaussian": _gaussian,
}


def init_lambda(
    method: str, P_full: int, J: int, *, conj_sym: bool, key: PRNGKeyArray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Λ (P,), V (P_full, P) and V⁻¹ (P, P_full) by the initialiser registered as `method`.

    P = P_full / 2 under conjugate symmetry, else P_full. Complex128 NumPy arrays.
    """
    if method not in LAMBDA_INITS:
        raise ValueError(f"lambda_init must be one of {sorted(LAMBDA_INITS)}, got {method!r}")
    return LAMBDA_INITS[method](P_full, J, conj_sym, key)


# --- B, C, D, Δ -------------------------------------------------------------------------------


def init_B_tilde(
    key: PRNGKeyArray, V_inv: np.ndarray, H: int, *, dtype=jnp.float32
) -> Complex[Array, "P H"]:
    """B̃ = V⁻¹B with real B (P_full, H) ~ truncated normal, std 1/sqrt(P_full) (lecun)."""
    P_full = V_inv.shape[1]
    B = _trunc_normal(key, (P_full, H), 1.0 / np.sqrt(P_full), dtype)
    return _to_complex(V_inv, dtype) @ B.astype(_complex_dtype(dtype))


def _c_trunc_standard_normal(key, V, H, dtype):
    return _c_times_v(key, V, H, 1.0 / np.sqrt(V.shape[0]), dtype)


def _c_lecun_normal(key, V, H, dtype):
    return _c_times_v(key, V, H, 1.0 / np.sqrt(V.shape[0] * H), dtype)


def _c_times_v(key, V, H, std, dtype):
    P_full = V.shape[0]
    re_key, im_key = jax.random.split(key)
    C = jax.lax.complex(
        _trunc_normal(re_key, (H, P_full), std, dtype),
        _trunc_normal(im_key, (H, P_full), std, dtype),
    )
    return C @ _to_complex(V, dtype)


def _c_complex_normal(key, V, H, dtype):
    P = V.shape[1]
    re_key, im_key = jax.random.split(key)
    std = np.sqrt(0.5)
    return jax.lax.complex(
        jax.random.normal(re_key, (H, P), dtype) * std,
        jax.random.normal(im_key, (H, P), dtype) * std,
    )


C_INITS: dict[str, Callable] = {
    "trunc_standard_normal": _c_trunc_standard_normal,
    "lecun_normal": _c_lecun_normal,
    "complex_normal": _c_complex_normal,
}


def init_C_tilde(
    key: PRNGKeyArray, V: np.ndarray, H: int, *, method: str, dtype=jnp.float32
) -> Complex[Array, "H P"]:
    """C̃ by one of the three variants of the paper's configs (reference semantics §2.6).

    - `trunc_standard_normal`: C (H, P_full) with re, im ~ truncated normal std 1/sqrt(P_full);
      C̃ = CV.
    - `lecun_normal`: the same with std 1/sqrt(P_full·H).
    - `complex_normal`: re, im ~ N(0, 1/2) of shape (H, P), not multiplied by V.
    """
    if method not in C_INITS:
        raise ValueError(f"C init must be one of {sorted(C_INITS)}, got {method!r}")
    return C_INITS[method](key, V, H, dtype)


def init_D(key: PRNGKeyArray, H: int, *, dtype=jnp.float32) -> Float[Array, " H"]:
    """D ~ N(0, 1), one feed-through per feature (App. B.1.2)."""
    return jax.random.normal(key, (H,), dtype)


def init_log_step(
    key: PRNGKeyArray, P: int, dt_min: float, dt_max: float, *, dtype=jnp.float32
) -> Float[Array, " P"]:
    """log Δ ~ U[log dt_min, log dt_max), one timescale per state (App. B.1.3)."""
    check_dt_range(dt_min, dt_max)
    return jax.random.uniform(key, (P,), dtype, np.log(dt_min), np.log(dt_max))


def check_dt_range(dt_min: float, dt_max: float) -> None:
    """Raise a ValueError unless 0 < dt_min ≤ dt_max."""
    if not dt_min > 0:
        raise ValueError(f"dt_min must be positive, got {dt_min!r}")
    if not dt_min <= dt_max:
        raise ValueError(f"dt_min must be ≤ dt_max, got dt_min={dt_min!r} > dt_max={dt_max!r}")


def _complex_dtype(dtype):
    return jnp.complex128 if jnp.dtype(dtype) == jnp.float64 else jnp.complex64


def _to_complex(array: np.ndarray, dtype):
    return jnp.asarray(array, dtype=_complex_dtype(dtype))
