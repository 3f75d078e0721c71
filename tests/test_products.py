"""`s5jax.core._products.matmul`: the products with a vmap-friendly custom VJP.

Checked against the plain product in float64 (values and both gradients, vmapped over a batch
as in training, and with bfloat16 operands accumulated in float32), its wiring into the SSM,
`Dense` and the pendulum CNN (their traced programs hold the custom VJP, and do not with the
switch off), and the switch itself: forward-mode autodiff through a model works with
`VMAP_FRIENDLY_GRADIENT = False` and agrees with reverse mode. The mixed-precision backward
pass (bfloat16 operands, float32 accumulation): both gradients against float64 products of the
bfloat16-rounded cotangent, `REDUCED_PRECISION_GRADIENT = False` against JAX's own gradient,
and the compiled program's products on bfloat16 operands (CPU). With the cast inside
(`operand_dtype`), a float32 weight's gradient against the float64 sum of the bfloat16
products, to float32 rounding, where the cast outside (`MASTER_WEIGHT_GRADIENT = False`)
misses it.
The batch-level product under `vmap` (`BATCH_LEVEL_GRADIENT`) against the plain product in
every autodiff order (grad of vmap, vmap of grad, grad alone; odd and even batches), and the
traced programs, a product alone and the trainer's whole step, without a reduce_sum over the
batch axis of a stack of weight gradients (present with the switch off). `scale_columns`
(the feed-through D ⊙ u) against x ⊙ d, its ∂d a contraction rather than a reduce_sum.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.config import OptimConfig
from s5jax.config._schema import ModelConfig
from s5jax.core import _native, _products, apply_ssm
from s5jax.core._products import matmul
from s5jax.nn import S5SSM, Dense, PendulumCNN, build_model
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps


@pytest.fixture
def plain_products(monkeypatch):
    monkeypatch.setattr(_products, "VMAP_FRIENDLY_GRADIENT", False)


def _loss(product):
    def loss(w, x):
        y = jax.vmap(lambda xi: product(xi, w))(x)
        return jnp.sum(jnp.tanh(y) * jnp.arange(y.size, dtype=y.dtype).reshape(y.shape) / y.size)

    return loss


def test_matmul_equals_the_plain_product_with_gradients_under_vmap_in_float64():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 5), jnp.float64)
        w = jax.random.normal(jax.random.PRNGKey(1), (5, 4), jnp.float64)
        ours = jax.jit(jax.value_and_grad(_loss(matmul), argnums=(0, 1)))(w, x)
        plain = jax.value_and_grad(_loss(lambda a, b: a @ b), argnums=(0, 1))(w, x)
        for got, want in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(plain)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-13, atol=1e-15)


def _per_example_grads(product):
    """Each example's gradient of `_loss` with respect to the shared weight: vmap(grad)."""
    return jax.vmap(jax.grad(lambda w, xi: _loss(product)(w, xi[None])), in_axes=(None, 0))


