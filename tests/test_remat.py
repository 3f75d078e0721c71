"""Rematerialisation (`model.remat`): the same losses, gradients and BatchNorm state as without
it, and a smaller compiled training step."""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.config import ConfigError, ModelConfig, from_dict, load_experiment, to_dict
from s5jax.nn import S5Model, build_model

KEY = jax.random.PRNGKey(0)


def _config(remat, **kw):
    options = dict(
        n_layers=2, d_model=8, ssm_size=8, blocks=2, bidirectional=True, dropout=0.25,
        norm="batch", activation="half_glu1", remat=remat,
    )  # fmt: skip
    return ModelConfig(**(options | kw))


def _grad_step(remat, scan_method=None, **kw):
    """A jitted `(params, state, x, y, key) -> ((loss, new_state), grads)` and its inputs (a
    new jitted function each call: module switches are read when it is traced)."""
    model, state = build_model(_config(remat, **kw), d_input=3, n_outputs=4,
                               key=jax.random.PRNGKey(0), scan_method=scan_method)  # fmt: skip
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss_fn(params, state, x, y, key):
        m = eqx.combine(params, static)
        keys = jax.random.split(key, x.shape[0])
        out, state = jax.vmap(
            lambda xi, k: m(xi, state, key=k), axis_name="batch", out_axes=(0, None)
        )(x, keys)
        return -jnp.mean(jnp.take_along_axis(out, y[:, None], axis=1)), state

    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True)), params, state


def test_remat_keeps_loss_gradients_and_batchnorm_state(getkey):
    x = jax.random.normal(getkey(), (3, 16, 3))
    y = jnp.asarray([0, 3, 1])
    key, other_key = getkey(), getkey()
    leaves = jax.tree_util.tree_leaves
    step, params, state = _grad_step("none")
    (loss0, state0), grads0 = step(params, state, x, y, key)

    # Dropout is live (another key changes the loss) and BatchNorm updated its statistics.
    (other, _), _ = step(params, state, x, y, other_key)
    assert float(other) != float(loss0)
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(state0), leaves(state), strict=True))

    for remat in ("layers", "ssm"):
        step, params, state = _grad_step(remat)
        (loss1, state1), grads1 = step(params, state, x, y, key)
        np.testing.assert_allclose(float(loss1), float(loss0), rtol=1e-6)
        for a, b in zip(leaves((grads1, state1)), leaves((grads0, state0)), strict=True):
            scale = float(jnp.max(jnp.abs(b))) or 1.0
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6 * scale)


def test_remat_is_validated_and_dumped():
    with pytest.raises(ConfigError, match=r"model\.remat = 'all'.*'none', 'layers', 'ssm'"):
        ModelConfig(remat="all")
    cfg = load_experiment("pathx", overrides=["model.remat=layers"])
    assert cfg.model.remat == "layers" and to_dict(cfg)["model"]["remat"] == "layers"
    assert from_dict(to_dict(cfg)) == cfg
    assert load_experiment("pathx").model.remat == "none"
    # `s5jax.nn` takes any object with the config's fields; without `remat` it means "none".
    fields = to_dict(_config("ssm"))
    with pytest.raises(ValueError, match=r"model\.remat"):
        S5Model(SimpleNamespace(**(fields | {"remat": "all"})), d_input=1, n_outputs=2, key=KEY)
    del fields["remat"]
    assert S5Model(SimpleNamespace(**fields), d_input=1, n_outputs=2, key=KEY).remat == "none"


# The memory is measured in a fresh process with XLA's CPU scheduler option
# `xla_cpu_enable_concurrency_optimized_scheduler` off: on (the default), it schedules the
# recomputation next to the forward pass and so cancels the saving. XLA reads it once, from
# XLA_FLAGS, when the backend starts. (Per-compile `compiler_options` do not reach it.)
_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json
    import equinox as eqx, jax, jax.numpy as jnp
    from s5jax.config import ModelConfig
    from s5jax.nn import build_model
    from s5jax.train._steps import per_example_loss

    x, y = jnp.zeros((1, 2048, 3)), jnp.zeros((1,), jnp.int32)
    out = {}
    for remat in ("none", "layers", "ssm"):
        cfg = ModelConfig(n_layers=4, d_model=16, ssm_size=16, blocks=2, bidirectional=True,
                          dropout=0.1, remat=remat)
        # The scan path: CPU's default fused SSM path keeps only its input already.
        model, state = build_model(cfg, d_input=3, n_outputs=4, key=jax.random.PRNGKey(0),
                                   scan_method="sequential")
        params, static = eqx.partition(model, eqx.is_inexact_array)

        def loss(params, state, x, y, key):
            m = eqx.combine(params, static)
            keys = jax.random.split(key, x.shape[0])
            o, state = jax.vmap(lambda xi, k: m(xi, state, key=k), axis_name="batch",
                                out_axes=(0, None))(x, keys)
            nll = jax.vmap(lambda a, b: per_example_loss("classification", a, b)[0])(o, y)
            return jnp.mean(nll), state

        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        stats = step.lower(params, state, x, y, jax.random.PRNGKey(1)).compile().memory_analysis()
        out[remat] = {k: getattr(stats, k, None) for k in
                      ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")}
    print(json.dumps(out))
    """
)


def test_remat_shrinks_the_compiled_gradient_step():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    )
    run = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    temp = {k: v["temp_size_in_bytes"] for k, v in stats.items()}
    if not temp["none"]:
        pytest.skip(f"this JAX reports no temp_size_in_bytes: {stats}")
    # Same arguments (parameters, state, batch) and outputs; fewer saved activations.
    for k in ("argument_size_in_bytes", "output_size_in_bytes"):
        assert stats["layers"][k] == stats["ssm"][k] == stats["none"][k]
    assert temp["layers"] < 0.75 * temp["none"], temp  # measured: 0.48 (4 layers)
    assert temp["ssm"] < 0.9 * temp["none"], temp  # measured: 0.74


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_remat_sets_the_cpu_scheduler_flag_before_jax_starts(tmp_path, command):
    """`s5jax train` (and a sweep whose trials all use remat) with model.remat adds the
    scheduler flag itself, while XLA can still read it (the backend starts later): no
    warning asks the user to set it."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    sets = [
        "model.remat=layers", "train.epochs=1", "data.n_train=16", "data.n_eval=8",
        "data.seq_len=16", "model.d_model=8", "model.ssm_size=4", "model.n_layers=1",
    ]  # fmt: skip
    argv = ["-v", command, "synthetic", "--workdir", str(tmp_path / "run"), "--no-progress"]
    if command == "sweep":
        sets.append("optim.ssm_lr=0.001,0.002")
    code = (
        "import os, sys; from s5jax.cli import main; code = main(sys.argv[1:]); "
        "print('XLA_FLAGS=' + os.environ.get('XLA_FLAGS', '')); sys.exit(code)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *argv, *(a for s in sets for a in ("--set", s))],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    assert f"XLA_FLAGS={flag}" in run.stdout
    assert f"model.remat = 'layers': added {flag} to XLA_FLAGS" in run.stderr
    assert "saves little memory" not in run.stderr  # the trainer's too-late warning
