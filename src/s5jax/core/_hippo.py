"""HiPPO-LegS, its normal part HiPPO-N, and the diagonalisation that initialises Λ (App. B.1.1).

All of this runs once at initialisation, in float64 NumPy: it has no parameters and needs no
gradients, and the eigendecomposition is more accurate in double precision.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "block_diagonal_eig",
    "block_size",
    "diagonalize_shifted_skew",
    "hippo_legs",
    "hippo_n",
    "hippo_n_eig",
]


def hippo_legs(N: int) -> np.ndarray:
    """The HiPPO-LegS state matrix A_LegS of App. B.1.1 (Eq. 12), shape (N, N).

    (A_LegS)_nk = −sqrt(2n+1)·sqrt(2k+1) for n > k, −(n+1) for n = k, 0 for n < k.
    """
    _check_positive_int(N, "N")
    p = np.sqrt(2.0 * np.arange(N) + 1.0)
    return -(np.tril(np.outer(p, p)) - np.diag(np.arange(N, dtype=np.float64)))


def hippo_n(N: int) -> tuple[np.ndarray, np.ndarray]:
    """HiPPO-N, the normal part of HiPPO-LegS, and its low-rank term (App. B.1.1, Eqs. 14–16).

    **Returns:** `(S, P_legs)` with A_LegS = S − P_legs P_legsᵀ, S of shape (N, N) (every
    diagonal entry −1/2, the rest antisymmetric), and P_legs_n = sqrt(n + 1/2) of shape (N,).
    """
    p_legs = np.sqrt(np.arange(N) + 0.5)
    return hippo_legs(N) + np.outer(p_legs, p_legs), p_legs


def hippo_n_eig(N: int) -> tuple[np.ndarray, np.ndarray]:
    """Diagonalise HiPPO-N: S = V diag(Λ) Vᴴ with V unitary (reference semantics §2.2).

    Re Λ = −1/2 for every state (the mean of diag S, which is exactly −1/2). Im Λ and V come
    from the Hermitian eigendecomposition of −i·(S − diag S), eigenvalues ascending, so the
    first N/2 eigenvalues have negative imaginary parts and the last N/2 are their conjugates.

    **Returns:** `(Lambda, V)`, complex128 of shapes (N,) and (N, N).
    """
    S, _ = hippo_n(N)
    return diagonalize_shifted_skew(S)


def diagonalize_shifted_skew(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Diagonalise a real normal matrix S = c·I + K (K antisymmetric): S = V diag(Λ) Vᴴ.

    Re Λ = mean(diag S) = c; Im Λ ascending from the Hermitian eigendecomposition of −iK.
    """
    diag = np.diagonal(S)
    skew = S - np.diag(diag)
    if not np.allclose(skew, -skew.T, atol=1e-10 * max(1.0, np.abs(skew).max())):
        raise ValueError("S minus its diagonal must be antisymmetric")
    Lambda_im, V = np.linalg.eigh(-1j * skew)
    Lambda = np.mean(diag) + 1j * Lambda_im
    return Lambda.astype(np.complex128), V.astype(np.complex128)


def block_diagonal_eig(
    P_full: int, J: int, *, conj_sym: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Λ, V and V⁻¹ of a block-diagonal HiPPO-N initialisation with J blocks (App. B.1.1).

    Each block is the HiPPO-N matrix of size R = P_full / J. Under conjugate symmetry only the
    first half of each block's ascending eigenvalues (negative imaginary parts) and the
    matching columns of V are kept. V⁻¹ := block_diag(V_blockᴴ, …) is the conjugate
    transpose, a pseudo-inverse of the truncated V.

    **Arguments:**
    - `P_full`: the full latent size (the paper's P; twice the stored P under conj_sym).
    - `J`: number of HiPPO-N blocks on the diagonal.
    - `conj_sym`: keep only one eigenvalue of each conjugate pair.

    **Returns:** `(Lambda, V, V_inv)`, complex128 of shapes (P,), (P_full, P), (P, P_full),
    with P = P_full // 2 under conjugate symmetry, else P_full.
    """
    R = block_size(P_full, J, conj_sym=conj_sym)
    Lambda_block, V_block = hippo_n_eig(R)
    if conj_sym:
        Lambda_block, V_block = Lambda_block[: R // 2], V_block[:, : R // 2]
    Lambda = np.tile(Lambda_block, J)
    V = _block_diag([V_block] * J)
    V_inv = _block_diag([V_block.conj().T] * J)
    return Lambda, V, V_inv


def block_size(P_full: int, J: int, *, conj_sym: bool) -> int:
    """R = P_full / J, validated: J must divide P_full, and R must be even under conj_sym."""
    _check_positive_int(P_full, "P_full")
    _check_positive_int(J, "J")
    # The J that work: divisors of P_full, with an even quotient under conjugate symmetry.
    valid = [
        d for d in range(1, P_full + 1) if P_full % d == 0 and not (conj_sym and P_full // d % 2)
    ]
    choice = f"choose J among {valid}" if valid else "choose an even P_full"
    if P_full % J:
        raise ValueError(
            f"J={J} blocks must divide the latent size P_full={P_full} (the paper's P, "
            f"S5SSM's ssm_size); {choice}"
        )
    R = P_full // J
    if conj_sym and R % 2:
        raise ValueError(
            f"conj_sym=True needs an even block size, but P_full/J = {P_full}/{J} = {R} is odd; "
            f"{choice}, or set conj_sym=False"
        )
    return R


def _block_diag(blocks: list[np.ndarray]) -> np.ndarray:
    rows = sum(b.shape[0] for b in blocks)
    cols = sum(b.shape[1] for b in blocks)
    out = np.zeros((rows, cols), dtype=np.result_type(*blocks))
    r = c = 0
    for b in blocks:
        out[r : r + b.shape[0], c : c + b.shape[1]] = b
        r, c = r + b.shape[0], c + b.shape[1]
    return out


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