@pytest.mark.parametrize("batch", [1, 3, 4, 5])
def test_batch_level_product_equals_the_plain_one_in_every_autodiff_order_in_float64(batch):
    """grad of vmap (the batch-level product, its weight gradient summed pairwise: odd and even
    batches), vmap of grad (each example's weight gradient apart: the batch-level product must
    not run there: it would give every example the batch's sum) and grad alone, against the
    plain product."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(batch), (batch, 7, 5), jnp.float64)
        w = jax.random.normal(jax.random.PRNGKey(9), (5, 4), jnp.float64)
        plain = lambda a, b: a @ b  # noqa: E731
        for ours, want in [
            (jax.jit(jax.grad(_loss(matmul), argnums=(0, 1)))(w, x),
             jax.grad(_loss(plain), argnums=(0, 1))(w, x)),
            (jax.jit(_per_example_grads(matmul))(w, x), _per_example_grads(plain)(w, x)),
            (jax.grad(lambda w: jnp.sum(jnp.sin(matmul(x[0], w))))(w),
             jax.grad(lambda w: jnp.sum(jnp.sin(x[0] @ w)))(w)),
        ]:  # fmt: skip
            for got, ref in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(want)):
                assert got.shape == ref.shape
                np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-13, atol=1e-14)


def _batch_sums(jaxpr, shape, axis) -> int:
    """reduce_sum equations in `jaxpr` (nested ones too) over `axis` (among others) of an
    operand of `shape`."""
    found = 0
    for eqn in jaxpr.eqns:
        if (
            eqn.primitive.name == "reduce_sum"
            and tuple(eqn.invars[0].aval.shape) == shape
            and axis in eqn.params["axes"]
        ):
            found += 1
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)  # a ClosedJaxpr's jaxpr, or a Jaxpr
            if hasattr(inner, "eqns"):
                found += _batch_sums(inner, shape, axis)
    return found


@pytest.mark.parametrize("batch_level", [True, False])
def test_weight_gradient_is_not_a_sum_over_the_batch_axis(monkeypatch, batch_level):
    """Under grad of vmap the weight gradient's batch sum is pairwise adds, not a reduce_sum
    over the (batch, K, N) stack of per-example gradients, which XLA's CPU backend runs
    slowly; with `BATCH_LEVEL_GRADIENT = False` the reduce_sum is there (JAX's batching)."""
    monkeypatch.setattr(_products, "BATCH_LEVEL_GRADIENT", batch_level)
    x, w = jnp.ones((4, 16, 32)), jnp.ones((32, 24))
    jaxpr = jax.make_jaxpr(jax.grad(_loss(matmul)))(w, x).jaxpr
    assert _batch_sums(jaxpr, (4, 32, 24), 0) == (0 if batch_level else 1)


@pytest.mark.parametrize("batch", [1, 3])
def test_scale_columns_equals_the_plain_scale_with_gradients_in_float64(batch):
    """`scale_columns(x, d)` = x ⊙ d: value, both gradients under grad of vmap, each example's
    gradients under vmap of grad; and the gradient for d is a contraction (dot_general), not a
    reduce_sum over the rows."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(batch), (batch, 6, 5), jnp.float64)
        d = jax.random.normal(jax.random.PRNGKey(7), (5,), jnp.float64)

        def loss(scale):
            def f(d, x):
                y = jax.vmap(lambda xi: scale(xi, d))(x)
                return jnp.vdot(jnp.tanh(y).ravel(), jnp.arange(y.size, dtype=y.dtype))

            return f

        ours, plain = _products.scale_columns, lambda x, d: x * d[None, :]
        np.testing.assert_array_equal(np.asarray(ours(x[0], d)), np.asarray(plain(x[0], d)))
        got = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(d, x)
        want = jax.grad(loss(plain), argnums=(0, 1))(d, x)
        per_ex = jax.vmap(jax.grad(lambda d, xi: loss(ours)(d, xi[None])), in_axes=(None, 0))
        per_ex_want = jax.vmap(
            jax.grad(lambda d, xi: loss(plain)(d, xi[None])), in_axes=(None, 0)
        )(d, x)  # fmt: skip
        for g, r in [*zip(got, want, strict=True), (per_ex(d, x), per_ex_want)]:
            assert g.shape == r.shape
            # float64 rounding relative to the gradient's scale: an entry near zero is a
            # difference of large terms (seen with quick compilation: 3.5e-14 on an entry of
            # 5e-3, where the largest is about 100)
            scale = float(np.abs(np.asarray(r)).max())
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-13, atol=1e-14 * scale)
        jaxpr = jax.make_jaxpr(jax.grad(loss(ours)))(d, x).jaxpr
        plain_jaxpr = jax.make_jaxpr(jax.grad(loss(plain)))(d, x).jaxpr
        assert _batch_sums(jaxpr, (batch, 6, 5), 1) == 0  # over the rows
        assert _batch_sums(plain_jaxpr, (batch, 6, 5), 1) == 1
    with pytest.raises((ValueError, TypeError), match="scale_columns"):  # jaxtyping in tests
        _products.scale_columns(jnp.ones((3, 4)), jnp.ones((3,)))


def test_matmul_with_bfloat16_operands_accumulates_in_float32_like_jnp_matmul():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.PRNGKey(1), (16, 8)).astype(jnp.bfloat16)

    def plain(a, b):
        return jnp.matmul(a, b, preferred_element_type=jnp.float32)

    ours_y = matmul(x[0], w, jnp.float32)
    assert ours_y.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(ours_y), np.asarray(plain(x[0], w)))
    ours = jax.grad(_loss(lambda a, b: matmul(a, b, jnp.float32)), argnums=(0, 1))(w, x)
    want = jax.grad(_loss(plain), argnums=(0, 1))(w, x)
    for got, ref in zip(ours, want, strict=True):
        assert got.dtype == ref.dtype == jnp.bfloat16
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=1e-2
        )


@pytest.mark.parametrize("rows", [1, 7, 12, 34, 48])
def test_rows_to_columns_is_the_transpose(rows):
    a = jax.random.normal(jax.random.PRNGKey(rows), (rows, 5)).astype(jnp.bfloat16)
    got = _products._rows_to_columns(a)
    assert got.shape == (5, rows) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(a, np.float32).T)


def _bf16(x) -> np.ndarray:
    """x rounded to bfloat16, as float64 (the exact value the bfloat16 products read)."""
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64)


@pytest.mark.parametrize("rows", [9, 16])
def test_mixed_precision_gradient_is_the_bfloat16_rounded_cotangent_times_the_operands(rows):
    """Under vmap, as in training: ∂a = bf16(g) bᵀ and ∂w = Σ_batch aᵀ bf16(g), computed in
    float64 from the bfloat16 values and rounded to bfloat16 (the operands' dtype). ∂a matches
    bit for bit almost everywhere (float32 accumulation of 16 exact bfloat16 products), where
    JAX's product of the float32 cotangent, rounded the same way, matches only about 60 %."""
    x = jax.random.normal(jax.random.PRNGKey(0), (3, rows, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.PRNGKey(1), (16, 8)).astype(jnp.bfloat16)
    g = jax.random.normal(jax.random.PRNGKey(2), (3, rows, 8), jnp.float32)

    def f(w, x):
        return jax.vmap(lambda xi: matmul(xi, w, jnp.float32))(x)

    y, vjp = jax.vjp(jax.jit(f), w, x)
    assert y.dtype == jnp.float32
    dw, dx = vjp(g)
    assert dw.dtype == dx.dtype == jnp.bfloat16
    xs, ws, gs = (np.asarray(v, np.float64) for v in (x, w, g))
    gb = _bf16(gs)
    dx = np.asarray(dx, np.float64)
    want_dx = _bf16(gb @ ws.T)
    np.testing.assert_allclose(dx, want_dx, rtol=2**-8)  # everywhere within one rounding
    assert np.mean(dx == want_dx) >= 0.95
    assert np.mean(dx == _bf16(gs @ ws.T)) < 0.8  # the check above can tell them apart
    # ∂w: per-example products summed over the batch (XLA may sum before rounding); within
    # one bfloat16 rounding of each example's product and of the sum
    per_example = np.einsum("blk,bln->bkn", xs, gb)
    want_dw = per_example.sum(0)
    slack = 2**-8 * (np.abs(per_example).sum(0) + np.abs(want_dw)) + 1e-6
    assert np.all(np.abs(np.asarray(dw, np.float64) - want_dw) <= slack)


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_cast_inside_keeps_a_float32_weights_gradient_unrounded(monkeypatch, x_dtype):
    """`operand_dtype=bfloat16` with a float32 master weight, vmapped over a batch as in
    training: the product is the one of the cast operands; ∂W = Σ_batch bf16(x)ᵀ bf16(g),
    the exact float64 value to float32 accumulation error (rtol 1e-5), and float32; ∂x in
    x's dtype. `MASTER_WEIGHT_GRADIENT = False` (the cast outside the product, as before)
    misses that tolerance by far: each example's ∂W rounded to bfloat16 before the sum."""
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 40, 32)).astype(x_dtype)
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 24), jnp.float32) / 6
    g = jax.random.normal(jax.random.PRNGKey(2), (6, 40, 24), jnp.float32)

    def grads():
        def f(w, x):
            return jax.vmap(lambda xi: matmul(xi, w, jnp.float32, operand_dtype=jnp.bfloat16))(x)

        y, vjp = jax.vjp(jax.jit(f), w, x)
        return (y, *vjp(g))

    y, dw, dx = grads()
    xb, wb, gb = _bf16(x), _bf16(w), _bf16(g)
    np.testing.assert_allclose(np.asarray(y, np.float64), xb @ wb, rtol=1e-5, atol=1e-5)
    assert dw.dtype == jnp.float32 and dx.dtype == x_dtype
    want_dw = np.einsum("blk,bln->kn", xb, gb)
    scale = np.einsum("blk,bln->kn", np.abs(xb), np.abs(gb))  # bounds the rounding error
    assert np.all(np.abs(np.asarray(dw, np.float64) - want_dw) <= 1e-5 * scale)
    np.testing.assert_allclose(
        np.asarray(dx, np.float64), gb @ wb.T, rtol=2**-7 if x_dtype == jnp.bfloat16 else 1e-5,
        atol=1e-5,
    )  # fmt: skip
    monkeypatch.setattr(_products, "MASTER_WEIGHT_GRADIENT", False)
    _, dw_before, _ = grads()
    assert dw_before.dtype == jnp.float32
    err = np.abs(np.asarray(dw_before, np.float64) - want_dw) / scale
    assert err.max() > 1e-4  # the check above can fail: bfloat16 rounding, 2⁻⁹ relative
    assert err.max() < 2**-6  # (and otherwise the same gradient)


