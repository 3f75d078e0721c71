"""The mixed-precision policy (`model.precision = "bf16"`) against float32.

Policy (`S5Model`): parameters stay float32; matrix products take bfloat16 operands and
accumulate in float32; activations and the residual stream are bfloat16 (GELU and the gate's
sigmoid computed in float32 and rounded once); norm statistics, Λ,
Δ, the discretisation and the SSM state stay float32 (complex64 on the scan path, float32
planes on the fused path); the head's final layer, the outputs and the loss are float32.

Tolerance: outputs (log-probabilities, the Gaussian head's means and variances) of a bf16
model are within a relative error ‖bf16 − fp32‖ / ‖fp32‖ ≤ `REL_TOL` = 2e-2 of the same model
(same parameters) in float32, and so are all its parameter gradients taken together
(`GRAD_REL_TOL` = 2e-2). Measured on these models (CPU): outputs 6e-4 (small dense model),
3e-4 (ListOps architecture, L = 256), 6e-3 (pendulum-like mean); gradients 3e-3 with float32
gradient products, 4.3e-3 with the bfloat16 ones `s5jax.core._products.matmul` runs
(`REDUCED_PRECISION_GRADIENT`; 3.4e-3 → 4.3e-3, small dense model, 2026-11-27). With GELU
and the sigmoid computed in float32 and rounded once (2026-11-28, AMD EPYC, the same inputs as
the tests, old code / new): small model in training mode (`auto`) outputs 2.95e-4 / 2.84e-4,
gradients 3.68e-3 / 3.49e-3; ListOps 2.95e-4 / 2.82e-4; pendulum-like mean 5.76e-3 / 5.54e-3.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.config import ConfigError, load_experiment
from s5jax.config._schema import ModelConfig
from s5jax.nn import build_model, nll_loss

REL_TOL = 2e-2
GRAD_REL_TOL = 2e-2

SMALL = ModelConfig(
    n_layers=3, d_model=32, ssm_size=32, blocks=4, bidirectional=True, activation="full_glu",
    pooling="mean", dropout=0.0,
)  # fmt: skip


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _models(cfg, d_input, n_outputs, vocab=None, scan_method=None, key=0):
    out = {}
    for precision in ("fp32", "bf16"):
        c = dataclasses.replace(cfg, precision=precision)
        out[precision] = build_model(
            c, d_input=d_input, n_outputs=n_outputs, vocab=vocab, key=jax.random.PRNGKey(key),
            scan_method=scan_method,
        )  # fmt: skip
    return out


def _apply(model, state, x, *, inference, lengths=None, dt=None):
    def one(xi, li, di):
        return model(xi, state, inference=inference, lengths=li, dt=di)

    axes = (0, None if lengths is None else 0, None if dt is None else 0)
    return jax.vmap(one, in_axes=axes, axis_name="batch", out_axes=(0, None))(x, lengths, dt)


def _loss(params, static, state, x, y, lengths):
    model = eqx.combine(params, static)
    out, _ = _apply(model, state, x, inference=False, lengths=lengths)
    return nll_loss(out, y)


def test_precision_is_validated_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.precision"):
        ModelConfig(precision="fp16")
    bad = dataclasses.replace(SMALL)
    object.__setattr__(bad, "precision", "half")
    with pytest.raises(ValueError, match=r"model\.precision must be one of"):
        build_model(bad, d_input=3, n_outputs=2, key=jax.random.PRNGKey(0))


@pytest.mark.parametrize("scan_method", ["auto", "chunked", "sequential"])
@pytest.mark.parametrize("inference", [True, False])
def test_bf16_outputs_and_gradients_stay_close_to_fp32(scan_method, inference):
    models = _models(SMALL, 5, 10, scan_method=scan_method)
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 128, 5))
    y = jax.random.randint(jax.random.PRNGKey(2), (6,), 0, 10)
    outs, grads = {}, {}
    for precision, (model, state) in models.items():
        out, _ = eqx.filter_jit(_apply)(model, state, x, inference=inference)
        assert out.dtype == jnp.float32
        outs[precision] = out
        params, static = eqx.partition(model, eqx.is_inexact_array)
        grads[precision] = jax.jit(jax.grad(_loss), static_argnums=1)(
            params, static, state, x, y, None
        )
    assert _rel(outs["bf16"], outs["fp32"]) <= REL_TOL
    g16 = jax.tree_util.tree_leaves(grads["bf16"])
    g32 = jax.tree_util.tree_leaves(grads["fp32"])
    for a, b in zip(g16, g32, strict=True):
        assert a.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(a)))
    flat16 = jnp.concatenate([g.ravel() for g in g16])
    flat32 = jnp.concatenate([g.ravel() for g in g32])
    assert _rel(flat16, flat32) <= GRAD_REL_TOL


def test_listops_architecture_in_bf16():
    cfg = load_experiment("listops").model  # 8 layers, H 128, embedding, masked mean, GLU
    models = _models(cfg, 1, 10, vocab=20)
    tokens = jax.random.randint(jax.random.PRNGKey(3), (4, 256), 0, 20)
    lengths = jnp.asarray([256, 200, 64, 131])
    outs = {
        p: eqx.filter_jit(_apply)(m, s, tokens, inference=True, lengths=lengths)[0]
        for p, (m, s) in models.items()
    }
    assert outs["bf16"].dtype == jnp.float32
    assert _rel(outs["bf16"], outs["fp32"]) <= REL_TOL
    params, static = eqx.partition(models["bf16"][0], eqx.is_inexact_array)
    labels = jnp.asarray([0, 3, 9, 1])
    g = jax.jit(jax.grad(_loss), static_argnums=1)(
        params, static, models["bf16"][1], tokens, labels, lengths
    )
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(g))


def test_pendulum_like_regression_in_bf16():
    # Gaussian head (per-step float32 mean and variance), LayerNorm, postnorm, irregular
    # steps (the scan path), unidirectional.
    cfg = ModelConfig(
        n_layers=2, d_model=16, ssm_size=16, blocks=2, norm="layer", prenorm=False,
        activation="half_glu2", head="gaussian", pooling="none", dt_min=0.01,
    )  # fmt: skip
    models = _models(cfg, 6, 3)
    x = jax.random.normal(jax.random.PRNGKey(4), (4, 50, 6))
    t = jnp.cumsum(jax.random.uniform(jax.random.PRNGKey(5), (4, 50), minval=0.5, maxval=2.0), 1)
    dt = jnp.concatenate([jnp.ones((4, 1)), jnp.diff(t, axis=1)], axis=1)
    outs = {
        p: eqx.filter_jit(_apply)(m, s, x, inference=True, dt=dt)[0] for p, (m, s) in models.items()
    }
    for a, b in zip(outs["bf16"], outs["fp32"], strict=True):
        assert a.dtype == jnp.float32
        assert _rel(a, b) <= REL_TOL


def test_parameters_and_state_stay_float32():
    model, state = _models(SMALL, 5, 10)["bf16"]
    for leaf in jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array)):
        assert leaf.dtype == jnp.float32
    for leaf in jax.tree_util.tree_leaves(state):
        assert leaf.dtype == jnp.float32
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 5))
    _, new_state = eqx.filter_jit(_apply)(model, state, x, inference=False)
    for leaf in jax.tree_util.tree_leaves(new_state):
        assert leaf.dtype == jnp.float32


def _eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


@pytest.mark.parametrize("scan_method", ["sequential", "fused"])
def test_bf16_products_accumulate_in_fp32_and_the_state_never_is_bf16(scan_method):
    model, state = _models(SMALL, 5, 10, scan_method=scan_method)["bf16"]
    x = jnp.ones((2, 64, 5))
    jaxpr = jax.make_jaxpr(lambda m, x: _apply(m, state, x, inference=True)[0])(model, x).jaxpr
    eqns = list(_eqns(jaxpr))
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert dots
    bf16 = jnp.dtype(jnp.bfloat16)
    for e in dots:  # every product: bfloat16 operands, float32 result
        assert [v.aval.dtype for v in e.invars] == [bf16, bf16], e
        assert e.outvars[0].aval.dtype == jnp.float32
    loops = [e for e in eqns if e.primitive.name in ("scan", "while")]
    assert loops
    for e in loops:  # the recurrences: complex64 states (scan path) or float32 planes
        for v in e.outvars:
            assert v.aval.dtype in (jnp.complex64, jnp.float32, jnp.int32), v.aval
    if scan_method == "sequential":
        assert any(v.aval.dtype == jnp.complex64 for e in loops for v in e.outvars)


_TRANSCENDENTAL = ("tanh", "logistic", "exp", "erf", "erfc", "log1p", "expm1")


@pytest.mark.parametrize(
    "activation, approximate",
    [("half_glu1", True), ("half_glu2", True), ("full_glu", False), ("gelu", True)],
)
def test_bf16_nonlinearities_run_in_float32_and_round_once(activation, approximate):
    # GELU and the gate's sigmoid: computed in float32 from the float32 SSM output (or the
    # gate product's float32 accumulator) and rounded to bfloat16 once, in the forward pass
    # and in the gradient (XLA's CPU backend does not vectorise them on bfloat16 arrays).
    cfg = dataclasses.replace(SMALL, activation=activation, gelu_approximate=approximate)
    model, state = _models(cfg, 5, 10)["bf16"]
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 5))
    y = jnp.asarray([1, 7])
    params, static = eqx.partition(model, eqx.is_inexact_array)
    jaxpr = jax.make_jaxpr(jax.grad(_loss), static_argnums=1)(
        params, static, state, x, y, None
    ).jaxpr
    found = [e for e in _eqns(jaxpr) if e.primitive.name in _TRANSCENDENTAL]
    wanted = {"tanh" if approximate else "erfc"} | ({"logistic"} if activation != "gelu" else set())
    assert {e.primitive.name for e in found} >= wanted
    for e in found:  # (the discretisation's exp on complex64 Λ among them)
        assert all(v.aval.dtype in (jnp.float32, jnp.complex64) for v in e.invars), e

    layer = model.layers[0]
    u = jax.random.normal(jax.random.PRNGKey(2), (32, 32), jnp.float32) * 3
    out = layer.activate(u, inference=True)
    assert out.dtype == jnp.bfloat16
    g = jax.nn.gelu(u, approximate=approximate).astype(jnp.bfloat16)
    if activation == "gelu":
        expected = g
    else:
        gate = jax.nn.sigmoid(layer.out2(g, fp32_output=True)).astype(jnp.bfloat16)
        value = {"half_glu1": g, "half_glu2": u.astype(jnp.bfloat16)}.get(activation)
        expected = (layer.out1(g) if value is None else value) * gate
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))


def test_fp32_policy_is_the_model_of_before():
    # precision = "fp32" builds the same model, and the same computation, as a config without
    # the field: bit-identical outputs, and no bfloat16 anywhere.
    cfg = SMALL
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    fields.pop("precision")
    legacy = type("LegacyConfig", (), fields)()
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 64, 5))
    outs = []
    for c in (cfg, legacy):
        model, state = build_model(c, d_input=5, n_outputs=10, key=jax.random.PRNGKey(0))
        outs.append(eqx.filter_jit(_apply)(model, state, x, inference=False)[0])
        jaxpr = jax.make_jaxpr(lambda m, x, s=state: _apply(m, s, x, inference=False)[0])(
            model, x
        ).jaxpr
        assert all(
            v.aval.dtype != jnp.bfloat16 for e in _eqns(jaxpr) for v in (*e.invars, *e.outvars)
            if hasattr(v, "aval")
        )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))
