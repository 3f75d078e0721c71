"""The fused SSM path (`method="fused"`) against the scan path.

The fused path computes B̃u, the recurrences and C̃x blockwise in real (re, im) planes with its
own VJP and its own batching rule (`s5jax.core._ssm`). Every test compares it with the
sequential scan on complex arrays (float64 where precision matters), outputs and gradients.
`small_blocks` shrinks the block to 8 steps so that short sequences span several blocks.
"""

import functools
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import core
from s5jax.core import _ssm
from s5jax.nn import S5SSM

from ._reference import layer_params, s5_forward


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_ssm, "FUSED_BLOCK", 8)


def _system(key, H=3, P_full=8, *, conj_sym=True, bidirectional=False, dtype=jnp.float64):
    layer = S5SSM(
        H, P_full, J=2 if conj_sym else 1, conj_sym=conj_sym, bidirectional=bidirectional,
        lambda_init="hippo" if conj_sym else "s4d_lin", dt_min=0.01, dt_max=0.5, dtype=dtype,
        key=key,
    )  # fmt: skip
    Lambda_bar, B_bar = layer.discretized()
    return Lambda_bar, B_bar, layer.C_tilde(), layer.D


def _close(a, b, tol=1e-11):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def _auto_scan():
    """What "auto" runs below the fused path's length on this backend."""
    if jax.default_backend() != "cpu":
        return "parallel"
    return "native" if core.native_available() and jax.device_count() == 1 else "chunked"


def test_auto_is_native_or_chunked_on_cpu_and_methods_are_validated():
    assert _ssm.resolve_ssm_method("auto") == _auto_scan()
    assert _ssm.resolve_ssm_method("fused") == "fused"
    assert _ssm.resolve_ssm_method("sequential") == "sequential"
    with pytest.raises(ValueError, match="scan method must be 'auto', 'fused' or one of"):
        _ssm.resolve_ssm_method("fast")
    with pytest.raises(ValueError, match="scan method must be 'auto', 'fused' or one of"):
        S5SSM(4, 8, scan_method="fast", key=jax.random.PRNGKey(0))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU rule of 'auto'")
def test_auto_on_cpu_prefers_native_and_falls_back_to_chunked(monkeypatch):
    built = []

    def available():
        built.append(True)
        return True

    monkeypatch.setattr(_ssm, "native_available", available)
    assert _ssm.resolve_ssm_method("auto", states=10) == "native"
    # Validating a name (as S5SSM does when it is built) compiles nothing.
    built.clear()
    _ssm.check_ssm_method("auto")
    S5SSM(4, 8, key=jax.random.PRNGKey(0))
    assert built == []
    # Named methods and long sequences are not affected.
    assert _ssm.resolve_ssm_method("chunked", states=10) == "chunked"
    assert _ssm.resolve_ssm_method("auto", states=_ssm.AUTO_CPU_FUSED_ABOVE + 1) == "fused"
    # Several devices: XLA cannot partition the custom call over them (it would gather the
    # batch onto every device), so "auto" keeps the chunked scan.
    monkeypatch.setattr(jax, "device_count", lambda *args: 2)
    assert _ssm.resolve_ssm_method("auto", states=10) == "chunked"
    monkeypatch.setattr(jax, "device_count", lambda *args: 1)
    assert _ssm.resolve_ssm_method("auto", states=10) == "native"
    # No kernel here (no compiler, a failed build, S5JAX_NATIVE=0), or the switch off.
    monkeypatch.setattr(_ssm, "native_available", lambda: False)
    assert _ssm.resolve_ssm_method("auto", states=10) == "chunked"
    monkeypatch.setattr(_ssm, "native_available", available)
    monkeypatch.setattr(_ssm, "AUTO_CPU_NATIVE", False)
    assert _ssm.resolve_ssm_method("auto", states=10) == "chunked"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU rule of 'auto'")
