"""`configure_cpu_malloc`: large freed blocks are reused instead of mapped afresh.

Each case runs in a fresh interpreter (the setting is process-wide and permanent). The probe
allocates and frees a 64 MiB array ten times in a worker thread (as XLA's CPU runtime does for
its step buffers) and counts the minor page faults: untuned glibc maps every block afresh
(about 16k faults each), tuned glibc reuses the first one.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallopt"),
    reason="glibc's mallopt is Linux/glibc only",
)

_PROBE = """
import resource, sys, threading
import numpy as np
from s5jax import configure_cpu_malloc

applied = configure_cpu_malloc() if sys.argv[1] == "tune" else False
faults = []

def work():
    a = np.ones(2**23); del a  # 64 MiB: the first block may fault in either case
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        a = np.ones(2**23); del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=work); thread.start(); thread.join()
print(applied, faults[0])
"""


def _probe(mode: str, **env) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout.split()
    return out[0] == "True", int(out[1])


def test_tuning_stops_refaulting_large_blocks():
    applied, tuned = _probe("tune")
    assert applied
    untuned_applied, untuned = _probe("plain")
    assert not untuned_applied
    pages = 10 * 2**26 // 4096
    # Untuned: every 64 MiB block is mapped afresh (transparent huge pages may divide the count
    # by up to 512). Tuned: the block is reused, next to no faults.
    assert untuned > pages // 1000
    assert tuned < untuned // 10
    assert tuned < pages // 100


def test_environment_opt_out():
    applied, _ = _probe("tune", S5JAX_MALLOC_TUNING="0")
    assert not applied
