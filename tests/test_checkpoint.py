"""Checkpoints: an Equinox model + optax state round-trip exactly; latest and best are kept."""

import json
import shutil
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from s5jax.nn import S5SSM
from s5jax.train._checkpoint import CheckpointError, Checkpoints, from_saveable, to_saveable


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
    # Two of each are kept: the previous one stays until a newer one is complete.
    ckpt.save("latest", 30, first, {"epoch": 3})
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "latest").iterdir())
    assert kept == ["20", "30"]
    ckpt.close()
    # A new manager on the same folder (a resumed process) sees the same checkpoints.
    again = Checkpoints(tmp_path)
    assert again.latest_step() == 30
    again.close()


def test_mismatched_template_is_a_clear_error(tmp_path, getkey):
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, _state(getkey()), {})
    other = {"model": S5SSM(4, 16, key=getkey())}
    with pytest.raises(CheckpointError, match="different model or config"):
        ckpt.restore("latest", other)
    with pytest.raises(FileNotFoundError, match=r"no 'best' checkpoint .*--checkpoint latest"):
        ckpt.restore("best", other)
    ckpt.close()


def test_a_run_without_any_checkpoint_says_it_stopped_before_the_first(tmp_path, getkey):
    ckpt = Checkpoints(tmp_path)
    template = _state(getkey())
    for which in ("best", "latest"):
        with pytest.raises(FileNotFoundError, match=rf"no '{which}' checkpoint .*nor any other: "
                           "the run stopped before its first checkpoint"):  # fmt: skip
            ckpt.restore(which, template)
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


class _ReIm(eqx.Module):
    Lambda_re: jax.Array
    Lambda_im: jax.Array


class _ImRe(eqx.Module):  # the same fields declared in the other order
    Lambda_im: jax.Array
    Lambda_re: jax.Array


def test_same_shaped_leaves_that_change_places_are_restored_by_name(tmp_path):
    saved = _ReIm(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))
    template = _ImRe(jnp.zeros(2), jnp.zeros(2))
    # Flattened in order, the two arrays swap; by name they stay with their field.
    assert [float(x[0]) for x in jax.tree_util.tree_leaves(saved)] == [1.0, 3.0]
    assert [float(x[0]) for x in jax.tree_util.tree_leaves(template)] == [0.0, 0.0]
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, saved, {})
    restored, _ = ckpt.restore("latest", template)
    ckpt.close()
    np.testing.assert_array_equal(restored.Lambda_re, [1.0, 2.0])
    np.testing.assert_array_equal(restored.Lambda_im, [3.0, 4.0])


def test_a_shape_or_dtype_mismatch_names_the_leaf_and_both_sides(getkey):
    state = _state(getkey())
    saved = to_saveable(state)
    name = "['model'].Lambda_re"
    assert name in saved
    wrong_shape = {**saved, name: np.zeros(3, np.float32)}
    with pytest.raises(CheckpointError) as info:
        from_saveable(state, wrong_shape)
    message = str(info.value)
    assert name in message and "(3,) float32" in message and "(4,) float32" in message
    assert "config.json" in message
    wrong_dtype = {**saved, name: saved[name].astype(np.float16)}
    with pytest.raises(CheckpointError, match=r"saved as \(4,\) float16 but .* \(4,\) float32"):
        from_saveable(state, wrong_dtype)
    missing = {k: v for k, v in saved.items() if k != name}
    with pytest.raises(CheckpointError, match=r"has no array \['model'\]\.Lambda_re"):
        from_saveable(state, missing)
    extra = {**saved, "['model'].D_extra": np.zeros(4, np.float32)}
    with pytest.raises(CheckpointError, match=r"holds \['model'\]\.D_extra, which this model"):
        from_saveable(state, extra)


def _damage(step_dir):
    """Flip bytes in the middle of every array data file of a saved step."""
    for path in (step_dir / "state").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))


def test_a_damaged_latest_falls_back_to_the_previous_one_with_a_warning(
    tmp_path, getkey, caplog, capfd
):
    first, second = _state(getkey()), _state(getkey())
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, first, {"epoch": 1})
    ckpt.save("latest", 2, second, {"epoch": 2})
    _damage(tmp_path / "checkpoints" / "latest" / "2")
    with caplog.at_level("WARNING", logger="s5jax"):
        restored, meta = ckpt.restore("latest", first)
    ckpt.close()
    _assert_same(restored, first)
    assert meta == {"epoch": 1}
    (record,) = [r for r in caplog.records if r.name == "s5jax"]
    assert record.levelname == "WARNING"
    assert "latest/2" in record.getMessage() and "damaged" in record.getMessage()
    assert "older latest checkpoint of step 1" in record.getMessage()
    assert "Event loop is closed" not in capfd.readouterr().err


