"""Discretisations: ZOH = the exact matrix-exponential solution; bilinear is second order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import core


def _random_system(rng, P=6, H=3):
    Lambda = -rng.uniform(0.1, 1.0, P) + 1j * rng.normal(0, 3, P)
    B = rng.normal(size=(P, H)) + 1j * rng.normal(size=(P, H))
    Delta = rng.uniform(0.01, 0.5, P)
    return Lambda, B, Delta


def test_zoh_equals_matrix_exponential_of_the_augmented_system(x64):
    # View 1: discretize_zoh. View 2: the exact solution over one step of ẋ = Λx + B̃u with u
    # held constant, read off expm([[ΛΔ, B̃Δ], [0, 0]]) = [[Λ̄, B̄], [0, I]] (Van Loan).
    rng = np.random.default_rng(0)
    Lambda, B, Delta = _random_system(rng)
    Lambda_bar, B_bar = core.discretize_zoh(jnp.asarray(Lambda), jnp.asarray(B), jnp.asarray(Delta))
    P, H = B.shape
    for p in range(P):
        M = np.zeros((1 + H, 1 + H), complex)
        M[0, 0] = Lambda[p] * Delta[p]
        M[0, 1:] = B[p] * Delta[p]
        E = np.asarray(jax.scipy.linalg.expm(jnp.asarray(M)))
        assert complex(Lambda_bar[p]) == pytest.approx(E[0, 0], rel=1e-12)
        np.testing.assert_allclose(np.asarray(B_bar[p]), E[0, 1:], rtol=1e-11)


def test_zoh_recurrence_matches_the_exact_continuous_solution(x64):
    # Piecewise-constant input: stepping with (Λ̄, B̄) equals the closed-form solution
    # x(t) = e^{Λt}x0 + ∫ e^{Λ(t−s)} B̃ u(s) ds evaluated interval by interval with expm of
    # the real 2×2 representation of each complex mode (an independent matrix exponential).
    rng = np.random.default_rng(1)
    Lambda, B, Delta = _random_system(rng, P=4, H=2)
    u = rng.normal(size=(20, 2))
    Lambda_bar, B_bar = core.discretize_zoh(jnp.asarray(Lambda), jnp.asarray(B), jnp.asarray(Delta))
    xs, _ = core.linear_recurrence(Lambda_bar, jnp.asarray(u, complex) @ B_bar.T)
    for p in range(4):
        a, w = Lambda[p].real, Lambda[p].imag
        A_real = np.array([[a, -w], [w, a]])  # multiplication by Λ on (Re x, Im x)
        M = np.zeros((4, 4))
        M[:2, :2] = A_real * Delta[p]
        M[:2, 2:] = np.eye(2) * Delta[p]
        E = np.asarray(jax.scipy.linalg.expm(jnp.asarray(M)))
        x = np.zeros(2)
        for k in range(20):
            drive = B[p] @ u[k]
            x = E[:2, :2] @ x + E[:2, 2:] @ np.array([drive.real, drive.imag])
            assert complex(xs[k, p]) == pytest.approx(x[0] + 1j * x[1], rel=1e-10, abs=1e-12)


def test_bilinear_converges_with_order_two(x64):
    # Constant input and a nonzero initial state: x(T) is known in closed form. The error of
    # the bilinear recurrence at T must shrink as Δ² (fitted slope ≈ 2).
    Lambda = jnp.asarray([-0.7 + 2.0j, -0.2 - 5.0j])
    B = jnp.asarray([[1.0 + 0.5j], [0.3 - 1.0j]])
    x0 = jnp.asarray([1.0 + 0.0j, -0.5 + 0.2j])
    T = 2.0
    exact = np.exp(Lambda * T) * x0 + (np.exp(Lambda * T) - 1) / Lambda * B[:, 0]
    errors, steps = [], [0.1, 0.05, 0.025, 0.0125]
    for dt in steps:
        n = round(T / dt)
        Lambda_bar, B_bar = core.discretize_bilinear(Lambda, B, jnp.full(2, dt))
        b = jnp.ones((n, 1), complex) @ B_bar.T
        _, final = core.linear_recurrence(Lambda_bar, b, initial_state=x0, method="sequential")
        errors.append(float(np.max(np.abs(np.asarray(final) - exact))))
    slope = np.polyfit(np.log(steps), np.log(errors), 1)[0]
    assert slope == pytest.approx(2.0, abs=0.1)


def test_zoh_is_exact_for_constant_input_where_bilinear_is_not(x64):
    Lambda = jnp.asarray([-0.7 + 2.0j])
    B = jnp.asarray([[1.0 + 0.0j]])
    T, dt = 1.0, 0.1
    exact = (np.exp(Lambda * T) - 1) / Lambda
    for name, tol in (("zoh", 1e-12), ("bilinear", None)):
        Lambda_bar, B_bar = core.discretize(name, Lambda, B, jnp.full(1, dt))
        _, final = core.linear_recurrence(Lambda_bar, jnp.ones((10, 1), complex) @ B_bar.T)
        err = abs(complex(final[0]) - complex(exact[0]))
        if tol is None:
            assert err > 1e-4
        else:
            assert err < tol


def test_coefficients_broadcast_over_steps():
    # Per-step Δ (L, P) gives per-step (Λ̄, γ) equal to discretising each row separately.
    Lambda = jnp.asarray([-0.5 + 1.0j, -0.5 - 2.0j], jnp.complex64)
    Delta = jnp.asarray([[0.1, 0.2], [0.3, 0.4], [0.05, 0.01]], jnp.float32)
    for name, fn in core.DISCRETIZATIONS.items():
        Lambda_bar, gamma = fn(Lambda[None, :], Delta)
        for k in range(3):
            row_bar, row_B = core.discretize(
                name, Lambda, jnp.ones((2, 1), jnp.complex64), Delta[k]
            )
            np.testing.assert_allclose(Lambda_bar[k], row_bar, rtol=1e-6)
            np.testing.assert_allclose(gamma[k], row_B[:, 0], rtol=1e-6)


def test_clip_eigs_clips_only_the_real_part_above_the_bound():
    re = jnp.asarray([-1.0, -1e-5, 0.3], jnp.float32)
    np.testing.assert_array_equal(core.clip_eigs(re), jnp.asarray([-1.0, -1e-4, -1e-4]))


@pytest.mark.parametrize(
    ("Lambda", "B", "Delta", "match"),
    [
        (jnp.ones((2, 2), jnp.complex64), jnp.ones((2, 3), jnp.complex64), jnp.ones(2), "Lambda"),
        (jnp.ones(2, jnp.complex64), jnp.ones((3, 3), jnp.complex64), jnp.ones(2), "B_tilde"),
        (jnp.ones(2, jnp.complex64), jnp.ones((2, 3), jnp.complex64), jnp.ones(3), "Delta"),
        (jnp.ones(2, jnp.float32), jnp.ones((2, 3), jnp.complex64), jnp.ones(2), "complex"),
    ],
)
def test_bad_shapes_raise_naming_the_argument_at_trace_time(user_facing, Lambda, B, Delta, match):
    with pytest.raises(ValueError, match=match):
        jax.jit(core.discretize_zoh)(Lambda, B, Delta)


def test_unknown_method_lists_the_registered_ones():
    with pytest.raises(ValueError, match="discretization must be one of"):
        core.discretize(
            "euler", jnp.ones(2, jnp.complex64), jnp.ones((2, 3), jnp.complex64), jnp.ones(2)
        )
