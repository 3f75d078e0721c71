"""Data parallelism over devices with `jax.sharding`, on one process or several.

Batches are split along their first axis over a one-axis mesh ("data"); parameters, model
state and optimiser state are replicated. The jitted steps are written for one global batch:
XLA partitions them, and the batch reductions (the loss mean, BatchNorm's `pmean` over the
vmapped "batch" axis) become cross-device reductions, so one device and several give the same
numbers up to floating-point reassociation.

**Several processes** (JAX's multi-controller runtime: one process per host, or per group of
devices) join with `initialize_multihost` before any other JAX call; the mesh then spans the
devices of every process. Every process walks the same global batch order (the same seed) but
reads only its own rows of each batch (`DataParallel.local_rows`, `iterate_batches(rows=...)`)
and hands them to `shard_local`, which builds the global array from each process's part
(`jax.make_array_from_process_local_data`). Process 0 owns the run directory: it checks it,
holds its lock and writes its files; `announce` / `await_announcement` pass its decision (or
its error) to the other processes through the coordinator's key-value store, so they all
stop with the same message.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "DEFAULT_COORDINATOR_TIMEOUT",
    "EXIT_COORDINATOR",
    "CoordinatorUnreachable",
    "DataParallel",
    "SilentLogger",
    "announce",
    "await_announcement",
    "initialize_multihost",
    "is_first_process",
]

# How long (seconds) a process waits to reach the coordinator and for all processes to join.
DEFAULT_COORDINATOR_TIMEOUT = 300.0
# Exit status of a process that gave up on the coordinator (EX_UNAVAILABLE in sysexits.h).
EXIT_COORDINATOR = 69


class CoordinatorUnreachable(RuntimeError):
    """A process could not reach the coordinator of a multi-process run in time."""


@dataclass(frozen=True)
class DataParallel:
    """A one-axis mesh over devices: shard batches, replicate everything else."""

    mesh: Mesh

    @classmethod
    def local(cls) -> DataParallel:
        """All local devices (after `initialize_multihost`, all devices of all processes)."""
        return cls(Mesh(np.asarray(jax.devices()), ("data",)))

    @property
    def n_devices(self) -> int:
        return self.mesh.devices.size

    def describe(self) -> str:
        kind = self.mesh.devices.flat[0].platform
        text = f"{self.n_devices} {kind} device{'s' if self.n_devices > 1 else ''}"
        if (n := jax.process_count()) > 1:
            text += f" in {n} processes (this is process {jax.process_index()})"
        return text

    def check_batch_size(self, batch_size: int, name: str) -> None:
        if batch_size % self.n_devices:
            n = self.n_devices
            up = -(-batch_size // n) * n
            fix = f"{name} {up}" if name.startswith("--") else f"--set {name}={up}"
            raise ValueError(
                f"{name}={batch_size} must be divisible by the number of devices ({n}) for "
                f"data parallelism; set a multiple of {n} ({fix}) or run on a number of "
                f"devices that divides {batch_size}"
            )

    def replicate(self, tree):
        """Copy `tree`'s arrays to every device (every process passes the same values)."""
        sharding = NamedSharding(self.mesh, PartitionSpec())
        if jax.process_count() == 1:
            return jax.device_put(tree, sharding)
        # Every process built the same values (the same seed, or the same checkpoint):
        # `device_put` would check that with an all-gather per leaf (a compilation each,
        # 14 s of a 2-process start on 2 cores for the tiny synthetic model); skip it.
        return jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree
        )

    def _batch_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec("data"))

    def local_rows(self, batch_size: int) -> slice:
        """The rows of a global batch of `batch_size` that this process's devices hold.

        `slice(0, batch_size)` with one process; with several, the contiguous block the mesh
        gives this process's devices (`batch_size / n_devices` rows per local device).
        """
        index_map = self._batch_sharding().addressable_devices_indices_map((batch_size,))
        starts = sorted(idx[0].indices(batch_size)[:2] for idx in index_map.values())
        lo, hi = starts[0][0], starts[-1][1]
        if sum(b - a for a, b in starts) != hi - lo:  # not one block: never with jax.devices()
            raise RuntimeError(f"this process's rows of a batch are not contiguous: {starts}")
        return slice(lo, hi)

    def shard(self, batch: dict[str, np.ndarray]):
        """Place a *global* batch on the mesh, split along its first axis.

        Every process passes the whole batch and keeps its own rows. `shard_local` is the
        same for a process that read only its rows.
        """
        out = {}
        for name, value in batch.items():
            value = np.asarray(value)
            rows = self.local_rows(value.shape[0])
            out[name] = jax.make_array_from_process_local_data(
                self._batch_sharding(), value[rows], value.shape
            )
        return out

    def shard_local(self, batch: dict[str, np.ndarray], batch_size: int):
        """Place this process's rows (`local_rows(batch_size)`) of a global batch on the mesh."""
        out = {}
        for name, value in batch.items():
            value = np.asarray(value)
            shape = (batch_size, *value.shape[1:])
            out[name] = jax.make_array_from_process_local_data(self._batch_sharding(), value, shape)
        return out


def is_first_process() -> bool:
    """Whether this is process 0 (the only one in a single-process run): the run's owner."""
    return jax.process_index() == 0


# --- joining ------------------------------------------------------------------------------


def _parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--coordinator {address!r} is not HOST:PORT; give the first process's host name "
            "or IP address and a free port, e.g. 10.0.0.1:29500"
        )
    return host.strip("[]"), int(port)


