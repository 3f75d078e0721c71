"""s5jax._atomic: a replaced file has a normal open()'s mode, and a failed write leaves the old
file and no temporary file."""

import json
import os

import numpy as np
import pytest

from s5jax._atomic import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)

from ._fixtures import read_npz


@pytest.fixture
def umask():
    """Set the process umask for the test body; put the old one back after."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda value: os.umask(value)
    os.umask(old)


def _mode(path):
    return path.stat().st_mode & 0o777


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_get_the_mode_a_plain_open_gives(tmp_path, umask, mask, expected):
    umask(mask)
    with open(tmp_path / "plain", "w") as f:
        f.write("x")
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_write_json(tmp_path / "a.json", {"a": 1})
    with atomic_open(tmp_path / "a.npz") as f:
        np.savez(f, x=np.arange(3))
    assert _mode(tmp_path / "plain") == expected
    for name in ("a.txt", "a.json", "a.npz"):
        assert _mode(tmp_path / name) == expected, name


def test_contents_are_written(tmp_path):
    atomic_write_json(tmp_path / "sub" / "a.json", {"b": [1, 2]}, sort_keys=True)
    assert json.loads((tmp_path / "sub" / "a.json").read_text()) == {"b": [1, 2]}
    with atomic_open(tmp_path / "a.npz") as f:
        np.savez(f, x=np.arange(3))
    np.testing.assert_array_equal(read_npz(tmp_path / "a.npz")["x"], np.arange(3))
    with atomic_path(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"abc")
    assert (tmp_path / "b.bin").read_bytes() == b"abc"


@pytest.mark.parametrize("how", ["open", "path"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, how):
    target = tmp_path / "results.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        if how == "open":
            with atomic_open(target) as f:
                f.write(b"half of the new")
                raise RuntimeError("disk full")
        else:
            with atomic_path(target) as tmp:
                tmp.write_bytes(b"half of the new")
                raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_failed_json_encoding_keeps_the_old_file(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"a": object()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_the_package_writers_use_it(tmp_path, umask):
    """run_info.json/results.json, a dumped config and the pendulum .npz were 0600 before."""
    from s5jax.config import dump_json, load_experiment
    from s5jax.data import atomic_save_npz
    from s5jax.train._run_info import write_json

    umask(0o022)
    write_json(tmp_path / "results.json", {"b": 1, "a": 2})
    dump_json(load_experiment("synthetic"), tmp_path / "config.json")
    atomic_save_npz(tmp_path / "pendulum.npz", compressed=True, x=np.arange(3))
    for name in ("results.json", "config.json", "pendulum.npz"):
        assert _mode(tmp_path / name) == 0o644, name
    assert (tmp_path / "results.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_a_folder_at_the_target_is_named_and_nothing_is_written(tmp_path):
    """A folder where the file should go fails before the write, naming the folder (not the
    temporary file that `os.replace` would have named)."""
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        with atomic_open(tmp_path / "out") as f:
            f.write(b"x")
    assert info.value.filename == str(tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert list((tmp_path / "out").iterdir()) == []