def test_an_interrupted_save_is_skipped(tmp_path, getkey, caplog):
    first, second = _state(getkey()), _state(getkey())
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, first, {"epoch": 1})
    ckpt.save("latest", 2, second, {"epoch": 2})
    # Killed after orbax finished step 2 but before its manifest was written.
    (tmp_path / "checkpoints" / "latest" / "2" / "s5jax.json").unlink()
    with caplog.at_level("WARNING", logger="s5jax"):
        restored, _ = ckpt.restore("latest", first)
    ckpt.close()
    _assert_same(restored, first)
    assert "interrupted save" in caplog.text


def test_a_manifest_that_lists_other_arrays_than_orbax_holds_is_skipped(tmp_path, getkey, caplog):
    # Its files are intact (the sums match), but the manifest does not describe this state:
    # one leaf added to its list, as a manifest copied from another save would be.
    first, second = _state(getkey()), _state(getkey())
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, first, {"epoch": 1})
    ckpt.save("latest", 2, second, {"epoch": 2})
    path = tmp_path / "checkpoints" / "latest" / "2" / "s5jax.json"
    manifest = json.loads(path.read_text())
    manifest["leaves"].append({"name": "['extra']", "shape": [1], "dtype": "float32"})
    path.write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="s5jax"):
        restored, meta = ckpt.restore("latest", first)
    ckpt.close()
    _assert_same(restored, first)
    assert meta == {"epoch": 1}
    assert "latest/2 holds other arrays than its s5jax.json lists" in caplog.text


def test_when_every_checkpoint_is_damaged_one_error_names_the_folder_and_best(
    tmp_path, getkey, capfd
):
    state = _state(getkey())
    ckpt = Checkpoints(tmp_path)
    for step in (1, 2):
        ckpt.save("latest", step, state, {})
        _damage(tmp_path / "checkpoints" / "latest" / str(step))
    with pytest.raises(CheckpointError) as info:
        ckpt.restore("latest", state)
    ckpt.close()
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "checkpoints" / "latest") in message
    assert "--checkpoint best" in message
    assert "Event loop is closed" not in capfd.readouterr().err


def test_an_unknown_format_is_a_clear_error(tmp_path, getkey):
    state = _state(getkey())
    ckpt = Checkpoints(tmp_path)
    ckpt.save("latest", 1, state, {})
    manifest = tmp_path / "checkpoints" / "latest" / "1" / "s5jax.json"
    data = json.loads(manifest.read_text())
    assert data["format"] == 2
    manifest.write_text(json.dumps({**data, "format": 1}))
    with pytest.raises(CheckpointError, match="format 1, this s5jax reads format 2"):
        ckpt.restore("latest", state)
    ckpt.close()


FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v2"


def test_the_committed_format_2_fixture_restores_to_its_values(tmp_path):
    """tests/fixtures/checkpoint_v2 was written by scripts/make_checkpoint_fixture.py; if this
    fails, the checkpoint format changed: bump FORMAT and say so in the changelog."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    try:
        import make_checkpoint_fixture as fixture
    finally:
        sys.path.pop(0)
    template = jax.tree_util.tree_map(jnp.zeros_like, fixture.tree())
    shutil.copytree(FIXTURE, tmp_path / "run")  # the manager creates folders; keep tests/ clean
    ckpt = Checkpoints(tmp_path / "run")
    restored, meta = ckpt.restore("latest", template)
    ckpt.close()
    _assert_same(restored, fixture.tree())
    assert meta == fixture.META


def test_a_step_whose_save_was_cut_short_is_saved_again(tmp_path):
    """A kill between orbax's save and the manifest leaves a step without s5jax.json: restore
    falls back to the step before, and when training reaches the step again its save replaces
    the cut one (orbax alone refuses: "Checkpoint for step 16 already exists"; found by
    scripts/fault_soak.py)."""
    import jax.numpy as jnp

    from s5jax.train._checkpoint import Checkpoints

    ckpt = Checkpoints(tmp_path)
    template = {"a": jnp.zeros(3)}
    try:
        ckpt.save("latest", 8, {"a": jnp.ones(3)}, {"epoch": 1})
        ckpt.save("latest", 16, {"a": 2 * jnp.ones(3)}, {"epoch": 2})
        (tmp_path / "checkpoints" / "latest" / "16" / "s5jax.json").unlink()
        tree, meta = ckpt.restore("latest", template)
        assert meta == {"epoch": 1} and float(tree["a"][0]) == 1.0
        ckpt.save("latest", 16, {"a": 3 * jnp.ones(3)}, {"epoch": 2})
        tree, meta = ckpt.restore("latest", template)
        assert meta == {"epoch": 2} and float(tree["a"][0]) == 3.0
    finally:
        ckpt.close()
