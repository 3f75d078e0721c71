"""`model.mask_padding`: outputs at valid steps do not depend on the padding.

Two views that must agree: the same examples padded to two lengths with different padding
content give the same outputs at the valid steps, loss, gradients and BatchNorm statistics in
training mode; in inference mode, a padded example gives what the example cut to its length
gives. Without the mask a bidirectional model's outputs move with the padding (the authors'
semantics, kept for the paper's runs), which shows the checks can fail.
"""

import dataclasses
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import load_experiment
from s5jax.nn import BatchNorm, build_model, pool
from s5jax.train import export_run
from s5jax.train._defaults import DataFacts, choose_defaults

from ._fixtures import read_npz
from .test_per_step_labels import L as STEPS
from .test_per_step_labels import labelled, valid_steps
from .test_predict import make_run

LENGTHS = np.array([5, 9, 7])


def _cfg(**changes):
    base = dict(n_layers=2, d_model=8, ssm_size=8, blocks=2, bidirectional=True, norm="batch",
                pooling="masked_mean", mask_padding=True, dropout=0.0)  # fmt: skip
    return dataclasses.replace(load_experiment("synthetic").model, **{**base, **changes})


def _padded(x, L, fill):
    """x (B, 9, D) with its padding (beyond LENGTHS) replaced by `fill` and extended to L."""
    out = np.array(np.broadcast_to(fill, (x.shape[0], L, x.shape[2])))
    for i, n in enumerate(LENGTHS):
        out[i, :n] = x[i, :n]
    return jnp.asarray(out)


def _train_call(model, state, x, y, lengths):
    """Loss, its gradients, the outputs and the new state of one training-mode batch."""

    def loss(params):
        m = eqx.combine(params, static)
        out, new = jax.vmap(
            lambda xi, n: m(xi, state, inference=False, lengths=n),
            axis_name="batch", out_axes=(0, None),
        )(x, lengths)  # fmt: skip
        if out.ndim == 3:  # per step: the valid steps' log-probabilities
            valid = jnp.arange(9)[None, :] < lengths[:, None]
            picked = jnp.take_along_axis(out[:, :9], y[..., None], -1)[..., 0]
            return -jnp.sum(jnp.where(valid, picked, 0.0)), (out, new)
        return -jnp.sum(jnp.take_along_axis(out, y[:, None], -1)), (out, new)

    params, static = eqx.partition(model, eqx.is_inexact_array)
    (value, (out, new)), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, grads, out, new


@pytest.mark.parametrize(
    "changes", [{}, {"prenorm": False, "pooling": "none"}], ids=["prenorm", "postnorm-per-step"]
)
def test_training_ignores_the_padding(changes, getkey, x64):
    _check_training(changes, getkey(), jnp.float64, "sequential", dict(rtol=1e-9, atol=1e-11))


def test_training_ignores_the_padding_on_the_default_scan(getkey):
    # float32 on "auto": the native C++ scan where it builds (each CPU run's default)
    _check_training({}, getkey(), jnp.float32, "auto", dict(rtol=1e-4, atol=1e-5))


def _check_training(changes, key, dtype, scan, tol):
    call = eqx.filter_jit(lambda *args: _train_call(*args))  # a cache of its own (x64 or not)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 9, 3))
    per_step = changes.get("pooling") == "none"
    y = jnp.asarray(rng.integers(0, 2, (3, 9) if per_step else 3))
    results = {}
    for mask in (True, False):
        model, state = build_model(_cfg(mask_padding=mask, **changes), d_input=3, n_outputs=2,
                                   key=key, scan_method=scan, dtype=dtype)  # fmt: skip
        for L, fill in ((9, 0.0), (14, 3.0 * rng.standard_normal((3, 14, 3)))):
            xp = _padded(x, L, fill).astype(dtype)
            results[mask, L] = call(model, state, xp, y, jnp.asarray(LENGTHS))
    valid = np.arange(9)[None, :] < LENGTHS[:, None]

    def outputs(mask, L):  # the outputs at the valid steps
        out = np.asarray(results[mask, L][2])
        return out[:, :9][valid] if per_step else out

    (v9, g9, _, s9), (v14, g14, _, s14) = results[True, 9], results[True, 14]
    np.testing.assert_allclose(v14, v9, **tol)
    np.testing.assert_allclose(outputs(True, 14), outputs(True, 9), **tol)
    for a, b in zip(jax.tree.leaves(g14), jax.tree.leaves(g9), strict=True):
        np.testing.assert_allclose(a, b, **tol)
    for a, b in zip(jax.tree.leaves(s14), jax.tree.leaves(s9), strict=True):
        np.testing.assert_allclose(a, b, **tol)  # BatchNorm's running statistics
    # without the mask, the padding reaches the valid steps (backward scan, BatchNorm)
    assert np.max(np.abs(outputs(False, 14) - outputs(False, 9))) > 100 * tol["atol"]


def test_inference_equals_each_example_cut_to_its_length(getkey, x64):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9, 3))
    for mask, same in ((True, True), (False, False)):
        cfg = _cfg(mask_padding=mask, n_layers=1)
        model, state = build_model(cfg, d_input=3, n_outputs=2, key=getkey(),
                                   scan_method="sequential", dtype=jnp.float64)  # fmt: skip
        xp = _padded(x, 12, rng.standard_normal((3, 12, 3)))
        for i, n in list(enumerate(LENGTHS))[:2]:
            padded, _ = model(xp[i], state, inference=True, lengths=jnp.asarray(n))
            cut, _ = model(jnp.asarray(x[i, :n]), state, inference=True, lengths=jnp.asarray(n))
            assert np.allclose(padded, cut, rtol=1e-10, atol=1e-12) == same


