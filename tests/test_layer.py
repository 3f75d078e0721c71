"""The S5SSM Equinox module: parameters, batching, parameter roles and its errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.nn import S5SSM, param_field, parameter_roles


def test_parameters_are_real_with_the_spec_shapes(getkey):
    layer = S5SSM(6, 16, J=2, bidirectional=True, key=getkey())
    shapes = {
        n: getattr(layer, n).shape
        for n in ("Lambda_re", "Lambda_im", "B_re", "B_im", "C_re", "C_im", "D", "log_step")
    }
    assert shapes == {
        "Lambda_re": (8,),
        "Lambda_im": (8,),
        "B_re": (8, 6),
        "B_im": (8, 6),
        "C_re": (6, 16),
        "C_im": (6, 16),
        "D": (6,),
        "log_step": (8,),
    }
    for leaf in jax.tree_util.tree_leaves(layer):
        assert not jnp.iscomplexobj(leaf)
    assert layer.P == 8
    assert S5SSM(6, 16, conj_sym=False, key=getkey()).P == 16
    assert S5SSM(6, 16, scalar_dt=True, key=getkey()).log_step.shape == (1,)


def test_roles_tag_every_parameter(getkey):
    layer = S5SSM(4, 8, key=getkey())
    roles = parameter_roles(layer)
    assert roles.Lambda_re == roles.Lambda_im == "Lambda"
    assert roles.B_re == roles.B_im == "B"
    assert roles.C_re == roles.C_im == "C"
    assert (roles.D, roles.log_step) == ("D", "log_step")

    class Wrapper(eqx.Module):
        ssm: S5SSM
        dense: eqx.nn.Linear

    wrapped = Wrapper(layer, eqx.nn.Linear(4, 4, key=getkey()))
    roles = parameter_roles(wrapped)
    assert roles.ssm.B_re == "B" and roles.dense.weight == "regular"
    assert jax.tree_util.tree_structure(roles) == jax.tree_util.tree_structure(
        eqx.filter(wrapped, eqx.is_inexact_array)
    )

    class Tagged(eqx.Module):  # tags around modules: the innermost tag on a path wins
        ssm: S5SSM = param_field("C")
        dense: eqx.nn.Linear = param_field("D")

    roles = parameter_roles(Tagged(layer, eqx.nn.Linear(4, 4, key=getkey())))
    assert roles.ssm.B_re == "B" and roles.ssm.Lambda_im == "Lambda" and roles.ssm.D == "D"
    assert roles.dense.weight == roles.dense.bias == "D"  # untagged inside: the outer tag


def test_vmap_over_a_batch_equals_a_loop(getkey):
    layer = S5SSM(4, 8, bidirectional=True, key=getkey())
    u = jax.random.normal(getkey(), (3, 20, 4))
    batched = jax.vmap(layer)(u)
    for i in range(3):  # equal up to float32 rounding (summation order) at the output's scale
        alone = np.asarray(layer(u[i]))
        scale = float(np.max(np.abs(alone)))
        np.testing.assert_allclose(np.asarray(batched[i]), alone, rtol=1e-6, atol=1e-6 * scale)


def test_gradients_reach_every_parameter(getkey):
    layer = S5SSM(4, 8, bidirectional=True, key=getkey())
    u = jax.random.normal(getkey(), (30, 4))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(u) ** 2))(layer)
    for name in ("Lambda_re", "Lambda_im", "B_re", "B_im", "C_re", "C_im", "D", "log_step"):
        g = getattr(grads, name)
        assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0, name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(J=3), "J=3 blocks must divide"),
        (dict(J=8), "even block size"),
        (dict(dt_min=0.0), "dt_min must be positive"),
        (dict(dt_min=0.5, dt_max=0.1), "dt_min must be ≤ dt_max"),
        (dict(discretization="euler"), "discretization must be one of"),
        (dict(c_init="xavier"), "C init must be one of"),
        (dict(scan_method="fast"), "scan method must be"),
    ],
)
def test_bad_options_raise_naming_the_option(getkey, kwargs, match):
    with pytest.raises(ValueError, match=match):
        S5SSM(4, 8, key=getkey(), **kwargs)


def test_bad_call_arguments_raise_at_trace_time(user_facing, getkey):
    layer = S5SSM(4, 8, bidirectional=True, key=getkey())
    call = eqx.filter_jit(lambda m, u, **kw: m(u, **kw))
    with pytest.raises(ValueError, match="u must have shape"):
        call(layer, jnp.ones((2, 10, 4)))
    with pytest.raises(ValueError, match="dt must have shape"):
        call(layer, jnp.ones((10, 4)), dt=jnp.ones(9))
    with pytest.raises(ValueError, match="resets must have shape"):
        call(layer, jnp.ones((10, 4)), resets=jnp.zeros(3, bool))
    with pytest.raises(ValueError, match="initial_state is only defined"):
        call(layer, jnp.ones((10, 4)), initial_state=jnp.zeros(4, jnp.complex64))
    with pytest.raises(ValueError, match="step\\(\\) needs a unidirectional"):
        layer.step(layer.init_state(), jnp.ones(4))


def test_integer_input_is_rejected_by_the_core(user_facing):
    from s5jax import core

    with pytest.raises(ValueError, match="u must be a real floating array"):
        core.apply_ssm(
            jnp.ones(2, jnp.complex64),
            jnp.ones((2, 3), jnp.complex64),
            jnp.ones((3, 2), jnp.complex64),
            jnp.ones(3),
            jnp.ones((5, 3), jnp.int32),
        )
