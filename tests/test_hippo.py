"""HiPPO-LegS, HiPPO-N and their diagonalisation (App. B.1.1; reference semantics §2)."""

import numpy as np
import pytest

from s5jax import core


def test_hippo_legs_entries_match_the_closed_form():
    # View 1: the matrix; view 2: App. B Eq. 12 entry by entry.
    N = 6
    A = core.hippo_legs(N)
    for n in range(N):
        for k in range(N):
            if n > k:
                expected = -np.sqrt(2 * n + 1) * np.sqrt(2 * k + 1)
            elif n == k:
                expected = -(n + 1)
            else:
                expected = 0.0
            assert A[n, k] == pytest.approx(expected, abs=1e-12)


def test_hippo_n_is_normal_part_plus_low_rank():
    # A_LegS = S − P Pᵀ; S has diagonal −1/2 and an antisymmetric remainder (so S is normal).
    N = 16
    S, p = core.hippo_n(N)
    np.testing.assert_allclose(core.hippo_legs(N), S - np.outer(p, p), atol=1e-12)
    np.testing.assert_allclose(np.diagonal(S), -0.5, atol=1e-12)
    K = S + 0.5 * np.eye(N)
    np.testing.assert_allclose(K, -K.T, atol=1e-12)
    np.testing.assert_allclose(S @ S.T, S.T @ S, atol=1e-9)


@pytest.mark.parametrize("N", [2, 8, 64])
def test_hippo_n_eig_reconstructs_with_unitary_v(N):
    Lambda, V = core.hippo_n_eig(N)
    S, _ = core.hippo_n(N)
    np.testing.assert_allclose(Lambda.real, -0.5, atol=1e-12)
    np.testing.assert_allclose(V.conj().T @ V, np.eye(N), atol=1e-10)
    np.testing.assert_allclose(V @ np.diag(Lambda) @ V.conj().T, S, atol=1e-9 * N)
    # Ascending imaginary parts; the first half negative and mirrored by the second half.
    assert np.all(np.diff(Lambda.imag) >= 0)
    np.testing.assert_allclose(Lambda.imag[: N // 2], -Lambda.imag[N // 2 :][::-1], atol=1e-8)
    assert np.all(Lambda.imag[: N // 2] < 0)


@pytest.mark.parametrize("conj_sym", [True, False])
def test_block_diagonal_structure(conj_sym):
    P_full, J = 24, 3
    R = P_full // J
    Lambda, V, V_inv = core.block_diagonal_eig(P_full, J, conj_sym=conj_sym)
    kept = R // 2 if conj_sym else R
    assert Lambda.shape == (J * kept,)
    assert V.shape == (P_full, J * kept) and V_inv.shape == (J * kept, P_full)
    block_Lambda, block_V = core.hippo_n_eig(R)
    for j in range(J):
        np.testing.assert_allclose(Lambda[j * kept : (j + 1) * kept], block_Lambda[:kept])
        rows, cols = slice(j * R, (j + 1) * R), slice(j * kept, (j + 1) * kept)
        np.testing.assert_allclose(V[rows, cols], block_V[:, :kept])
        off = V.copy()
        off[rows, cols] = 0
        assert np.all(off[rows] == 0)  # nothing outside the block in these rows
    np.testing.assert_allclose(V_inv, V.conj().T)
    if not conj_sym:
        # Full system: V diag(Λ) V⁻¹ is the block-diagonal HiPPO-N matrix.
        S_block, _ = core.hippo_n(R)
        A = V @ np.diag(Lambda) @ V_inv
        for j in range(J):
            sl = slice(j * R, (j + 1) * R)
            np.testing.assert_allclose(A[sl, sl], S_block, atol=1e-9)


def test_block_errors_name_the_argument():
    with pytest.raises(ValueError, match="J=5 blocks must divide"):
        core.block_diagonal_eig(16, 5, conj_sym=True)
    with pytest.raises(ValueError, match="even block size"):
        core.block_diagonal_eig(12, 4, conj_sym=True)
    with pytest.raises(ValueError, match="P_full must be a positive integer"):
        core.block_diagonal_eig(0, 1, conj_sym=False)


def test_block_errors_list_only_the_j_that_work():
    # Under conjugate symmetry P_full / J must be even: 30 = 2·15 allows J in {1, 3, 5, 15}.
    with pytest.raises(ValueError, match=r"choose J among \[1, 3, 5, 15\]"):
        core.block_diagonal_eig(30, 4, conj_sym=True)
    with pytest.raises(ValueError, match=r"choose J among \[1, 3, 5, 15\], or set conj_sym"):
        core.block_diagonal_eig(30, 30, conj_sym=True)
    with pytest.raises(ValueError, match=r"choose J among \[1, 2, 3, 5, 6, 10, 15, 30\]"):
        core.block_diagonal_eig(30, 4, conj_sym=False)
    # An odd P_full has no J under conjugate symmetry.
    with pytest.raises(ValueError, match="choose an even P_full, or set conj_sym"):
        core.block_diagonal_eig(33, 1, conj_sym=True)
    for J in (1, 3, 5, 15):  # every J the message offers works
        assert core.block_diagonal_eig(30, J, conj_sym=True)[0].shape == (15,)
