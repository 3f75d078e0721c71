"""Checkpoints of a training run with orbax: the latest ones and the best-validation ones.

A checkpoint holds every array of the training state (model parameters, model state such as
BatchNorm running statistics, optimiser state, PRNG keys) and a JSON dict of host-side facts
(epoch, step, best metric, early-stopping counters...).

**Arrays are saved by name.** Each leaf is stored under its key path
(`jax.tree_util.keystr`, e.g. `['model'].layers[0].ssm.Lambda_re`) in a flat dict, and
restored by looking that name up in the template: two same-shaped leaves that change places
(a reordered Equinox field) are still restored to the right field, and a leaf that is missing,
extra or of another shape or dtype is one error naming it. We flatten ourselves rather than
hand orbax the Equinox modules because orbax would then need the modules' static parts and
would match leaves by its own rules; a flat dict of names is plain for orbax and readable in
error messages.

**A checkpoint is complete only with its `s5jax.json`**, written (atomically) after orbax has
finished the step folder: `{"format": 2, "leaves": [{"name", "shape", "dtype"}...],
"files": {path: [size, crc32]}}`. Restoring checks the format, then every file's size and
CRC-32 *before* orbax reads anything (a damaged file is named, and orbax never starts the
concurrent tensorstore reads whose failures print "Event loop is closed" tracebacks), then the
leaves against the template. Two checkpoints of each kind are kept, so a save interrupted at
any point, or a damaged newest one, leaves an older complete one: `restore` falls back to the
newest valid checkpoint with a warning on the `s5jax` logger. Saving is synchronous.

Layout inside a run directory::

    checkpoints/latest/<step>/{state,meta,s5jax.json}   the two most recent saves
    checkpoints/best/<step>/...                         the two most recent best-val saves
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from .._atomic import atomic_write_json
from .._signals import deferred_signals

__all__ = ["CheckpointError", "Checkpoints", "from_saveable", "to_saveable"]

FORMAT = 2
_MANIFEST = "s5jax.json"
_KEEP = 2
_log = logging.getLogger("s5jax")


class CheckpointError(ValueError):
    """A checkpoint does not fit the model, is of another format, or none is readable."""


def to_saveable(tree) -> dict[str, np.ndarray]:
    """The arrays of `tree` as a dict {key path: array} (`jax.tree_util.keystr` names)."""
    arrays = eqx.filter(tree, eqx.is_array)
    leaves = jax.tree_util.tree_flatten_with_path(arrays)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _describe(arr) -> str:
    return f"{tuple(arr.shape)} {np.dtype(arr.dtype).name}"


def from_saveable(template, saved: dict[str, Any], *, source: str = "the checkpoint"):
    """Rebuild a pytree shaped like `template` from the arrays of `to_saveable`, by name.

    Raises `CheckpointError` naming the first leaf that is missing, extra, or saved with
    another shape or dtype (a checkpoint of a different model or config).
    """
    arrays, static = eqx.partition(template, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(arrays)
    hint = (
        "it was written by a different model or config: restore it with the config it was "
        "trained with (its run's config.json), or start a new run in a fresh --workdir"
    )
    names = [jax.tree_util.keystr(path) for path, _ in leaves]
    for name in names:
        if name not in saved:
            raise CheckpointError(f"{source} has no array {name}; {hint}")
    extra = sorted(set(saved) - set(names))
    if extra:
        raise CheckpointError(f"{source} holds {extra[0]}, which this model lacks; {hint}")
    restored = []
    for name, (_, leaf) in zip(names, leaves, strict=True):
        value = np.asarray(saved[name])
        if value.shape != leaf.shape or value.dtype != np.dtype(leaf.dtype):
            raise CheckpointError(
                f"{source}: {name} was saved as {_describe(value)} but this model expects "
                f"{_describe(leaf)}; {hint}"
            )
        restored.append(jnp.asarray(value))
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, restored), static)


def _file_sums(step_dir: Path) -> dict[str, list[int]]:
    """{relative path: [size, crc32]} of every file orbax wrote for a step."""
    sums = {}
    for path in sorted(step_dir.rglob("*")):
        if path.is_file() and path.name != _MANIFEST:
            data = path.read_bytes()
            sums[path.relative_to(step_dir).as_posix()] = [len(data), zlib.crc32(data)]
    return sums


def _check_files(step_dir: Path) -> dict[str, Any]:
    """The manifest of a step folder, after checking its format and its files; else raise.

    `CheckpointError` for a format this code does not read; `_Damaged` for an incomplete or
    damaged checkpoint (worth falling back from).
    """
    manifest_path = step_dir / _MANIFEST
    if not manifest_path.is_file():
        raise _Damaged(
            f"{step_dir} has no {_MANIFEST} (an interrupted save, or format 1 from an older "
            f"s5jax, which this version does not read)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        version = manifest["format"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _Damaged(f"{manifest_path} is unreadable ({e})") from None
    if version != FORMAT:
        raise CheckpointError(
            f"{step_dir} is a checkpoint of format {version!r}, this s5jax reads format "
            f"{FORMAT}: use the s5jax version that wrote it, or train again"
        )
    for rel, (size, crc) in manifest["files"].items():
        path = step_dir / rel
        try:
            data = path.read_bytes()
        except OSError as e:
            raise _Damaged(f"{path} is unreadable ({e.strerror or e})") from None
        if len(data) != size or zlib.crc32(data) != crc:
            raise _Damaged(f"{path} is damaged (its size or checksum changed)")
    return manifest


class _Damaged(Exception):
    """One checkpoint is incomplete or damaged; an older one may still be good."""


class Checkpoints:
    """The latest and best-validation checkpoints of one run directory.

    **Arguments:**
    - `run_dir`: the run directory; checkpoints go to `run_dir/checkpoints/{latest,best}`.
    """

    def __init__(self, run_dir: str | os.PathLike):
        root = Path(run_dir).resolve() / "checkpoints"
        # Synchronous saves: a step is complete when save() returns, and no background
        # thread outlives the manager.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=_KEEP, enable_async_checkpointing=False, create=True,
            cleanup_tmp_directories=True,  # what a killed save left half-written
        )  # fmt: skip
        self._managers = {
            name: ocp.CheckpointManager(root / name, options=options) for name in ("latest", "best")
        }

    def save(self, which: str, step: int, tree, meta: dict[str, Any]) -> None:
        """Save `tree` (any pytree of arrays and static parts) and `meta` (JSON) as `which`."""
        with deferred_signals():  # Ctrl-C / SIGTERM stop the run after the save, not inside
            self._save(which, step, tree, meta)

    def _save(self, which: str, step: int, tree, meta: dict[str, Any]) -> None:
        manager = self._manager(which)
        if step in manager.all_steps():
            # An earlier save of this step that a kill cut short (no manifest: `restore`
            # skipped it and training redid the step); orbax refuses to overwrite a step.
            manager.delete(step)
        state = to_saveable(tree)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        manager.save(step, args=args, force=True)
        manager.wait_until_finished()
        step_dir = Path(manager.directory) / str(step)
        leaves = [
            {"name": k, "shape": list(v.shape), "dtype": v.dtype.name} for k, v in state.items()
        ]
        if jax.process_index() == 0:  # several processes: orbax has synced them; 0 writes
            manifest = {"format": FORMAT, "leaves": leaves, "files": _file_sums(step_dir)}
            atomic_write_json(step_dir / _MANIFEST, manifest)

    def latest_step(self, which: str = "latest") -> int | None:
        """The step of the newest checkpoint of `which` orbax finished, or `None`."""
        return self._manager(which).latest_step()

    def restore(self, which: str, template) -> tuple[Any, dict[str, Any]]:
        """Restore the newest valid `which` checkpoint into the structure of `template`.

        A damaged or incomplete newest checkpoint is skipped with a warning on the `s5jax`
        logger. Raises `FileNotFoundError` when there is none, `CheckpointError` when none
        is readable or they do not fit `template`.

        **Returns:** `(tree, meta)`.
        """
        manager = self._manager(which)
        folder = Path(manager.directory)
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            other = "latest" if which == "best" else "best"
            if not self._manager(other).all_steps():
                hint = (
                    " (nor any other: the run stopped before its first checkpoint, which it "
                    "saves when its first epoch ends)"
                )
            elif which == "best":
                hint = (
                    " (a run with train.select = 'last' saves it when training ends; "
                    "--checkpoint latest reads the newest)"
                )
            else:
                hint = ""
            raise FileNotFoundError(f"no {which!r} checkpoint in {folder}{hint}")
        problems = []
        for step in steps:
            try:
                tree, meta = self._restore_step(manager, step, template)
            except _Damaged as e:
                problems.append(str(e))
                continue
            if problems:
                _log.warning(
                    "%s; restored the older %s checkpoint of step %d instead",
                    "; ".join(problems),
                    which,
                    step,
                )
            return tree, meta
        other = "best" if which == "latest" else "latest"
        raise CheckpointError(
            f"no readable {which!r} checkpoint in {folder}: {'; '.join(problems)}. Use the "
            f"{other!r} one instead (--checkpoint {other}; to continue training, copy "
            f"{folder.parent / other} over {folder})"
        )

    def _restore_step(self, manager, step: int, template) -> tuple[Any, dict[str, Any]]:
        step_dir = Path(manager.directory) / str(step)
        manifest = _check_files(step_dir)
        try:
            restored = manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
                ),
            )
        except Exception as e:  # files intact but unreadable to orbax: treat as damaged
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise _Damaged(f"{step_dir} is unreadable ({type(e).__name__}: {first})") from None
        state = restored["state"]
        if sorted(state) != sorted(leaf["name"] for leaf in manifest["leaves"]):
            raise _Damaged(f"{step_dir} holds other arrays than its {_MANIFEST} lists")
        tree = from_saveable(template, state, source=f"checkpoint {step_dir}")
        return tree, dict(restored["meta"])

    def close(self) -> None:
        for manager in self._managers.values():
            manager.close()

    def _manager(self, which: str):
        if which not in self._managers:
            raise ValueError(f"checkpoint kind must be 'latest' or 'best', got {which!r}")
        return self._managers[which]