def test_mixed_precision_gradient_switch_gives_jax_float32_gradient_products(monkeypatch):
    monkeypatch.setattr(_products, "REDUCED_PRECISION_GRADIENT", False)
    x = jax.random.normal(jax.random.PRNGKey(0), (9, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.PRNGKey(1), (16, 8)).astype(jnp.bfloat16)
    g = jax.random.normal(jax.random.PRNGKey(2), (9, 8), jnp.float32)

    def plain(a, b):
        return jnp.matmul(a, b, preferred_element_type=jnp.float32)

    ours = jax.vjp(lambda a, b: matmul(a, b, jnp.float32), x, w)[1](g)
    want = jax.vjp(plain, x, w)[1](g)
    for got, ref in zip(ours, want, strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(ref, np.float32))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU lowering")
def test_mixed_precision_gradient_products_compile_to_bfloat16_products():
    """On CPU the compiled backward pass multiplies bfloat16 arrays: XLA converts no operand
    of a product to float32 (it does for JAX's own gradient of the weight, whose transposed
    operand the bfloat16 kernels cannot take)."""
    x = jnp.ones((4, 256, 64), jnp.bfloat16)
    w = jnp.ones((64, 32), jnp.bfloat16)

    def f32_operands() -> int:
        """Matrix products in the compiled program with a float32 operand (a new function
        each call: JAX caches traces by function, and the switch is read when tracing)."""

        def grads(w, x):
            def loss(w, x):
                return jnp.sum(jax.vmap(lambda xi: matmul(xi, w, jnp.float32))(x) ** 2)

            return jax.grad(loss, argnums=(0, 1))(w, x)

        hlo = jax.jit(grads).lower(w, x).compile().as_text()
        types = dict(re.findall(r"%([\w.-]+) = (\w+)\[", hlo))
        dots = re.findall(r" dot\(%([\w.-]+), %([\w.-]+)\)", hlo)
        assert dots, "no matrix product found in the compiled program"
        return sum(types[a] == "f32" or types[b] == "f32" for a, b in dots)

    assert f32_operands() == 0
    _products.REDUCED_PRECISION_GRADIENT = False
    try:
        assert f32_operands() > 0  # the check can fail: JAX's gradient products are
    finally:  # float32 ones
        _products.REDUCED_PRECISION_GRADIENT = True


def test_matmul_rejects_operands_that_are_not_matrices():
    # ValueError from matmul itself; the test session's jaxtyping hook (a TypeError) may
    # reject the shape first.
    with pytest.raises((ValueError, TypeError)):
        matmul(jnp.ones((2, 3, 4)), jnp.ones((4, 5)))


def _custom_vjp_calls(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("custom_vjp_call")


@pytest.mark.parametrize("switch", [True, False])
def test_dense_ssm_and_pendulum_cnn_use_it_and_the_switch_turns_it_off(monkeypatch, switch):
    monkeypatch.setattr(_products, "VMAP_FRIENDLY_GRADIENT", switch)
    key = jax.random.PRNGKey(0)
    dense = Dense(6, 4, key=key)
    ssm = S5SSM(6, 8, J=2, key=key)
    cnn = PendulumCNN(5, key=key)
    u = jnp.ones((10, 6))
    counts = {
        "Dense": _custom_vjp_calls(lambda x: dense(x), u),
        # sequential scan: no custom VJP of the scan's own, only the products'
        "SSM": _custom_vjp_calls(
            lambda x: apply_ssm(*ssm.discretized(), ssm.C_tilde(), ssm.D, x, method="sequential"),
            u,
        ),
        "CNN": _custom_vjp_calls(lambda f: cnn.features(f), jnp.ones((3, 576))),
    }
    # the SSM: one product for B̄u, one for C̃x, and the feed-through D ⊙ u (`scale_columns`)
    expected = {"Dense": 1, "SSM": 3, "CNN": 3} if switch else {"Dense": 0, "SSM": 0, "CNN": 0}
    assert counts == expected


def test_forward_mode_through_a_model_works_with_the_switch_off(plain_products):
    """jax.jvp through Dense → SSM (sequential scan) → Dense equals the directional derivative
    from reverse mode (float64); with the switch on, jvp is refused (a custom VJP)."""
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(0)
        enc = Dense(3, 6, dtype=jnp.float64, key=key)
        ssm = S5SSM(6, 8, J=2, dtype=jnp.float64, key=jax.random.PRNGKey(1))
        dec = Dense(6, 2, dtype=jnp.float64, key=jax.random.PRNGKey(2))

        def f(x):
            h = apply_ssm(*ssm.discretized(), ssm.C_tilde(), ssm.D, enc(x), method="sequential")
            return jnp.sum(dec(h) ** 2)

        x = jax.random.normal(jax.random.PRNGKey(3), (12, 3), jnp.float64)
        v = jax.random.normal(jax.random.PRNGKey(4), (12, 3), jnp.float64)
        _, tangent = jax.jvp(f, (x,), (v,))
        np.testing.assert_allclose(float(tangent), float(jnp.vdot(jax.grad(f)(x), v)), rtol=1e-12)
        _products.VMAP_FRIENDLY_GRADIENT = True  # restored by the fixture
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(f, (x,), (v,))


def small_training_setup(ssm_size: int):
    """A 2-layer bidirectional model, its optimiser and a batch of 4 sequences of 32 steps, as
    the trainer's step takes them: `(cfg, static, optimizer, (params, state, opt_state),
    batch)`. Also used by `tests/test_stored_gradients.py`."""
    cfg = ModelConfig(
        n_layers=2, d_model=16, ssm_size=ssm_size, blocks=1, bidirectional=True,
        activation="half_glu1", pooling="mean", dropout=0.0,
    )  # fmt: skip
    model, state = build_model(cfg, d_input=3, n_outputs=4, key=jax.random.PRNGKey(0))
    optimizer, _ = build_optimizer(OptimConfig(), model, steps_per_epoch=10, epochs=1)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    batch = {
        "x": jax.random.normal(jax.random.PRNGKey(1), (4, 32, 3)),
        "y": jnp.asarray([0, 3, 1, 2]),
        "mask": jnp.ones((4,), bool),
    }
    return cfg, static, optimizer, (params, state, opt_state), batch


def test_the_training_step_sums_weight_gradients_over_the_batch_pairwise(monkeypatch):
    """In the trainer's own step (`make_steps`, the model vmapped over the batch inside the
    gradient) no weight's gradient is a reduce_sum over a (batch, K, N) stack, and the step's
    loss and updated parameters are those of JAX's batching (`BATCH_LEVEL_GRADIENT = False`,
    which does have such sums: the check can fail)."""
    cfg, static, optimizer, (params, state, opt_state), batch = small_training_setup(ssm_size=8)
    key = jax.random.PRNGKey(2)
    weights = {tuple(w.shape) for w in jax.tree_util.tree_leaves(params) if w.ndim == 2}
    assert weights, "the model has no weight matrix"
    results, sums = {}, {}
    for flag in (True, False):
        monkeypatch.setattr(_products, "BATCH_LEVEL_GRADIENT", flag)
        step = make_steps(static, optimizer, cfg.head).train  # traced afresh: the flag is read
        args = jax.tree_util.tree_map(jnp.copy, (params, state, opt_state))  # the step donates
        jaxpr = jax.make_jaxpr(step)(*args, batch, key).jaxpr
        sums[flag] = sum(_batch_sums(jaxpr, (4, *w), 0) for w in weights)
        new_params, _, _, stats = step(*args, batch, key)
        results[flag] = (stats["loss"], new_params)
    assert sums[True] == 0 and sums[False] > 0, sums
    for a, b in zip(
        jax.tree_util.tree_leaves(results[True]), jax.tree_util.tree_leaves(results[False]),
        strict=True,
    ):  # fmt: skip
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_without_the_jax_internals_it_reads_matmul_falls_back_to_per_example_products(
    monkeypatch,
):
    """`_vmapped_here` reads `jax._src` (`_jax_batching`); where that fails (another JAX
    version) the product is the per-example one: the same gradients, JAX's batch sum."""

    def moved():
        raise AttributeError("module 'jax._src.core' has no attribute 'trace_ctx'")

    x = jax.random.normal(jax.random.PRNGKey(0), (4, 16, 32))
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 24))
    want = jax.grad(_loss(matmul))(w, x)
    assert _batch_sums(jax.make_jaxpr(jax.grad(_loss(matmul)))(w, x).jaxpr, (4, 32, 24), 0) == 0
    monkeypatch.setattr(_products, "_jax_batching", moved)
    assert _batch_sums(jax.make_jaxpr(jax.grad(_loss(matmul)))(w, x).jaxpr, (4, 32, 24), 0) == 1
    got = jax.grad(_loss(matmul))(w, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_with_several_devices_the_batch_sum_is_one_reduce_sum(monkeypatch):
    """Pairwise halves would move per-example gradients between the devices a sharded batch
    sits on; with more than one device the batch-level product sums with `reduce_sum` (local
    sums and one all-reduce after partitioning), to the same gradient."""
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 16, 32))
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 24))
    one_device = jax.grad(_loss(matmul))(w, x)
    monkeypatch.setattr(jax, "device_count", lambda *args: 2)
    assert _batch_sums(jax.make_jaxpr(jax.grad(_loss(matmul)))(w, x).jaxpr, (4, 32, 24), 0) == 1
    np.testing.assert_allclose(
        np.asarray(jax.grad(_loss(matmul))(w, x)), np.asarray(one_device), rtol=1e-5, atol=1e-6
    )