def test_auto_is_fused_on_cpu_for_long_sequences():
    limit = _ssm.AUTO_CPU_FUSED_ABOVE
    scan = _auto_scan()
    assert _ssm.resolve_ssm_method("auto", states=limit) == scan
    assert _ssm.resolve_ssm_method("auto", states=limit + 1) == "fused"
    assert _ssm.resolve_ssm_method("sequential", states=limit + 1) == "sequential"
    # The paper's Path-X (L 16,384, 128 states each way) is fused; its Speech (L 16,000,
    # 64 each way) and Retrieval (L 4,000, 128 each way) stay on the scan.
    assert _ssm.resolve_ssm_method("auto", states=16384 * 128 * 2) == "fused"
    assert _ssm.resolve_ssm_method("auto", states=16000 * 64 * 2) == scan
    assert _ssm.resolve_ssm_method("auto", states=4000 * 128 * 2) == scan


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU rule of 'auto'")
def test_auto_under_bf16_products_follows_the_switch(monkeypatch):
    # Default: bf16 products change nothing in auto's choice (the scan, fused above the limit).
    limit = _ssm.AUTO_CPU_FUSED_ABOVE
    scan = _auto_scan()
    assert _ssm.resolve_ssm_method("auto", states=10, matmul_dtype=jnp.bfloat16) == scan
    assert _ssm.resolve_ssm_method("auto", states=limit + 1, matmul_dtype=jnp.bfloat16) == "fused"
    assert _ssm.resolve_ssm_method("chunked", matmul_dtype=jnp.bfloat16) == "chunked"
    calls = []
    fused = _ssm._apply_fused

    def spy(*args, **kwargs):
        calls.append(kwargs.get("matmul_dtype"))
        return fused(*args, **kwargs)

    monkeypatch.setattr(_ssm, "_apply_fused", spy)
    ssm = S5SSM(8, 16, bidirectional=True, precision="bf16", key=jax.random.PRNGKey(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (64, 8))
    y_chunked = ssm(u)
    assert calls == []
    # With the switch on, a bf16 S5SSM under "auto" runs the fused path; with resets (which it
    # cannot take) it falls back to the scan; the two agree to bfloat16 rounding.
    monkeypatch.setattr(_ssm, "AUTO_CPU_FUSED_FOR_BF16", True)
    assert _ssm.resolve_ssm_method("auto", states=10, matmul_dtype=jnp.bfloat16) == "fused"
    assert _ssm.resolve_ssm_method("auto", states=10) == scan
    y = ssm(u)
    assert calls == [jnp.bfloat16]
    ssm(u, resets=jnp.zeros((64,), bool))
    assert len(calls) == 1
    rel = float(jnp.linalg.norm(y - y_chunked) / jnp.linalg.norm(y_chunked))
    assert 0 < rel < 2e-2


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU rule of 'auto'")
@pytest.mark.parametrize("bidir", [False, True])
def test_apply_ssm_auto_counts_states_per_sequence(x64, monkeypatch, getkey, bidir):
    # L 12, 4 stored states, ×2 bidirectional: the threshold is crossed at 48 (96) states.
    Lambda_bar, B_bar, C, D = _system(getkey(), bidirectional=bidir)
    P = Lambda_bar.shape[0]
    u = jax.random.normal(getkey(), (12, 3), jnp.float64)
    states = 12 * P * (2 if bidir else 1)
    calls = []
    fused = _ssm._apply_fused

    def spy(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(_ssm, "_apply_fused", spy)

    def ssm(method):  # a new function each time: traced afresh, the threshold read anew
        return lambda v: core.apply_ssm(Lambda_bar, B_bar, C, D, v, bidirectional=bidir,
                                        method=method)  # fmt: skip

    def square_grad(f):
        return jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 2)))

    want = jax.jit(ssm("sequential"))(u)
    ref = square_grad(ssm("sequential"))(u)
    for limit, used_fused in ((states, False), (states - 1, True)):
        monkeypatch.setattr(_ssm, "AUTO_CPU_FUSED_ABOVE", limit)
        calls.clear()
        got = square_grad(ssm("auto"))(u)
        y = jax.jit(ssm("auto"))(u)
        assert bool(calls) == used_fused
        _close(y, want)
        _close(got, ref)


