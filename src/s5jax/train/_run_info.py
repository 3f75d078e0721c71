"""What a run directory records about where and how it ran: versions, devices, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import jax

from .._atomic import atomic_write_json

__all__ = ["git_commit", "native_scan_status", "pallas_scan_status", "run_info", "write_json"]

_PACKAGES = ("s5jax", "jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", "numpy", "pillow")


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """The commit of the git checkout holding `path` (default: this package), or None."""
    folder = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def native_scan_status(scan_method: str) -> str:
    """Whether the C++ scan could run here, for a model with `scan_method`: `"available"`,
    `"unavailable: <why>"`, or not asked when the run cannot use it (asking builds it).
    On CPU `"auto"` runs it where it is available and there is one device, so two runs of
    one config can differ in speed by what this says (`s5jax.core._ssm.AUTO_CPU_NATIVE`)."""
    from ..core import native_available, native_build_error

    if scan_method not in ("auto", "native"):
        return f"not used (scan_method = {scan_method!r})"
    if scan_method == "auto" and (n := jax.device_count()) > 1:
        return f"not used ({n} devices: 'auto' runs the chunked scan)"
    return "available" if native_available() else f"unavailable: {native_build_error()}"


def pallas_scan_status(scan_method: str) -> str:
    """Whether `scan_method = "auto"` may run the Pallas kernel here (on one NVIDIA GPU, for
    sequences above `s5jax.core._ssm.AUTO_GPU_PALLAS_ABOVE` stored states), or why not."""
    from ..core import _ssm, pallas_unavailable_reason

    if scan_method == "pallas":
        return "used (scan_method = 'pallas')"
    if scan_method != "auto":
        return f"not used (scan_method = {scan_method!r})"
    if reason := pallas_unavailable_reason():
        return f"not used by 'auto': {reason}"
    if (n := jax.device_count()) > 1:
        return f"not used by 'auto': {n} devices"
    if _ssm.AUTO_GPU_PALLAS_ABOVE is None:
        return "not used by 'auto' (AUTO_GPU_PALLAS_ABOVE is None)"
    return f"used by 'auto' above {_ssm.AUTO_GPU_PALLAS_ABOVE} stored states per sequence"


def run_info(**extra: Any) -> dict[str, Any]:
    """Versions of the stack, the devices, the git commit, the command line and the time."""
    info = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {name: _version(name) for name in _PACKAGES},
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "git_commit": git_commit(),
    }
    info.update(
        {
            k: (str(v) if not isinstance(v, (int, float, str, type(None))) else v)
            for k, v in extra.items()
        }
    )
    return info


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically (temporary sibling, then rename)."""
    atomic_write_json(path, obj, indent=2, sort_keys=True, default=str)