@pytest.mark.skipif(not _native.native_available(), reason="the native kernel cannot be built")
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_mixed_precision_weight_gradient_over_the_whole_batch_through_native_transpose(
    monkeypatch, x_dtype
):
    """With the native library (`NATIVE_WEIGHT_GRADIENT`), a vmapped mixed-precision product's
    weight gradient is one product over batch × rows whose left operand is `native_transpose`'s
    copy: the program holds that call (and none with the switch off), and ∂W, ∂x equal the
    per-example products' (float32 accumulation: rtol 1e-5 of Σ|x||g|), with odd sizes. The
    bfloat16 tile of `native_weight_gradient` (next test) is switched off here."""
    monkeypatch.setattr(_products, "NATIVE_BF16_WEIGHT_GRADIENT", False)
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 37, 20)).astype(x_dtype)
    w = jax.random.normal(jax.random.PRNGKey(1), (20, 12), jnp.float32) / 5
    g = jax.random.normal(jax.random.PRNGKey(2), (5, 37, 12), jnp.float32)

    def f(w, x):
        return jax.vmap(lambda xi: matmul(xi, w, jnp.float32, operand_dtype=jnp.bfloat16))(x)

    got, calls = {}, {}
    for flag in (True, False):
        monkeypatch.setattr(_products, "NATIVE_WEIGHT_GRADIENT", flag)
        step = jax.jit(lambda w, x, g: jax.vjp(f, w, x)[1](g))  # traced afresh: flag read
        calls[flag] = step.lower(w, x, g).as_text().count("@s5jax_transpose(")
        got[flag] = step(w, x, g)
    assert calls == {True: 1, False: 0}
    scale = np.einsum("blk,bln->kn", np.abs(_bf16(x)), np.abs(_bf16(g)))
    dw_native, dw_each = (np.asarray(got[f][0], np.float64) for f in (True, False))
    assert got[True][0].dtype == jnp.float32
    assert np.all(np.abs(dw_native - dw_each) <= 1e-5 * scale + 1e-7)
    np.testing.assert_array_equal(np.asarray(got[True][1]), np.asarray(got[False][1]))