CASES = list(itertools.product([True, False], [True, False], [1, 7, 24], [False, True]))


@pytest.mark.parametrize(("conj_sym", "bidir", "L", "return_state"), CASES)
def test_fused_equals_the_scan_with_gradients(
    x64, small_blocks, getkey, conj_sym, bidir, L, return_state
):
    # A batch of 3 under jax.vmap (the batching rule) and one example alone; gradients with
    # respect to Λ̄, B̄, C̃, D, u and (unidirectional) the initial state, through a loss that
    # also uses the returned final state.
    Lambda_bar, B_bar, C, D = _system(getkey(), conj_sym=conj_sym, bidirectional=bidir)
    P = Lambda_bar.shape[0]
    u = jax.random.normal(getkey(), (3, L, 3), jnp.float64)
    w = jax.random.normal(getkey(), (3, L, 3), jnp.float64)
    x0 = None
    if not bidir:
        x0 = jax.lax.complex(*jax.random.normal(getkey(), (2, P), jnp.float64))
    options = dict(conj_sym=conj_sym, bidirectional=bidir, return_state=return_state)

    def loss(method, Lambda_bar, B_bar, C, D, u, x0):
        def one(v):
            return core.apply_ssm(
                Lambda_bar, B_bar, C, D, v, initial_state=x0, method=method, **options
            )

        out = jax.vmap(one)(u)
        y, final = out if return_state else (out, None)
        total = jnp.sum(y * w) + jnp.sum(jnp.sin(one(u[0])[0] if return_state else one(u[0])))
        if return_state:
            total = total + jnp.sum(jnp.abs(final) ** 2)
        return total, out

    args = (Lambda_bar, B_bar, C, D, u, x0)
    wrt = (1, 2, 3, 4, 5) if bidir else (1, 2, 3, 4, 5, 6)
    # Both jitted: op by op, the scan's reference took 5.5 s of one case's 7.4 s.
    grad = jax.jit(jax.value_and_grad(loss, argnums=wrt, has_aux=True), static_argnums=0)
    (v_seq, out_seq), g_seq = grad("sequential", *args)
    (v_fus, out_fus), g_fus = grad("fused", *args)
    _close(out_fus, out_seq)
    _close(v_fus, v_seq)
    _close(g_fus, g_seq, tol=1e-10)


@pytest.mark.parametrize("L", [32, 40])
def test_bidirectional_reuse_of_b_bar_u_matches_remaking_it(
    x64, small_blocks, monkeypatch, getkey, L
):
    # The bidirectional forward pass keeps B̄u for the second direction and for the backward pass
    # (blocks of 8: 4 and 5 blocks, even and odd) unless it exceeds FUSED_REUSE_BYTES; both ways
    # equal the scan, values and gradients.
    Lambda_bar, B_bar, C, D = _system(getkey(), bidirectional=True)
    u = jax.random.normal(getkey(), (2, L, 3), jnp.float64)
    w = jax.random.normal(getkey(), (2, L, 3), jnp.float64)

    def loss(method, Lambda_bar, B_bar, C, D, u):
        y = jax.vmap(
            lambda v: core.apply_ssm(Lambda_bar, B_bar, C, D, v, bidirectional=True, method=method)
        )(u)
        return jnp.sum(y * w), y

    grad = jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True)
    args = (Lambda_bar, B_bar, C, D, u)
    (_, y_seq), g_seq = jax.jit(grad, static_argnums=0)("sequential", *args)
    programs = []
    for limit in (_ssm.FUSED_REUSE_BYTES, 0):
        monkeypatch.setattr(_ssm, "FUSED_REUSE_BYTES", limit)
        _ssm._fused_ssm.cache_clear()  # the kernels are traced anew with this limit
        # A new function each time: jax.jit would reuse the first trace of the same one.
        fresh = jax.jit(
            jax.value_and_grad(lambda *a: loss("fused", *a), argnums=(0, 1, 2, 3, 4), has_aux=True)
        )
        (_, y_fus), g_fus = fresh(*args)
        _close(y_fus, y_seq)
        _close(g_fus, g_seq, tol=1e-10)
        programs.append(fresh.lower(*args).as_text())
    _ssm._fused_ssm.cache_clear()
    assert programs[0] != programs[1]  # the limit chose between two different computations