def test_batchnorm_counts_only_valid_steps(getkey, x64):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 9, 4)) * 2 + 1
    valid = np.arange(9)[None, :] < LENGTHS[:, None]
    x[~valid] = 100.0  # padding far from the data: counted, it would move both statistics
    norm, state = eqx.nn.make_with_state(BatchNorm)(4, momentum=0.9, dtype=jnp.float64)
    y, new = jax.vmap(
        lambda xi, v: norm(xi, state, valid=v), axis_name="batch", out_axes=(0, None)
    )(jnp.asarray(x), jnp.asarray(valid))  # fmt: skip
    mean, var = x[valid].mean(0), x[valid].var(0)
    np.testing.assert_allclose(np.asarray(y)[valid], ((x - mean) / np.sqrt(var + 1e-5))[valid],
                               rtol=1e-10)  # fmt: skip
    running_mean, running_var = new.get(norm.state_index)
    np.testing.assert_allclose(running_mean, 0.1 * mean, rtol=1e-10)
    np.testing.assert_allclose(running_var, 0.9 + 0.1 * var, rtol=1e-10)


def test_retrieval_documents_ignore_their_padding(getkey):
    cfg = dataclasses.replace(load_experiment("retrieval").model, n_layers=1, d_model=8,
                              ssm_size=8, blocks=2, mask_padding=True)  # fmt: skip
    model, state = build_model(cfg, d_input=1, n_outputs=2, vocab=13, key=getkey())
    tokens = jax.random.randint(getkey(), (2, 16), 1, 13)
    lengths = jnp.asarray([7, 4])
    short, _ = model(tokens[:, :8], state, inference=True, lengths=lengths)
    long_, _ = model(tokens, state, inference=True, lengths=lengths)
    np.testing.assert_allclose(long_, short, rtol=1e-5, atol=1e-6)

    # each document masked by its own length: the pair = the two documents run alone
    def document(x, n):
        h, _ = model.stack(model.encoder(x), state, key=None, inference=True, step_rescale=1.0,
                           lengths=n)  # fmt: skip
        return pool(h, "masked_mean", n)

    alone = model.head(document(tokens[0], lengths[0]), document(tokens[1], lengths[1]))
    np.testing.assert_allclose(long_, alone, rtol=1e-5, atol=1e-6)


def _facts(**changes):
    base = dict(task="classification", per_step=False, tokens=False, n_train=400, seq_len=60,
                max_length=60, min_length=20, padded_fraction=0.3, channels=2, spread=1.4,
                n_val=100, lengths=True)  # fmt: skip
    return DataFacts(**{**base, **changes})


@pytest.mark.parametrize(
    "changes, user, chosen",
    [({}, {}, True), ({"lengths": False, "padded_fraction": 0.0, "min_length": 60}, {}, False),
     ({"per_step": True}, {}, False), ({"per_step": True}, {"model.causal": False}, True),
     ({}, {"model.mask_padding": False}, False),
     ({}, {"model.bidirectional": False, "model.norm": "layer"}, False),
     ({}, {"model.bidirectional": False}, True)],
    ids=["padded", "unpadded", "per-step-causal", "per-step-whole", "user-off",
         "one-way-layernorm", "one-way-batchnorm"],
)  # fmt: skip
def test_own_data_defaults_mask_the_padding_of_whole_sequence_models(changes, user, chosen):
    keys = {c.key: c.value for c in choose_defaults(_facts(**changes), user)}
    assert keys.get("model.mask_padding", False) is chosen


def test_predict_and_export_give_the_same_log_probs_however_far_a_file_is_padded(
    tmp_path, capsys, user_facing
):
    # (`user_facing`: the test-time jaxtyping checks reject the export's symbolic length.)
    # A per-step classifier that reads whole sequences: the padding would reach every step.
    rng = np.random.default_rng(3)
    arrays = labelled(rng)
    run_dir, _ = make_run(tmp_path, arrays, "model.bidirectional=true", "model.norm=batch")
    assert json.loads((run_dir / "config.json").read_text())["model"]["mask_padding"] is True
    x, n = np.nan_to_num(arrays["x_test"]), arrays["lengths_test"]
    valid = valid_steps(arrays, "test")
    preds, files = [], []
    for extra, fill in ((0, 0.0), (6, np.nan)):
        padded = np.concatenate([x, np.zeros((len(x), extra, 2), np.float32)], axis=1)
        padded[np.arange(padded.shape[1])[None, :] >= n[:, None]] = fill
        files.append(np.nan_to_num(padded))
        np.savez(tmp_path / f"pad{extra}.npz", x=padded, lengths=n)
        out = tmp_path / f"pred{extra}.npz"
        assert main(["predict", str(run_dir), "--data", str(tmp_path / f"pad{extra}.npz"),
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
        capsys.readouterr()
        preds.append(read_npz(out)["log_probs"][:, :STEPS])
    np.testing.assert_allclose(preds[1][valid], preds[0][valid], rtol=1e-5, atol=1e-6)
    # the exported forward takes the lengths, and gives the same on the longer padding
    folder = export_run(run_dir, tmp_path / "exp")
    spec = json.loads((folder / "spec.json").read_text())
    names = [i["name"] for i in spec["forward"]["inputs"]]
    assert names == ["x", "lengths", "dt"]
    forward = jax.export.deserialize(bytearray((folder / "forward.jax").read_bytes()))
    xp = files[1]
    got = np.asarray(forward.call(xp, n.astype(np.int32), np.ones(xp.shape[:2], np.float32)))
    np.testing.assert_allclose(got[:, :STEPS][valid], preds[0][valid], rtol=1e-5, atol=1e-5)