@pytest.mark.skipif(not _native.native_available(), reason="the native kernel cannot be built")
@pytest.mark.parametrize("x_dtype", ["float32", "bfloat16"])
def test_scale_columns_gradient_for_d_through_the_native_column_dot(monkeypatch, x_dtype):
    """With `NATIVE_COLUMN_DOT` (one CPU device, the native library), `scale_columns`' ∂d under
    the model's `vmap` is one `native_column_dot` call on x as stored (a bfloat16 x kept
    narrow), and none with the switch off: ∂d within float32 rounding of the float64 sum
    (1e-6 of Σ|x||g|), the value and ∂x bitwise the same either way, and the value the float32
    product of the widened x."""
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 1300, 12)).astype(x_dtype)
    d = jax.random.normal(jax.random.PRNGKey(1), (12,), jnp.float32)
    g = jax.random.normal(jax.random.PRNGKey(2), (5, 1300, 12), jnp.float32)

    def f(d, x):
        return jax.vmap(lambda xi: _products.scale_columns(xi, d))(x)

    got, calls = {}, {}
    for flag in (True, False):
        monkeypatch.setattr(_products, "NATIVE_COLUMN_DOT", flag)
        step = jax.jit(lambda d, x, g: (f(d, x), *jax.vjp(f, d, x)[1](g)))  # traced afresh
        calls[flag] = step.lower(d, x, g).as_text().count("@s5jax_column_dot(")
        got[flag] = step(d, x, g)
    assert calls == {True: 1, False: 0}
    y, dd, dx = got[True]
    assert y.dtype == dd.dtype == jnp.float32 and dx.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x.astype(jnp.float32) * d[None, None]))
    for a, b in ((y, got[False][0]), (dx, got[False][2])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x64, g64 = np.asarray(x, np.float64), np.asarray(g, np.float64)
    want, scale = np.sum(x64 * g64, axis=(0, 1)), np.sum(np.abs(x64 * g64), axis=(0, 1))
    for dd_ in (dd, got[False][1]):
        assert np.all(np.abs(np.asarray(dd_, np.float64) - want) <= 1e-6 * scale)


@pytest.mark.skipif(not _native.native_available(), reason="the native kernel cannot be built")
@pytest.mark.parametrize("nesting", [0, 1])
def test_bfloat16_weight_gradient_through_the_native_tile(monkeypatch, nesting):
    """With `NATIVE_BF16_WEIGHT_GRADIENT`, where the build has the bfloat16 tile and the host
    no AMX (both patched here, so the wiring is checked on every host), a mixed-precision
    product's weight gradient is one `native_weight_gradient` call on the bfloat16 operands,
    per example and under the batch's `vmap` (one call over batch × rows, no transposed copy);
    with the switch off, without the tile or with AMX it is the transposed copy and XLA's
    product. Where this host has the tile, ∂W is the float64 contraction of the bfloat16
    operands to float32 rounding (2e-6 of Σ|x||g|) and ∂x is unchanged."""
    host = {"tile": True, "amx": False}
    real_tile = _native.native_weight_gradient_bfloat16()
    monkeypatch.setattr(_native, "native_weight_gradient_bfloat16", lambda: host["tile"])
    monkeypatch.setattr(_native, "native_host_has_amx", lambda: host["amx"])
    shape = ((5, 37, 20), (37, 20))[1 - nesting]
    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (20, 12), jnp.float32) / 5
    g = jax.random.normal(jax.random.PRNGKey(2), (*shape[:-1], 12), jnp.float32)

    def f(w, x):
        product = lambda xi: matmul(xi, w, jnp.float32, operand_dtype=jnp.bfloat16)  # noqa: E731
        return jax.vmap(product)(x) if nesting else product(x)

    got, calls = {}, {}
    variants = (
        ("native", True, True, False), ("off", False, True, False),
        ("no tile", True, False, False), ("amx", True, True, True),
    )  # fmt: skip
    for name, flag, tile, amx in variants:
        monkeypatch.setattr(_products, "NATIVE_BF16_WEIGHT_GRADIENT", flag)
        host.update(tile=tile, amx=amx)
        step = jax.jit(lambda w, x, g: jax.vjp(f, w, x)[1](g))  # traced afresh: flags read
        text = step.lower(w, x, g).as_text()
        calls[name] = (text.count("@s5jax_weight_gradient("), text.count("@s5jax_transpose("))
        if name in ("native", "off") and (real_tile or name == "off"):
            got[name] = step(w, x, g)
    # Otherwise: the whole batch's transposed copy; per example, XLA's own transpose.
    xla = (0, nesting)
    assert calls == {"native": (1, 0), "off": xla, "no tile": xla, "amx": xla}
    if not real_tile:
        return
    rows = _bf16(x).reshape(-1, 20), _bf16(g).reshape(-1, 12)
    scale = np.abs(rows[0]).T @ np.abs(rows[1])
    dw = np.asarray(got["native"][0], np.float64)
    assert got["native"][0].dtype == jnp.float32
    assert np.all(np.abs(dw - rows[0].T @ rows[1]) <= 2e-6 * scale + 1e-7)
    np.testing.assert_array_equal(np.asarray(got["native"][1]), np.asarray(got["off"][1]))


