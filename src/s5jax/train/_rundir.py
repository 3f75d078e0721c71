"""Run directories: one run owns its folder, and a new run never mixes with an old one.

A training process holds an exclusive advisory lock (`fcntl.flock`) on `WORKDIR/.lock` for as
long as it runs; the file records its PID, and the operating system drops the lock when the
process ends, however it ends (kill -9 included), so a stale `.lock` file never blocks a later
run. A second process gets `RunDirBusy` naming the holder's PID.

What a run may do with an existing folder is decided before anything is written to it:

| mode | the folder holds a checkpoint | no checkpoint, not empty | empty or absent |
|---|---|---|---|
| new run (`resume=False`) | refused | refused | start |
| `overwrite=True` | replaced | replaced (if a run directory) | start |
| `resume=True` | resume | refused | refused |
| `resume="auto"` | resume | start again in it (refused in a sweep or seeds folder) | start |

`--overwrite` builds the new run in a temporary sibling folder and swaps it in only after the
new run has written its config, so the path holds either the old run or the new one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from ..config import ConfigError, ExperimentConfig, load_experiment, to_dict

__all__ = [
    "LOCK_NAME",
    "RunDirBusy",
    "RunDirError",
    "RunDirLock",
    "check_same_config",
    "check_workdir",
    "config_differences",
    "has_checkpoint",
    "replace_run_dir",
]

LOCK_NAME = ".lock"
# What makes a folder an s5jax run directory (what `--overwrite` may delete).
_RUN_FILES = ("config.json", "checkpoints", "metrics.jsonl", "results.json")


class RunDirError(ValueError):
    """A run directory cannot be used as asked (not empty, no checkpoint to resume...)."""


class RunDirBusy(RunDirError):
    """Another process holds the run directory's lock."""


def run_order(run_dir: Path) -> tuple[str, int, str]:
    """The order of a seeds or sweep directory's runs: seed-2 before seed-10."""
    prefix, _, number = run_dir.name.partition("-")
    return prefix, int(number) if number.isdigit() else -1, run_dir.name


def has_checkpoint(workdir: Path) -> bool:
    """Whether `workdir/checkpoints/latest` holds a finished step (a folder named by a number)."""
    latest = workdir / "checkpoints" / "latest"
    return latest.is_dir() and any(p.name.isdigit() for p in latest.iterdir())


def _contents(workdir: Path) -> list[str]:
    return sorted(p.name for p in workdir.iterdir() if p.name != LOCK_NAME)


def _check_writable(workdir: Path) -> None:
    """`workdir` is a folder or can become one: else the `OSError` that creating it would raise."""
    if workdir.exists() and not workdir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", str(workdir))
    parent = workdir
    while not parent.exists():
        parent = parent.parent
    if parent != workdir and not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder", str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "is not writable", str(parent))


def check_workdir(workdir: Path, *, resume: bool | str, overwrite: bool) -> str:
    """What a run may do with `workdir`: `"new"`, `"resume"` or `"overwrite"`; else raise.

    Reads only. Raises `RunDirError` for a refused combination (the message names the flag
    that allows it) and `OSError` when the folder cannot be created or written.
    """
    if resume not in (False, True, "auto"):
        raise ValueError(f"resume must be False, True or 'auto', got {resume!r}")
    if overwrite and resume:
        raise RunDirError("--overwrite replaces a run and --resume continues it: give one")
    _check_writable(workdir)
    contents = _contents(workdir) if workdir.is_dir() else []
    if resume is True and not has_checkpoint(workdir):
        found = f"it holds {', '.join(contents)}" if contents else "it is empty or absent"
        raise RunDirError(
            f"--resume: no checkpoint in {workdir / 'checkpoints' / 'latest'} ({found}); check "
            "--workdir, or use --resume-or-start to start a new run when there is none"
        )
    if not contents:
        return "new"
    listed = f"{', '.join(contents[:4])}{', ...' if len(contents) > 4 else ''}"
    if not any(name in contents for name in _RUN_FILES) and not has_checkpoint(workdir):
        # Not a run directory. A sweep's or a seeds' folder never takes a run (its trials'
        # or seeds' runs are its subfolders; a run beside them would be read as one more);
        # another folder (a scheduler's log beside the run) only with --resume-or-start.
        sweep, seeds = "sweep.json" in contents, any(n.startswith("seed-") for n in contents)
        if sweep or seeds or not resume:
            what = ("a sweep directory (sweep.json)" if sweep
                    else "a seeds directory (seed-N)" if seeds
                    else "not empty and not an s5jax run directory (no config.json)")  # fmt: skip
            flag = " --overwrite only replaces run directories;" if overwrite else ""
            raise RunDirError(
                f"{workdir} is {what}: it holds {listed};{flag} choose another --workdir"
            )
    if resume:
        return "resume"
    if not overwrite:
        raise RunDirError(
            f"{workdir} already holds a run ({listed}): add --resume to continue it, "
            "--overwrite to replace it, or choose another --workdir"
        )
    return "overwrite"


