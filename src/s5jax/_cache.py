"""Where s5jax keeps what it builds once per host, and JAX's compilation cache for the command.

Two caches live under one folder, `$S5JAX_CACHE_DIR` (default `$XDG_CACHE_HOME/s5jax`, i.e.
`~/.cache/s5jax`): the native scan kernel's builds (`s5jax.core._native`) and, for the `s5jax`
command, JAX's persistent compilation cache in `xla/<host>` (`configure_compilation_cache`).

The compilation cache keeps every compiled program (the training and evaluation steps, the
parameter initialisers) on disk, keyed by JAX on the program, the compiler options and the
jax/jaxlib versions, so a later run of the same shapes loads them instead of compiling again.
On the 2-core AVX2 AMD EPYC host, `s5jax eval` of a pendulum run took 20.5 s without it and
12.1 s with a warm cache (`benchmarks/compile_cache.py`). XLA compiles for the CPU it runs on,
and JAX's key (jax/_src/cache_key.py: the program, jaxlib, the platform "cpu", XLA flags,
compile options, a fingerprint of the device topology) is not documented to tell instruction
sets apart, so each CPU type (model and instruction set flags) gets its own folder: a home
folder shared by hosts of several types never hands one an executable built for another's.

The folder is capped at `MAX_BYTES` (JAX evicts the least recently used entries; its file
lock also keeps processes that share the folder from reading an entry another is writing).
`S5JAX_COMPILATION_CACHE=0` turns it off; `JAX_COMPILATION_CACHE_DIR` (and JAX's other
`JAX_COMPILATION_CACHE_*` / `JAX_PERSISTENT_CACHE_*` variables) override its folder and
settings. JAX writes an entry in place, not under a temporary name: `drop_unfinished` removes
what a killed process left half-written before the command starts JAX. Standard library only:
it runs before JAX is imported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path

__all__ = [
    "cache_dir",
    "compilation_cache_dir",
    "configure_compilation_cache",
    "cpu_identity",
    "drop_unfinished",
]

#: Set to "0" to run the `s5jax` command without JAX's persistent compilation cache.
ENV_VAR = "S5JAX_COMPILATION_CACHE"
#: The compilation cache's size cap; JAX evicts the least recently used entries beyond it.
MAX_BYTES = 1 << 30
#: Programs that compile faster than this are not stored (JAX's default is 1 s, which leaves
#: out the parameter initialisers: a few tenths of a second each, 6 s of a pendulum `eval`).
MIN_COMPILE_SECONDS = 0.1


def cache_dir() -> Path:
    """`$S5JAX_CACHE_DIR`, else `$XDG_CACHE_HOME/s5jax`, else `~/.cache/s5jax`."""
    explicit = os.environ.get("S5JAX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "s5jax"


def cpu_identity() -> str:
    """The host CPU's model and instruction set flags (what code compiled for it may use)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep))) or platform.machine()


def compilation_cache_dir() -> Path:
    """The compilation cache's folder for this host's CPU type and this jaxlib."""
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = "unknown"
    host = hashlib.sha256(f"{cpu_identity()}\n{jaxlib}".encode()).hexdigest()[:16]
    return cache_dir() / "xla" / f"{platform.machine()}-{host}"


def _can_write(folder: Path) -> bool:
    """Whether `folder` is, or can be created as, a folder this process writes into."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def configure_compilation_cache() -> Path | None:
    """Turn on JAX's persistent compilation cache for this process; returns its folder.

    For the `s5jax` command, which calls it before it imports JAX: it sets JAX's environment
    variables (so processes the command starts, such as a sweep's trials, share the cache),
    each one only where the user has not set it. Returns None, changing nothing, when
    `S5JAX_COMPILATION_CACHE=0`, when JAX is already imported (a Python program calling
    `s5jax.cli.main` keeps its own JAX settings), or when the folder cannot be written (a
    read-only home). JAX creates the folder when it stores its first program.
    """
    if os.environ.get(ENV_VAR, "1").strip() == "0" or "jax" in sys.modules:
        return None
    folder = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or compilation_cache_dir())
    if not _can_write(folder):
        return None
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder))
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(MIN_COMPILE_SECONDS))
    if os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"].strip() != "-1":
        drop_unfinished(folder)
    return folder


def drop_unfinished(folder: Path, wait: float = 2.0) -> list[str]:
    """Remove the entries a killed process left unfinished; returns their names.

    With a size cap, JAX stores a program as `<key>-cache`, then its last-use stamp
    `<key>-atime`, under its file lock (`.lockfile`, filelock's `flock`), and every later store
    reads every entry's stamp: one `-cache` file without its stamp (a process killed between
    the two writes, or during the first) makes each later store fail with a warning, and
    nothing new is kept. Under the same lock, such entries are removed; a lock another process
    holds for `wait` seconds leaves the folder as it is (as does a system without `flock`).
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        return []
    if not folder.is_dir():
        return []
    dropped = []
    try:
        with open(folder / ".lockfile", "a") as lock:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return []
                    time.sleep(0.05)
            for entry in folder.glob("*-cache"):
                if not entry.with_name(entry.name.removesuffix("-cache") + "-atime").exists():
                    entry.unlink(missing_ok=True)
                    dropped.append(entry.name)
    except OSError:
        return dropped
    return dropped
