"""Data parallelism over the local devices with `jax.sharding`.

Batches are split along their first axis over a one-axis mesh ("data"); parameters, model
state and optimiser state are replicated. The jitted steps are written for one global batch:
XLA partitions them, and the batch reductions (the loss mean, BatchNorm's `pmean` over the
vmapped "batch" axis) become cross-device reductions, so one device and several give the same
numbers up to floating-point reassociation.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["DataParallel", "initialize_multihost"]


@dataclass(frozen=True)
class DataParallel:
    """A one-axis mesh over devices: shard batches, replicate everything else."""

    mesh: Mesh

    @classmethod
    def local(cls) -> DataParallel:
        """All local devices (after `initialize_multihost`, all devices of all hosts)."""
        return cls(Mesh(np.asarray(jax.devices()), ("data",)))

    @property
    def n_devices(self) -> int:
        return self.mesh.devices.size

    def describe(self) -> str:
        kind = self.mesh.devices.flat[0].platform
        return f"{self.n_devices} {kind} device{'s' if self.n_devices > 1 else ''}"

    def check_batch_size(self, batch_size: int, name: str) -> None:
        if batch_size % self.n_devices:
            raise ValueError(
                f"{name}={batch_size} must be divisible by the number of devices "
                f"({self.n_devices}) for data parallelism; choose a multiple of {self.n_devices}"
            )

    def replicate(self, tree):
        sharding = NamedSharding(self.mesh, PartitionSpec())
        return jax.device_put(tree, sharding)

    def shard(self, batch: dict[str, np.ndarray]):
        """Place a global batch on the mesh, split along its first axis.

        Every host iterates the same global batch order (same seed), so each passes the whole
        batch and keeps its own contiguous slice of rows.
        """
        sharding = NamedSharding(self.mesh, PartitionSpec("data"))
        n_proc, index = jax.process_count(), jax.process_index()
        out = {}
        for name, value in batch.items():
            value = np.asarray(value)
            rows = value.shape[0] // n_proc
            local = value[index * rows : (index + 1) * rows]
            out[name] = jax.make_array_from_process_local_data(sharding, local, value.shape)
        return out


def initialize_multihost() -> None:
    """Join a multi-host run (`jax.distributed.initialize`, configured from the environment).

    Call once per process before any other JAX call; the mesh of `DataParallel.local()` then
    spans every host's devices, and `DataParallel.shard` gives each host its slice of rows.
    """
    jax.distributed.initialize()
