"""Checkpoints of a training run with orbax: the latest one and the best-validation one.

A checkpoint holds every array of the training state (model parameters, model state such as
BatchNorm running statistics, optimiser state, PRNG keys), flattened to a numbered dict so that
any Equinox/optax pytree round-trips exactly, and a JSON dict of host-side facts (epoch, step,
best metric, early-stopping counters...). Orbax writes each checkpoint under a temporary name
and renames it when complete, so a run killed mid-save leaves the previous checkpoint intact.

Layout inside a run directory::

    checkpoints/latest/<step>/...   the most recent save (one kept)
    checkpoints/best/<step>/...     the save with the best validation metric (one kept)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

__all__ = ["Checkpoints", "from_saveable", "to_saveable"]


def to_saveable(tree) -> dict[str, np.ndarray]:
    """The arrays of `tree`, in flattening order, as a dict {"00000": array, ...}."""
    leaves = jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))
    return {f"{i:05d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}


def from_saveable(template, saved: dict[str, Any]):
    """Rebuild a pytree shaped like `template` from the arrays of `to_saveable`.

    Raises a `ValueError` when the saved arrays do not fit the template (a checkpoint of a
    different model or config).
    """
    arrays, static = eqx.partition(template, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    if len(saved) != len(leaves):
        raise ValueError(
            f"checkpoint holds {len(saved)} arrays but the model/optimiser has {len(leaves)}: "
            "it was written by a different config"
        )
    restored = []
    for i, leaf in enumerate(leaves):
        value = np.asarray(saved[f"{i:05d}"])
        if value.shape != leaf.shape:
            raise ValueError(
                f"checkpoint array {i} has shape {value.shape}, expected {leaf.shape}: "
                "it was written by a different config"
            )
        restored.append(jnp.asarray(value, dtype=leaf.dtype))
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, restored), static)


class Checkpoints:
    """The latest and best-validation checkpoints of one run directory.

    **Arguments:**
    - `run_dir`: the run directory; checkpoints go to `run_dir/checkpoints/{latest,best}`.
    """

    def __init__(self, run_dir: str | os.PathLike):
        root = Path(run_dir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=1, enable_async_checkpointing=False, create=True
        )
        self._managers = {
            name: ocp.CheckpointManager(root / name, options=options) for name in ("latest", "best")
        }

    def save(self, which: str, step: int, tree, meta: dict[str, Any]) -> None:
        """Save `tree` (any pytree of arrays and static parts) and `meta` (JSON) as `which`."""
        manager = self._manager(which)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(to_saveable(tree)), meta=ocp.args.JsonSave(meta)
        )
        manager.save(step, args=args, force=True)
        manager.wait_until_finished()

    def latest_step(self, which: str = "latest") -> int | None:
        """The step of the newest complete checkpoint of `which`, or `None`."""
        return self._manager(which).latest_step()

    def restore(self, which: str, template) -> tuple[Any, dict[str, Any]]:
        """Restore the newest `which` checkpoint into the structure of `template`.

        **Returns:** `(tree, meta)`.
        """
        manager = self._manager(which)
        step = manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"no {which!r} checkpoint in {manager.directory}")
        # Restore as saved, then fit to the template: a mismatch gets our message, not orbax's.
        restored = manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()),
        )
        return from_saveable(template, restored["state"]), dict(restored["meta"])

    def close(self) -> None:
        for manager in self._managers.values():
            manager.close()

    def _manager(self, which: str):
        if which not in self._managers:
            raise ValueError(f"checkpoint kind must be 'latest' or 'best', got {which!r}")
        return self._managers[which]