@pytest.mark.parametrize(
    ("disc", "rescale", "clip"), [("zoh", 1.0, False), ("bilinear", 2.0, True), ("zoh", 0.5, True)]
)
@pytest.mark.parametrize("bidir", [False, True])
def test_layer_options_match_the_scan_and_the_reference(
    x64, small_blocks, getkey, disc, rescale, clip, bidir
):
    key = getkey()
    options = dict(
        J=2, bidirectional=bidir, discretization=disc, clip_eigs=clip, dt_min=0.01, dt_max=0.5,
        dtype=jnp.float64, key=key,
    )  # fmt: skip
    layers = {m: S5SSM(3, 8, scan_method=m, **options) for m in ("sequential", "fused")}
    u = jax.random.normal(getkey(), (20, 3), jnp.float64)
    ys = {m: eqx.filter_jit(layer)(u, step_rescale=rescale) for m, layer in layers.items()}
    expected = s5_forward(
        layer_params(layers["fused"]), u, conj_sym=True, bidirectional=bidir,
        discretization=disc, clip_eigs=clip, step_rescale=rescale,
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(ys["fused"]), expected, rtol=1e-10, atol=1e-10)
    _close(ys["fused"], ys["sequential"])
    grad = eqx.filter_jit(
        eqx.filter_grad(lambda mod: jnp.sum(jnp.tanh(mod(u, step_rescale=rescale))))
    )
    grads = {m: grad(layer) for m, layer in layers.items()}
    _close(eqx.filter(grads["fused"], eqx.is_array), eqx.filter(grads["sequential"], eqx.is_array))


@pytest.mark.parametrize("bidir", [False, True])
def test_per_step_dt_and_resets_fall_back_to_the_scan(x64, small_blocks, getkey, bidir):
    # Irregular steps (apply_ssm_continuous with dt) and packed episodes are not fused: the
    # scan path runs and gives the reference's numbers.
    key = getkey()
    layer, seq = (
        S5SSM(3, 8, J=2, bidirectional=bidir, scan_method=m, dtype=jnp.float64, key=key)
        for m in ("fused", "sequential")
    )
    u = jax.random.normal(getkey(), (20, 3), jnp.float64)
    t = jnp.cumsum(jax.random.randint(getkey(), (20,), 1, 4)).astype(jnp.float64)
    dt = core.step_multipliers(t)
    resets = jnp.zeros(20, bool).at[9].set(True)
    params = layer_params(layer)
    np.testing.assert_allclose(
        np.asarray(layer(u, dt=dt)),
        s5_forward(params, u, conj_sym=True, bidirectional=bidir, dt=np.asarray(dt)),
        rtol=1e-10, atol=1e-10,
    )  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(layer(u, resets=resets)),
        s5_forward(params, u, conj_sym=True, bidirectional=bidir, resets=np.asarray(resets)),
        rtol=1e-10, atol=1e-10,
    )  # fmt: skip
    for kwargs in (dict(dt=dt), dict(resets=resets)):
        g = [
            eqx.filter_grad(lambda m, kw=kwargs: jnp.sum(m(u, **kw) ** 2))(m) for m in (layer, seq)
        ]
        _close(eqx.filter(g[0], eqx.is_array), eqx.filter(g[1], eqx.is_array))