def _wait_for_coordinator(address: str, deadline: float, timeout: float) -> None:
    """Return once `address` accepts TCP connections; at `deadline`, `CoordinatorUnreachable`."""
    host, port = _parse_address(address)
    last = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return
        except OSError as e:
            last = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            raise CoordinatorUnreachable(
                f"cannot reach the coordinator at {address} within {timeout:g} s ({last}): "
                "start process 0 (the coordinator) first or at the same time, check that "
                "--coordinator names its host and a port it can open and that no firewall "
                "blocks it, or wait longer with --coordinator-timeout SECONDS"
            )
        time.sleep(0.2)


def _exit_on_timeout(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_COORDINATOR)


def initialize_multihost(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout: float = DEFAULT_COORDINATOR_TIMEOUT,
    on_timeout: Callable[[str], object] = _exit_on_timeout,
) -> None:
    """Join a multi-process run (`jax.distributed.initialize`) within `timeout` seconds.

    Call once per process before any other JAX call; the mesh of `DataParallel.local()` then
    spans every process's devices.

    **Arguments:**
    - `coordinator`: `HOST:PORT` of process 0, which serves the coordinator there; default
      `$JAX_COORDINATOR_ADDRESS`, else detected (SLURM, Open MPI, Cloud TPU).
    - `num_processes`, `process_id`: this run's process count and this process's index
      (0 .. num_processes - 1); detected under SLURM / Open MPI / Cloud TPU when omitted.
    - `timeout`: seconds to reach the coordinator and for all processes to join.
    - `on_timeout(message)`: called from a watchdog thread when joining takes longer than
      `timeout` (JAX's own timeout aborts the process with a C++ stack trace); it must end
      the process. The default prints `error: message` and exits with `EXIT_COORDINATOR`.

    Raises `ValueError` for inconsistent arguments and `CoordinatorUnreachable` when a process
    other than 0 finds nothing listening at `coordinator` within `timeout`.
    """
    if not timeout > 0 or not np.isfinite(timeout):
        raise ValueError(
            f"--coordinator-timeout must be a positive number of seconds, got {timeout}"
        )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {num_processes}")
    if process_id is not None and not 0 <= process_id < (num_processes or process_id + 1):
        raise ValueError(
            f"--process-id {process_id} must be in 0 .. --num-processes - 1 "
            f"({(num_processes or 1) - 1})"
        )
    address = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address:
        _parse_address(address)
    start = time.monotonic()
    deadline = start + timeout
    if address and process_id not in (None, 0):
        _wait_for_coordinator(address, deadline, timeout)
    where = f"the coordinator at {address}" if address else "the coordinator"
    count = f"all {num_processes} processes" if num_processes else "all processes"
    message = (
        f"{count} did not join {where} within {timeout:g} s: start every process (with the "
        "same --coordinator and --num-processes, and distinct --process-id), or wait longer "
        "with --coordinator-timeout SECONDS"
    )
    watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), on_timeout, (message,))
    watchdog.daemon = True
    watchdog.start()
    try:
        # JAX's own timeout (which aborts) comes after ours.
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=int(timeout) + 60,
        )
    except (ValueError, TypeError) as e:  # what JAX could not detect
        reason = " ".join(str(e).split()).rstrip(".")
        raise ValueError(
            f"--multihost: {reason}; outside SLURM, Open MPI and Cloud TPU "
            "give --coordinator HOST:PORT, --num-processes N and --process-id I"
        ) from None
    finally:
        watchdog.cancel()


# --- process 0 decides, the others follow ---------------------------------------------------

# Errors process 0 may pass on, re-raised with the same class on the other processes.
_PASSED_ON: dict[str, type[BaseException]] = {}


def _error_classes() -> dict[str, type[BaseException]]:
    if not _PASSED_ON:
        from ..config import ConfigError
        from ..data import DatasetError
        from ._checkpoint import CheckpointError
        from ._rundir import RunDirBusy, RunDirError

        for cls in (
            RunDirBusy, RunDirError, CheckpointError, ConfigError, DatasetError,
            FileNotFoundError, PermissionError, NotADirectoryError, OSError, ValueError,
        ):  # fmt: skip
            _PASSED_ON[cls.__name__] = cls
    return _PASSED_ON


def _client():
    from jax._src import distributed

    return distributed.global_state.client


# How many times each key was announced / awaited in this process: a process that trains
# several runs (`train --seeds`) announces each key once per run, and the others await the
# same numbered key.
_ROUNDS: dict[str, int] = {}


def _next_round(key: str) -> str:
    _ROUNDS[key] = _ROUNDS.get(key, 0) + 1
    return f"{key}/{_ROUNDS[key]}"


def announce(key: str, value=None, *, error: BaseException | None = None):
    """On process 0: tell the other processes `value` (JSON), or that it failed with `error`.

    Returns `value`. A no-op with one process.
    """
    if jax.process_count() > 1:
        key = _next_round(key)
        if error is not None:
            payload = {"error": type(error).__name__, "message": str(error)}
        else:
            payload = {"value": value}
        _client().key_value_set(key, json.dumps(payload, default=str))
    return value


def await_announcement(key: str, timeout_s: float = 24 * 3600.0):
    """On another process: wait for process 0's `announce(key, ...)`; return its value or
    raise its error (same class where it is one of s5jax's, else `RuntimeError`)."""
    key = _next_round(key)
    payload = json.loads(_client().blocking_key_value_get(key, int(timeout_s * 1000)))
    if "error" not in payload:
        return payload["value"]
    cls = _error_classes().get(payload["error"])
    message = payload["message"]
    if cls is None:
        raise RuntimeError(f"process 0 failed ({payload['error']}): {message}")
    raise cls(message)


class SilentLogger:
    """The metrics logger of a process other than 0: process 0 alone writes the metrics."""

    def __getattr__(self, name: str):
        if name.startswith("log_") or name == "close":
            return lambda *args, **kwargs: None
        raise AttributeError(name)
