"""Checkpoints: an Equinox model + optax state round-trip exactly; latest and best are kept."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s5jax.nn import S5SSM
from s5jax.train._checkpoint import Checkpoints, from_saveable, to_saveable


def _state(key):
    model = S5SSM(4, 8, bidirectional=True, key=key)
    opt = optax.adam(1e-3)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    return {"model": model, "opt_state": opt_state, "key": jax.random.PRNGKey(5)}


def _assert_same(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_saveable_round_trip_is_exact(getkey):
    state = _state(getkey())
    _assert_same(from_saveable(state, to_saveable(state)), state)


def test_save_and_restore_latest_and_best(tmp_path, getkey):
    first, second = _state(getkey()), _state(getkey())
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 10, first, {"epoch": 1})
    ckpt.save("best", 10, first, {"epoch": 1, "val": 0.5})
    ckpt.save("latest", 20, second, {"epoch": 2})
    assert ckpt.latest_step("latest") == 20 and ckpt.latest_step("best") == 10
    restored, meta = ckpt.restore("latest", first)
    _assert_same(restored, second)
    assert meta == {"epoch": 2}
    restored, meta = ckpt.restore("best", second)
    _assert_same(restored, first)
    assert meta["val"] == 0.5
    # Only one of each is kept.
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "latest").iterdir()) == ["20"]
    ckpt.close()
    # A new manager on the same folder (a resumed process) sees the same checkpoints.
    again = Checkpoints(tmp_path)
    assert again.latest_step() == 20
    again.close()


def test_mismatched_template_is_a_clear_error(tmp_path, getkey):
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, _state(getkey()), {})
    other = {"model": S5SSM(4, 16, key=getkey())}
    with pytest.raises(ValueError, match="different config"):
        ckpt.restore("latest", other)
    with pytest.raises(FileNotFoundError, match="no 'best' checkpoint"):
        ckpt.restore("best", other)
    ckpt.close()


def test_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="'latest' or 'best'"):
        Checkpoints(tmp_path).latest_step("final")


def test_restored_arrays_are_jax_arrays(tmp_path, getkey):
    ckpt = Checkpoints(tmp_path)
    state = _state(getkey())
    ckpt.save("latest", 1, state, {})
    restored, _ = ckpt.restore("latest", state)
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(restored))
    assert isinstance(restored["model"], S5SSM)
    y = restored["model"](jnp.ones((5, 4)))
    assert y.shape == (5, 4)
    ckpt.close()