def test_a_length_without_a_block_size_falls_back(x64, small_blocks, getkey):
    assert _ssm._block_size(11) is None and _ssm._block_size(24) == 8
    Lambda_bar, B_bar, C, D = _system(getkey(), bidirectional=True)
    u = jax.random.normal(getkey(), (11, 3), jnp.float64)
    ys = [core.apply_ssm(Lambda_bar, B_bar, C, D, u, bidirectional=True, method=m)
          for m in ("fused", "sequential")]  # fmt: skip
    _close(ys[0], ys[1])


def test_per_example_gradients_under_vmap_of_grad(x64, small_blocks, getkey):
    # jax.vmap(jax.grad(...)) must give each example its own weight gradient (the batching
    # rule of the VJP is per example, not a sum over the batch).
    Lambda_bar, B_bar, C, D = _system(getkey(), bidirectional=True)
    u = jax.random.normal(getkey(), (4, 24, 3), jnp.float64)

    def loss(method, B_bar, C, v):
        y = core.apply_ssm(Lambda_bar, B_bar, C, D, v, bidirectional=True, method=method)
        return jnp.sum(jnp.tanh(y))

    # Jitted, as in the next two tests: op by op these three took 22.5 s in one process, 11.0 s
    # jitted (2-core Zen 4 EPYC).
    grad = jax.grad(loss, argnums=(1, 2))
    per_example = jax.vmap(grad, in_axes=(None, None, None, 0))
    fused = jax.jit(per_example, static_argnums=0)("fused", B_bar, C, u)
    one = jax.jit(grad, static_argnums=0)  # compiled once for the four examples
    looped = [one("sequential", B_bar, C, u[i]) for i in range(4)]
    _close(fused, jax.tree_util.tree_map(lambda *g: jnp.stack(g), *looped))
    assert float(jnp.max(jnp.abs(fused[0][0] - fused[0][1]))) > 1e-3  # examples differ


def test_batched_systems_and_jacobians(x64, small_blocks, getkey):
    # vmap over systems (weights batched: the generic batching path) and jax.jacrev (vmap over
    # output cotangents with an unbatched input).
    systems = [_system(getkey()) for _ in range(2)]
    stacked = jax.tree_util.tree_map(lambda *z: jnp.stack(z), *systems)
    u = jax.random.normal(getkey(), (2, 16, 3), jnp.float64)

    @functools.partial(jax.jit, static_argnums=0)
    def run(method, stacked, u):
        def one(Lambda_bar, B_bar, C, D, v):
            return core.apply_ssm(Lambda_bar, B_bar, C, D, v, method=method)

        return jax.vmap(one)(*stacked, u)

    _close(run("fused", stacked, u), run("sequential", stacked, u))

    def f(method, v, system):
        return core.apply_ssm(*system, v, bidirectional=False, method=method)

    jacobian = jax.jit(jax.jacrev(f, argnums=1), static_argnums=0)
    jac = [jacobian(m, u[0], systems[0]) for m in ("fused", "sequential")]
    _close(jac[0], jac[1])


def test_checkpointed_fused_ssm_gives_the_same_gradients(x64, small_blocks, getkey):
    layer = S5SSM(3, 8, J=2, bidirectional=True, scan_method="fused", dtype=jnp.float64,
                  key=getkey())  # fmt: skip
    u = jax.random.normal(getkey(), (2, 24, 3), jnp.float64)

    def loss(m, remat):
        call = eqx.filter_checkpoint(lambda m, v: m(v)) if remat else (lambda m, v: m(v))
        return jnp.sum(jnp.sin(jax.vmap(lambda v: call(m, v))(u)))

    g = [eqx.filter_jit(eqx.filter_grad(loss))(layer, r) for r in (False, True)]
    _close(eqx.filter(g[0], eqx.is_array), eqx.filter(g[1], eqx.is_array))


