"""Initialisers of B̃, C̃, D, log Δ and the ablation state matrices (reference semantics §2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import core


def _rms(x):
    return float(jnp.sqrt(jnp.mean(jnp.abs(x) ** 2)))


def test_b_tilde_and_c_tilde_scales_match_the_published_figures(getkey):
    # Reference semantics §2.5–2.6: rms |B̃| ≈ 0.0627, rms |C̃| ≈ 0.088 at P_full = 256.
    _, V, V_inv = core.block_diagonal_eig(256, 8, conj_sym=True)
    B = core.init_B_tilde(getkey(), V_inv, 512)
    C = core.init_C_tilde(getkey(), V, 512, method="trunc_standard_normal")
    assert B.shape == (128, 512) and C.shape == (512, 128)
    assert _rms(B) == pytest.approx(0.0627, rel=0.03)
    assert _rms(C) == pytest.approx(0.088, rel=0.03)


def test_b_tilde_is_v_inverse_times_a_real_lecun_matrix(getkey):
    # With the full (unitary) V, V B̃ recovers a real B whose std is 1/sqrt(P_full).
    P_full, H = 64, 256
    _, V, V_inv = core.block_diagonal_eig(P_full, 1, conj_sym=False)
    B_tilde = np.asarray(core.init_B_tilde(getkey(), V_inv, H, dtype=jnp.float32), complex)
    B = V @ B_tilde
    assert np.abs(B.imag).max() < 1e-5
    assert B.real.std() == pytest.approx(1 / np.sqrt(P_full), rel=0.05)
    # lecun_normal truncates a unit normal at ±2, then scales it to std σ: |B| ≤ 2σ/0.8796.
    assert np.abs(B.real).max() <= 2 / 0.87962566 / np.sqrt(P_full) * 1.0001


def test_c_init_variants(getkey):
    P_full, H = 64, 128
    _, V, _ = core.block_diagonal_eig(P_full, 4, conj_sym=True)
    lecun = core.init_C_tilde(getkey(), V, H, method="lecun_normal")
    # C̃ = CV with C complex of std 1/sqrt(P_full·H) per part; V's columns have unit norm.
    assert _rms(lecun) == pytest.approx(np.sqrt(2 / (P_full * H)), rel=0.05)
    cn = core.init_C_tilde(getkey(), V, H, method="complex_normal")
    assert cn.shape == (H, P_full // 2)
    assert float(jnp.std(cn.real)) == pytest.approx(np.sqrt(0.5), rel=0.05)
    with pytest.raises(ValueError, match="C init must be one of"):
        core.init_C_tilde(getkey(), V, H, method="orthogonal")


def test_d_and_log_step(getkey):
    D = core.init_D(getkey(), 4096)
    assert float(jnp.std(D)) == pytest.approx(1.0, rel=0.05)
    log_step = core.init_log_step(getkey(), 4096, 1e-3, 1e-1)
    assert float(log_step.min()) >= np.log(1e-3)
    assert float(log_step.max()) < np.log(1e-1)
    assert float(jnp.mean(log_step)) == pytest.approx(np.log(1e-2), abs=0.1)


@pytest.mark.parametrize(
    ("dt_min", "dt_max", "match"),
    [
        (0.0, 0.1, "dt_min must be positive"),
        (-1.0, 0.1, "dt_min must be positive"),
        (0.2, 0.1, "dt_min must be ≤ dt_max"),
    ],
)
def test_dt_range_errors(getkey, dt_min, dt_max, match):
    with pytest.raises(ValueError, match=match):
        core.init_log_step(getkey(), 8, dt_min, dt_max)


def test_s4d_inits_follow_their_formulas():
    Lambda, V, V_inv = core.init_lambda("s4d_lin", 8, 1, conj_sym=True)
    np.testing.assert_allclose(Lambda, -0.5 - 1j * np.pi * np.arange(4)[np.argsort(-np.arange(4))])
    np.testing.assert_allclose(V_inv @ V, np.eye(4))
    Lambda, _, _ = core.init_lambda("s4d_inv", 8, 1, conj_sym=True)
    n = np.arange(4)
    expected = -0.5 - 1j * (8 / np.pi) * (8 / (2 * n + 1) - 1)
    np.testing.assert_allclose(np.sort_complex(Lambda), np.sort_complex(expected))
    full, _, _ = core.init_lambda("s4d_inv", 8, 1, conj_sym=False)
    np.testing.assert_allclose(
        np.sort(full.imag), np.sort(np.concatenate([expected.imag, -expected.imag]))
    )


def test_random_inits(getkey):
    Lambda, V, V_inv = core.init_lambda("antisymmetric", 16, 2, conj_sym=True, key=getkey())
    np.testing.assert_allclose(Lambda.real, -0.5, atol=1e-12)
    assert np.all(Lambda.imag <= 1e-12)
    np.testing.assert_allclose(V_inv @ V, np.eye(8), atol=1e-10)
    Lambda, V, V_inv = core.init_lambda("gaussian", 16, 1, conj_sym=False, key=getkey())
    np.testing.assert_allclose(
        V @ np.diag(Lambda) @ V_inv, (V @ np.diag(Lambda) @ V_inv).real, atol=1e-9
    )  # a real matrix
    with pytest.raises(ValueError, match="needs conj_sym=False"):
        core.init_lambda("gaussian", 16, 1, conj_sym=True, key=getkey())
    with pytest.raises(ValueError, match="pass a PRNG key"):
        core.init_lambda("antisymmetric", 16, 1, conj_sym=True)
    with pytest.raises(ValueError, match="lambda_init must be one of"):
        core.init_lambda("legt", 16, 1, conj_sym=True)


def test_inits_are_deterministic_per_key():
    key = jax.random.PRNGKey(7)
    _, _, V_inv = core.block_diagonal_eig(16, 2, conj_sym=True)
    a = core.init_B_tilde(key, V_inv, 4)
    b = core.init_B_tilde(key, V_inv, 4)
    assert jnp.array_equal(a, b)
