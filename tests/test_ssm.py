"""apply_ssm and the S5SSM layer against independent views of the same system."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import core
from s5jax.nn import S5SSM

from ._reference import layer_params, s5_forward

COMBOS = list(
    itertools.product(
        ["zoh", "bilinear"], [True, False], [True, False], [True, False], [1.0, 2.0, 0.5]
    )
)


@pytest.mark.parametrize(("disc", "conj_sym", "bidir", "clip", "rescale"), COMBOS)
def test_layer_matches_the_reference_semantics_on_48_option_combinations(
    x64, getkey, disc, conj_sym, bidir, clip, rescale
):
    # View 1: S5SSM (core: γ-scaled B̃u, real matmuls, sequential scan).
    # View 2: the spec's formulas, literally, as a float64 NumPy loop (tests/_reference.py).
    layer = S5SSM(
        3,
        8,
        J=2,
        conj_sym=conj_sym,
        bidirectional=bidir,
        discretization=disc,
        clip_eigs=clip,
        dt_min=0.01,
        dt_max=0.5,
        dtype=jnp.float64,
        key=getkey(),
    )
    if clip:  # make the clip bite: push some eigenvalues into the right half-plane
        layer = _with(layer, Lambda_re=layer.Lambda_re.at[::2].set(0.05))
    u = jax.random.normal(getkey(), (17, 3), jnp.float64)
    y = layer(u, step_rescale=rescale)
    expected = s5_forward(
        layer_params(layer),
        u,
        conj_sym=conj_sym,
        bidirectional=bidir,
        discretization=disc,
        clip_eigs=clip,
        step_rescale=rescale,
    )
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-10, atol=1e-10)


def _with(module, **fields):
    import equinox as eqx

    names = list(fields)
    return eqx.tree_at(lambda m: [getattr(m, n) for n in names], module, [fields[n] for n in names])


def test_parallel_and_sequential_layers_agree(x64, getkey):
    key, u = getkey(), jax.random.normal(getkey(), (64, 4), jnp.float64)
    ys = [
        S5SSM(4, 16, J=4, bidirectional=True, dtype=jnp.float64, scan_method=m, key=key)(u)
        for m in ("sequential", "parallel")
    ]
    np.testing.assert_allclose(np.asarray(ys[0]), np.asarray(ys[1]), rtol=1e-10, atol=1e-12)


def test_conj_sym_half_equals_the_full_complex_system(x64, getkey):
    # View 1: P stored states, f = 2. View 2: all 2P states (each eigenvalue and its conjugate,
    # with conjugate columns of B̃ and C̃), f = 1.
    layer = S5SSM(3, 12, J=3, conj_sym=True, dtype=jnp.float64, key=getkey())
    u = jax.random.normal(getkey(), (25, 3), jnp.float64)
    Lambda_bar, B_bar = layer.discretized()
    C = layer.C_tilde()
    half = core.apply_ssm(Lambda_bar, B_bar, C, layer.D, u, conj_sym=True)
    full = core.apply_ssm(
        jnp.concatenate([Lambda_bar, jnp.conj(Lambda_bar)]),
        jnp.concatenate([B_bar, jnp.conj(B_bar)]),
        jnp.concatenate([C, jnp.conj(C)], axis=1),
        layer.D,
        u,
        conj_sym=False,
    )
    np.testing.assert_allclose(np.asarray(half), np.asarray(full), rtol=1e-12, atol=1e-12)


def test_diagonalised_init_equals_the_real_block_hippo_system(x64, getkey):
    # View 1: S5 from its init (Λ, B̃ = V⁻¹B, C̃ = CV, conj_sym). View 2: the real system
    # ẋ = Ax + Bu, y = Cx + Du with A = block-diag HiPPO-N, discretised by expm(AΔ).
    P_full, J, H, dt = 16, 2, 3, 0.07
    Lambda, V, V_inv = core.block_diagonal_eig(P_full, J, conj_sym=True)
    rng = np.random.default_rng(0)
    B, C, D = rng.normal(size=(P_full, H)), rng.normal(size=(H, P_full)), rng.normal(size=H)
    u = rng.normal(size=(30, H))
    Lambda_bar, B_bar = core.discretize_zoh(
        jnp.asarray(Lambda), jnp.asarray(V_inv @ B), jnp.full(P_full // 2, dt)
    )
    y = core.apply_ssm(
        Lambda_bar, B_bar, jnp.asarray((C + 0j) @ V), jnp.asarray(D), jnp.asarray(u), conj_sym=True
    )
    S, _ = core.hippo_n(P_full // J)
    A = np.kron(np.eye(J), S)
    A_bar = np.asarray(jax.scipy.linalg.expm(jnp.asarray(A * dt)))
    B_d = np.linalg.solve(A, (A_bar - np.eye(P_full)) @ B)
    x, expected = np.zeros(P_full), []
    for k in range(30):
        x = A_bar @ x + B_d @ u[k]
        expected.append(C @ x + D * u[k])
    np.testing.assert_allclose(np.asarray(y), np.array(expected), rtol=1e-8, atol=1e-10)


def test_bidirectional_equals_two_unidirectional_runs(x64, getkey):
    # y_bi = forward run with C_fwd + time-reversed forward run with C_bwd (D once).
    layer = S5SSM(3, 8, J=1, bidirectional=True, dtype=jnp.float64, key=getkey())
    u = jax.random.normal(getkey(), (21, 3), jnp.float64)
    Lambda_bar, B_bar = layer.discretized()
    C, P, zero = layer.C_tilde(), layer.P, jnp.zeros(3, jnp.float64)
    fwd = core.apply_ssm(Lambda_bar, B_bar, C[:, :P], zero, u)
    bwd = core.apply_ssm(Lambda_bar, B_bar, C[:, P:], zero, u[::-1])[::-1]
    np.testing.assert_allclose(
        np.asarray(layer(u)), np.asarray(fwd + bwd + layer.D[None] * u), rtol=1e-12, atol=1e-12
    )


def test_recurrent_step_equals_the_scan(x64, getkey):
    layer = S5SSM(3, 8, J=2, dtype=jnp.float64, key=getkey())
    u = jax.random.normal(getkey(), (15, 3), jnp.float64)
    y_scan, final = layer(u, step_rescale=1.5, return_state=True)
    state, ys = layer.init_state(), []
    for k in range(15):
        state, y = layer.step(state, u[k], step_rescale=1.5)
        ys.append(y)
    np.testing.assert_allclose(np.asarray(jnp.stack(ys)), np.asarray(y_scan), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(state), np.asarray(final), rtol=1e-12)
    # And a scan continued from the stepped state equals the scan of the whole sequence.
    u2 = jax.random.normal(getkey(), (5, 3), jnp.float64)
    whole = layer(jnp.concatenate([u, u2]), step_rescale=1.5)
    rest = layer(u2, step_rescale=1.5, initial_state=state)
    np.testing.assert_allclose(np.asarray(rest), np.asarray(whole[15:]), rtol=1e-12)


def test_step_rescale_equals_shifted_log_step(x64, getkey):
    layer = S5SSM(3, 8, dtype=jnp.float64, key=getkey())
    u = jax.random.normal(getkey(), (12, 3), jnp.float64)
    shifted = _with(layer, log_step=layer.log_step + jnp.log(2.0))
    np.testing.assert_allclose(
        np.asarray(layer(u, step_rescale=2.0)), np.asarray(shifted(u)), rtol=1e-12
    )


@pytest.mark.parametrize("bidir", [False, True])
@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_irregular_steps_match_the_reference(x64, getkey, bidir, disc):
    # Per-step Δ_k = Δ·τ_k, forward [1, τ…], backward [τ…, 1] (reference semantics §3).
    layer = S5SSM(
        3, 8, J=2, bidirectional=bidir, discretization=disc, dtype=jnp.float64, key=getkey()
    )
    u = jax.random.normal(getkey(), (20, 3), jnp.float64)
    t = jnp.cumsum(jax.random.randint(getkey(), (20,), 1, 4)).astype(jnp.float64)
    dt = core.step_multipliers(t)
    expected = s5_forward(
        layer_params(layer),
        u,
        conj_sym=True,
        bidirectional=bidir,
        discretization=disc,
        dt=np.asarray(dt),
    )
    np.testing.assert_allclose(np.asarray(layer(u, dt=dt)), expected, rtol=1e-10, atol=1e-10)
    # Unit intervals are the regular layer.
    np.testing.assert_allclose(
        np.asarray(layer(u, dt=jnp.ones(20, jnp.float64))),
        np.asarray(layer(u)),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("bidir", [False, True])
def test_resets_separate_packed_episodes(x64, getkey, bidir):
    # Two episodes packed with a reset = each episode run on its own.
    layer = S5SSM(3, 8, bidirectional=bidir, dtype=jnp.float64, key=getkey())
    a = jax.random.normal(getkey(), (9, 3), jnp.float64)
    b = jax.random.normal(getkey(), (7, 3), jnp.float64)
    resets = jnp.zeros(16, bool).at[9].set(True)
    packed = layer(jnp.concatenate([a, b]), resets=resets)
    np.testing.assert_allclose(
        np.asarray(packed),
        np.asarray(jnp.concatenate([layer(a), layer(b)])),
        rtol=1e-12,
        atol=1e-12,
    )
    expected = s5_forward(
        layer_params(layer),
        np.concatenate([a, b]),
        conj_sym=True,
        bidirectional=bidir,
        resets=np.asarray(resets),
    )
    np.testing.assert_allclose(np.asarray(packed), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bidir", [False, True])
@pytest.mark.parametrize("method", ["sequential", "chunked", "fused", "native"])
def test_segments_equal_resets_at_each_segment_start(x64, getkey, bidir, method):
    # `segments=3` (a batch of three sequences) = `resets` at each one's first step, values
    # and gradients. P = 16 stored states, so "native" runs on the products' layout (which
    # takes no resets); "fused" with resets falls back to the scan.
    if method == "native" and not core.native_available():
        pytest.skip("no native kernel here: " + core.native_build_error())
    layer = S5SSM(3, 32, bidirectional=bidir, dtype=jnp.float64, scan_method=method, key=getkey())
    u = jax.random.normal(getkey(), (3 * 8, 3), jnp.float64)
    starts = jnp.asarray([0, 8, 16])
    # Each episode's multipliers start with 1 (`core.step_multipliers`); with resets the
    # backward scan's last step of an episode takes the next episode's first multiplier.
    dt = jax.random.uniform(getkey(), (3 * 8,), jnp.float64, 0.5, 2.0).at[starts].set(1.0)
    w = jax.random.normal(getkey(), (3 * 8, 3), jnp.float64)
    resets = jnp.zeros(3 * 8, bool).at[starts].set(True)

    # Jitted (segments, a Python int, is static): op by op the eight cases took 35 s in one
    # process, jitted 25 s.
    @eqx.filter_jit
    def run(layer, u, **kwargs):
        return layer(u, **kwargs)

    def loss(layer, u, **kwargs):
        return jnp.sum(w * layer(u, **kwargs))

    for dt_ in (None, dt):
        if dt_ is not None and method in ("fused", "native"):
            continue  # per-step Δ runs the scan: covered by "sequential" and "chunked"
        got = run(layer, u, dt=dt_, segments=3)
        want = run(layer, u, dt=dt_, resets=resets)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-11, atol=1e-11)
        parts = jnp.concatenate([run(layer, u[k : k + 8], dt=None if dt_ is None else
                                     dt_[k : k + 8]) for k in (0, 8, 16)])  # fmt: skip
        np.testing.assert_allclose(np.asarray(got), np.asarray(parts), rtol=1e-11, atol=1e-11)
    grad = eqx.filter_jit(eqx.filter_grad(loss))
    g_seg = grad(layer, u, segments=3)
    g_res = grad(layer, u, resets=resets)
    for a, b in zip(
        jax.tree_util.tree_leaves(g_seg), jax.tree_util.tree_leaves(g_res), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-11)
    grad_u = jax.jit(
        jax.grad(lambda u, **kwargs: loss(layer, u, **kwargs)), static_argnames="segments"
    )
    gu_seg = grad_u(u, segments=3)
    gu_res = grad_u(u, resets=resets)
    np.testing.assert_allclose(np.asarray(gu_seg), np.asarray(gu_res), rtol=1e-10, atol=1e-11)


def test_segments_are_checked(getkey):
    layer = S5SSM(3, 8, key=getkey())
    u = jnp.ones((10, 3))
    with pytest.raises(ValueError, match="segments=3 must divide the sequence length L = 10"):
        layer(u, segments=3)
    with pytest.raises(ValueError, match="segments must be a positive Python int"):
        layer(u, segments=0)
    with pytest.raises(ValueError, match="cannot be combined with resets"):
        layer(u, segments=2, resets=jnp.zeros(10, bool))


def test_float32_agrees_with_the_float64_reference(getkey):
    layer = S5SSM(16, 64, J=4, bidirectional=True, key=getkey())
    u = jax.random.normal(getkey(), (512, 16), jnp.float32)
    y = np.asarray(eqx.filter_jit(layer.__call__)(u))
    assert y.dtype == np.float32
    expected = s5_forward(layer_params(layer), np.asarray(u), conj_sym=True, bidirectional=True)
    rel = np.linalg.norm(y - expected) / np.linalg.norm(expected)
    assert rel <= 1e-5


def test_long_sequence_gradients_are_finite_and_outputs_bounded(getkey):
    # L = 65,536 (reference semantics: clip_eigs is recommended for unbounded lengths).
    layer = S5SSM(4, 8, J=1, clip_eigs=True, key=getkey())
    u = jax.random.normal(getkey(), (65_536, 4), jnp.float32)

    @jax.jit
    def loss_and_grad(layer, u):
        import equinox as eqx

        return eqx.filter_value_and_grad(lambda m: jnp.mean(m(u) ** 2))(layer)

    loss, grads = loss_and_grad(layer, u)
    assert np.isfinite(float(loss)) and float(loss) < 1e3
    for g in jax.tree_util.tree_leaves(grads):
        assert bool(jnp.all(jnp.isfinite(g)))