@pytest.mark.parametrize(("L", "bidir"), [(20, True), (50, False), (300, True)])
def test_a_batch_equals_its_examples_run_one_by_one(getkey, L, bidir):
    # float32: the batched kernel gives each example what it gives that example alone, up to
    # the summation order of the matrix products (which the CPU's GEMM blocking may change
    # with the number of rows), i.e. to float32 rounding relative to the output's scale.
    layer = S5SSM(4, 8, bidirectional=bidir, scan_method="fused", key=getkey())
    u = jax.random.normal(getkey(), (3, L, 4))
    batched = eqx.filter_jit(lambda m, u: jax.vmap(m)(u))(layer, u)
    one = eqx.filter_jit(lambda m, v: m(v))
    for i in range(3):
        alone = np.asarray(one(layer, u[i]))
        scale = float(np.max(np.abs(alone)))
        np.testing.assert_allclose(np.asarray(batched[i]), alone, rtol=1e-6, atol=1e-6 * scale)


def test_float32_long_sequence_agrees_with_the_float64_reference(getkey):
    layer = S5SSM(8, 16, J=2, bidirectional=True, scan_method="fused", key=getkey())
    u = jax.random.normal(getkey(), (4096, 8), jnp.float32)
    y = np.asarray(eqx.filter_jit(layer.__call__)(u))
    assert y.dtype == np.float32
    expected = s5_forward(layer_params(layer), np.asarray(u), conj_sym=True, bidirectional=True)
    assert np.linalg.norm(y - expected) / np.linalg.norm(expected) <= 1e-5


def _all_eqns(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside its equations (pjit, custom VJPs)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for v in value if isinstance(value, tuple | list) else (value,):
                sub = v if hasattr(v, "eqns") else getattr(v, "jaxpr", None)
                if hasattr(sub, "eqns"):
                    yield from _all_eqns(sub)


def test_the_fused_kernel_has_no_complex_arrays_of_sequence_length(getkey):
    # The hot path is real: no complex array with an axis of length L is ever formed.
    L = 512
    layer = S5SSM(4, 8, bidirectional=True, scan_method="fused", key=getkey())
    u = jnp.ones((2, L, 4), jnp.float32)

    def loss(m):
        return jnp.sum(jax.vmap(m)(u) ** 2)

    jaxpr = jax.make_jaxpr(eqx.filter_grad(loss))(layer)
    complex_long = [
        v.aval for eqn in _all_eqns(jaxpr.jaxpr) for v in eqn.outvars
        if jnp.issubdtype(v.aval.dtype, jnp.complexfloating) and L in v.aval.shape
    ]  # fmt: skip
    assert not complex_long


@pytest.mark.parametrize(
    "method", ["sequential", "chunked"] + (["native"] if core.native_available() else [])
)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_conjugate_symmetry_factor_scales_the_weight_not_the_sequence(
    getkey, method, bidirectional
):
    # y = 2·Re(C̃x) + D⊙u: the 2 goes into C̃'s (2P, H) product weight. Applied to the (L, H)
    # output instead, it costs a pass over the output and two over its cotangent.
    L, H = 50, 4  # L unlike any weight's size: the (2nP, H) = (32 or 64, 4) weight is scaled
    layer = S5SSM(H, 32, bidirectional=bidirectional, scan_method=method, key=getkey())
    u = jax.random.normal(getkey(), (2, L, H))
    w = jax.random.normal(getkey(), (2, L, H))

    def loss(m):  # linear in y: its cotangent w carries no factor of its own
        return jnp.sum(jax.vmap(m)(u) * w)

    doubled = [
        eqn for eqn in _all_eqns(jax.make_jaxpr(eqx.filter_grad(loss))(layer).jaxpr)
        if eqn.primitive.name == "mul" and L in eqn.outvars[0].aval.shape
        and any(float(np.max(np.abs(getattr(v, "val", 0.0)))) == 2.0 for v in eqn.invars)
    ]  # fmt: skip
    assert not doubled, doubled
    with jax.enable_x64(True):  # and the result is still the paper's 2·Re(C̃x) + D⊙u
        layer64 = jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, layer
        )
        y = np.asarray(layer64(u[0].astype(jnp.float64)))
    expected = s5_forward(layer_params(layer), np.asarray(u[0], np.float64), conj_sym=True,
                          bidirectional=bidirectional)  # fmt: skip
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-9)