@pytest.mark.skipif(not _native.native_available(), reason="the native kernel cannot be built")
@pytest.mark.parametrize("nesting", [0, 1, 2])
def test_float32_weight_gradient_through_the_native_kernel(monkeypatch, nesting):
    """With the native library (`NATIVE_FLOAT32_WEIGHT_GRADIENT`, where the build has a vector
    tile: patched here, so the wiring is checked on every host), a float32 product's weight
    gradient is one `native_weight_gradient` call, unbatched, under the batch's `vmap` (one
    call over batch × rows) and under two nested `vmap`s (as the retrieval model's two
    documents); none with the switch off or with a portable build. ∂W and ∂x equal XLA's
    products' to float32 rounding (rtol 1e-5 of Σ|x||g|), odd sizes."""
    vector = {"tile": True}
    monkeypatch.setattr(_native, "native_weight_gradient_vectorised", lambda: vector["tile"])
    shape = ((3, 2, 37, 20), (2, 37, 20), (37, 20))[2 - nesting]
    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (20, 12), jnp.float32) / 5
    g = jax.random.normal(jax.random.PRNGKey(2), (*shape[:-1], 12), jnp.float32)

    def f(w, x):
        product = lambda xi: matmul(xi, w)  # noqa: E731
        for _ in range(nesting):
            product = jax.vmap(product)
        return product(x)

    got, calls = {}, {}
    for name, flag, tile in (("native", True, True), ("off", False, True),
                             ("portable", True, False)):  # fmt: skip
        monkeypatch.setattr(_products, "NATIVE_FLOAT32_WEIGHT_GRADIENT", flag)
        vector["tile"] = tile
        step = jax.jit(lambda w, x, g: jax.vjp(f, w, x)[1](g))  # traced afresh: flags read
        calls[name] = step.lower(w, x, g).as_text().count("@s5jax_weight_gradient(")
        got[name] = step(w, x, g)
    assert calls == {"native": 1, "off": 0, "portable": 0}
    rows = np.asarray(x, np.float64).reshape(-1, 20), np.asarray(g, np.float64).reshape(-1, 12)
    scale = np.abs(rows[0]).T @ np.abs(rows[1])
    for name in ("native", "off"):
        dw = np.asarray(got[name][0], np.float64)
        assert got[name][0].dtype == jnp.float32
        assert np.all(np.abs(dw - rows[0].T @ rows[1]) <= 1e-5 * scale + 1e-7), name
    np.testing.assert_allclose(np.asarray(got["native"][1]), np.asarray(got["off"][1]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
