"""The `s5jax` command's JAX compilation cache (s5jax/_cache.py): one folder per CPU type under
the s5jax cache folder, the user's own settings kept, and a second run loading the programs
the first one stored."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from s5jax import _cache

_JAX_VARS = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_COMPILATION_CACHE_MAX_SIZE",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process as the `s5jax` command starts it: JAX not imported, no JAX cache variables."""
    monkeypatch.delitem(sys.modules, "jax")
    for name in (*_JAX_VARS, _cache.ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("S5JAX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_command_sets_jaxs_variables_to_a_folder_per_cpu_type(fresh, monkeypatch):
    folder = _cache.configure_compilation_cache()
    assert folder == _cache.compilation_cache_dir()
    assert folder.parent == fresh / "xla" and not folder.exists()  # JAX creates it when used
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(folder)
    assert int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]) == _cache.MAX_BYTES
    assert float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == 0.1
    # another CPU type (other instructions) gets another folder; the same type the same one
    monkeypatch.setattr(_cache, "cpu_identity", lambda: "model name : other\nflags : sse2")
    assert _cache.compilation_cache_dir() not in (folder, None)
    monkeypatch.undo()
    monkeypatch.setenv("S5JAX_CACHE_DIR", str(fresh))
    assert _cache.compilation_cache_dir() == folder


def test_the_users_settings_and_off_switch_are_kept(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_MAX_SIZE", "123")
    assert _cache.configure_compilation_cache() == tmp_path / "mine"
    assert os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == "123"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv(_cache.ENV_VAR, "0")
    assert _cache.configure_compilation_cache() is None
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ


def test_nothing_is_set_when_jax_runs_already_or_the_folder_cannot_be_written(fresh, monkeypatch):
    import jax  # noqa: F401  (a Python program that imported JAX keeps its own settings)

    assert _cache.configure_compilation_cache() is None
    monkeypatch.delitem(sys.modules, "jax")
    fresh.mkdir()
    fresh.chmod(0o500)
    try:
        if os.access(fresh, os.W_OK):
            pytest.skip("root writes into read-only folders")
        assert _cache.configure_compilation_cache() is None
    finally:
        fresh.chmod(0o700)
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ


def _atimes(folder: Path) -> dict[str, int]:
    """JAX's last-use stamp of each stored program, in ns (jax/_src/lru_cache.py writes it,
    8 bytes little-endian, whenever a process stores or loads the program)."""
    return {p.name: int.from_bytes(p.read_bytes(), "little") for p in folder.glob("*-atime")}


def test_a_second_run_loads_the_programs_the_first_stored(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (*_JAX_VARS, _cache.ENV_VAR)}
    env["S5JAX_CACHE_DIR"] = str(tmp_path / "cache")
    sets = ("train.epochs=1", "data.n_train=16", "data.n_eval=8", "model.n_layers=1")
    results, stamps = [], []
    for run in ("a", "b"):
        argv = ["train", "synthetic", "--workdir", str(tmp_path / run), "--no-progress"]
        argv += [a for s in sets for a in ("--set", s)]
        done = subprocess.run([sys.executable, "-m", "s5jax", *argv], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr
        results.append(json.loads((tmp_path / run / "results.json").read_text()))
        folders = list((tmp_path / "cache" / "xla").iterdir())
        assert len(folders) == 1
        stamps.append(_atimes(folders[0]))
    steps = [name for name in stamps[0] if name.startswith(("jit_train_step", "jit_eval_step"))]
    assert len(steps) == 2
    # every program the first run stored, the training and evaluation steps among them, was
    # loaded by the second (a program that compiles in about MIN_COMPILE_SECONDS may be stored
    # by one run and not the other)
    assert all(stamps[1][name] > stamps[0][name] for name in stamps[0])
    assert results[1]["test_at_best_val"] == results[0]["test_at_best_val"]


_STORE = """
import sys
from s5jax import _cache
if sys.argv[1] == "heal":
    _cache.configure_compilation_cache()
import jax, jax.numpy as jnp
print(jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).sum())
"""


def test_an_entry_a_killed_process_left_unfinished_is_dropped(tmp_path):
    """JAX's own store fails (a warning per program, nothing kept) on a `-cache` entry
    without its `-atime` stamp, as a process killed between the two writes leaves it; the
    command removes such entries before JAX starts, under JAX's lock, and keeps whole ones."""
    folder = tmp_path / "xla"
    folder.mkdir()
    (folder / "jit_whole-1-cache").write_bytes(b"x")
    (folder / "jit_whole-1-atime").write_bytes((5).to_bytes(8, "little"))
    env = {k: v for k, v in os.environ.items() if k not in (*_JAX_VARS, _cache.ENV_VAR)}
    env["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(_cache.MAX_BYTES)  # as the command sets it
    outcomes = {}
    for mode in ("as is", "heal"):
        (folder / "jit_cut-2-cache").write_bytes(b"half an execut")
        done = subprocess.run([sys.executable, "-W", "error", "-c", _STORE, mode], env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        outcomes[mode] = done
    assert outcomes["as is"].returncode != 0
    assert "Error writing persistent compilation cache entry" in outcomes["as is"].stderr
    assert outcomes["heal"].returncode == 0, outcomes["heal"].stderr
    assert not (folder / "jit_cut-2-cache").exists()
    assert (folder / "jit_whole-1-cache").exists()
    stored = {p.name.rsplit("-", 1)[0] for p in folder.glob("jit__lambda-*")}
    assert len(stored) == 1 and len(list(folder.glob("jit__lambda-*"))) == 2  # -cache, -atime


def test_a_held_lock_leaves_the_folder_alone(tmp_path):
    import fcntl

    (tmp_path / "jit_cut-2-cache").write_bytes(b"half")
    with open(tmp_path / ".lockfile", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        assert _cache.drop_unfinished(tmp_path, wait=0.2) == []
    assert _cache.drop_unfinished(tmp_path) == ["jit_cut-2-cache"]
    assert list(tmp_path.iterdir()) == [tmp_path / ".lockfile"]