class RunDirLock:
    """The exclusive lock of one run directory (`WORKDIR/.lock`, holding the owner's PID).

    **Arguments:**
    - `workdir`: the run directory; created (with its parents) when absent.
    """

    def __init__(self, workdir: str | os.PathLike):
        self.workdir = Path(workdir)
        self._file = None

    def acquire(self) -> RunDirLock:
        """Take the lock; raise `RunDirBusy` naming the holder's PID when another has it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / LOCK_NAME
        f = open(path, "a+", encoding="utf-8")  # held until release()
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip()
            f.close()
            holder = f"process {pid}" if pid.isdigit() else "another process"
            raise RunDirBusy(
                f"{self.workdir} is in use by {holder} (lock {path}): wait for that run to end "
                "or stop it, or choose another --workdir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        _remove_stale_temporaries(self.workdir)
        return self

    def release(self) -> None:
        """Drop the lock (the `.lock` file stays; a later run takes it over)."""
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def replace_run_dir(workdir: Path, lock: RunDirLock, write) -> None:
    """Build a new run in a locked temporary sibling, then swap it in for `workdir`.

    `write(folder)` writes the new run's first files (its config) into the sibling; only after
    it returns is the old run moved aside and deleted. `lock` (the old folder's) then holds
    the new folder's lock instead.
    """
    fresh = workdir.parent / f".{workdir.name}.new-{os.getpid()}"
    shutil.rmtree(fresh, ignore_errors=True)
    new_lock = RunDirLock(fresh).acquire()
    try:
        write(fresh)
        old = workdir.parent / f".{workdir.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(workdir, old)
        os.replace(fresh, workdir)
    except BaseException:
        new_lock.release()
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    lock.release()
    lock._file, new_lock._file = new_lock._file, None
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temporaries(workdir: Path) -> None:
    """Delete what an atomic write killed mid-way left in the run directory (`.NAME.HEX.tmp`,
    s5jax._atomic's temporary siblings). Safe only under the lock: no other writer is active."""
    for path in workdir.glob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)


# --- the run's config -------------------------------------------------------------------------

# Settings that do not change what a run trains: a run directory whose config.json differs
# from the requested config only in these is the same run. `train.epochs` may differ too (a
# run is then extended, or found complete), and so may what is only logged or how evaluation
# is batched.
_IGNORED = ("name", "description", "paper")
_FREE = ("train.epochs", "train.log_every", "train.test_every_epoch", "data.eval_batch_size")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(a: ExperimentConfig, b: ExperimentConfig) -> list[str]:
    """The keys where `a` (there) and `b` (here) train differently: name, description and
    paper ignored, and so are `train.epochs`, `train.log_every`, `train.test_every_epoch` and
    `data.eval_batch_size`."""
    fa = _flat({k: v for k, v in to_dict(a).items() if k not in _IGNORED})
    fb = _flat({k: v for k, v in to_dict(b).items() if k not in _IGNORED})
    return [
        f"{k} ({fa.get(k)!r} there, {fb.get(k)!r} here)"
        for k in sorted(set(fa) | set(fb))
        if fa.get(k) != fb.get(k) and k not in _FREE
    ]


def check_same_config(workdir: str | os.PathLike, config: ExperimentConfig) -> None:
    """Refuse to resume the run in `workdir` with a config that trains differently from its
    config.json (`ValueError` naming the keys). An unreadable config.json is left to the
    checkpoint's own check (resuming writes it again)."""
    path = Path(workdir) / "config.json"
    try:
        there = load_experiment(path)
    except (ConfigError, OSError):
        return
    diff = config_differences(there, config)
    if diff:
        raise ValueError(
            f"{workdir} holds a run of another config ({'; '.join(diff[:3])}"
            f"{'; ...' if len(diff) > 3 else ''}): resume it with the settings it was started "
            f"with (`s5jax train {path} --workdir {workdir} --resume` reads them), or start a "
            "new run in a fresh --workdir or with --overwrite"
        )
