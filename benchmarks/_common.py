"""Shared helpers for the benchmarks: device/version info, interleaved timing, JSON output.

Importing this module calls `s5jax.configure_cpu_malloc()` (recorded as `malloc_tuned`).

Timing: every function is compiled and run once (warm-up), then the functions are called in
turn, round-robin (A B C A B C …) for `repeats` rounds, each call ended by
`jax.block_until_ready`. Interleaving spreads any load from other processes on a shared
machine over all the compared functions alike; the median per function is reported, and
ratios are taken between medians measured in the same run.

`time_blocked` is the alternative for functions whose memory footprints differ a lot (e.g. a
layer step against the App. A baseline, whose peak is several GiB): in rounds, each function
is called once untimed and then `per_round` times timed, back to back, as a training loop
calls its step. Called round-robin, each call runs in an allocator state left by a different
function: on the 2-core AMD host glibc trims the heap when the baseline frees more than
`M_TRIM_THRESHOLD` (at most 2 GiB), and the next call of ours re-faults ~200,000 pages
(about 780 MiB) that a loop of our step alone never re-faults. Both record the minor page
faults of every timed call (`getrusage`), so a JSON shows which regime a figure comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from s5jax import configure_cpu_malloc

# As the `s5jax` command does, before JAX starts: XLA's CPU buffers are reused, not mapped
# afresh per call (s5jax/_malloc.py). S5JAX_MALLOC_TUNING=0 measures glibc's default instead.
MALLOC_TUNED = configure_cpu_malloc()

import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where it cannot be read)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():  # the first processor's block is enough
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or "unknown"


def device_info() -> dict:
    """Versions, platform and devices of this run."""
    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "device_kind": devices[0].device_kind,
        "num_devices": len(devices),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_family_model": cpu_family_model(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "malloc_tuned": MALLOC_TUNED,
    }


def cpu_isa() -> list[str]:
    """The CPU's vector instruction-set flags that move these benchmarks (/proc/cpuinfo: AVX2,
    AVX-512 and its bf16/fp16 parts, AMX), [] where unknown. The model name alone does not
    tell them apart (some hosts report only "Intel(R) Xeon(R) Processor")."""
    flags = _cpuinfo().get("flags", "").split()
    return sorted(
        w for w in set(flags) if w in ("avx2", "fma") or w.startswith(("avx512", "amx"))
    )  # fmt: skip


def cpu_family_model() -> str:
    """/proc/cpuinfo's "vendor family/model", e.g. "AuthenticAMD 25/17" (Zen 4) or "26/2" (Zen
    5), "" where unknown. Virtual machines often report only "AMD EPYC" as the model name, and
    the two generations' AVX-512 differ (Zen 4 runs 512-bit operations as two 256-bit halves)."""
    fields = _cpuinfo()
    if "cpu family" not in fields:
        return ""
    family = f"{fields['cpu family']}/{fields.get('model', '?')}"
    return f"{fields.get('vendor_id', '')} {family}".strip()


def device_tag() -> str:
    return "cpu" if jax.default_backend() == "cpu" else "gpu"


def _timed_call(fn: Callable[[], object]) -> tuple[float, int]:
    """Wall seconds and minor page faults of one call, ended by `jax.block_until_ready`."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    elapsed = time.perf_counter() - t0
    return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def _summary(calls: dict[str, list[tuple[float, int]]]) -> dict[str, dict]:
    out = {}
    for name, cs in calls.items():
        ts = [t for t, _ in cs]
        out[name] = {
            "median_s": statistics.median(ts), "min_s": min(ts), "all_s": ts,
            "minor_faults": [f for _, f in cs],
        }  # fmt: skip
    return out


def time_interleaved(
    fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1
) -> dict[str, dict]:
    """Median/min/all wall times (seconds) and minor page faults of zero-argument callables,
    called round-robin."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    calls: dict[str, list[tuple[float, int]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            calls[name].append(_timed_call(fn))
    return _summary(calls)


def time_blocked(
    fns: dict[str, Callable[[], object]], rounds: int = 3, per_round: int = 3
) -> dict[str, dict]:
    """Median/min/all wall times (seconds) and minor page faults of zero-argument callables:
    `rounds` rounds, each calling every function once untimed (warm-up, and the allocator's
    re-warm after the previous function) and then `per_round` times timed in a row."""
    if rounds < 1 or per_round < 1:
        raise ValueError(f"rounds and per_round must be >= 1, got {rounds} and {per_round}")
    calls: dict[str, list[tuple[float, int]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn())
            calls[name].extend(_timed_call(fn) for _ in range(per_round))
    return _summary(calls)


def out_name(value: str) -> str:
    """argparse type of `--out`: a bare name for `results/<name>-<cpu|gpu>.json`, checked
    before the benchmark runs (a path would only fail when the results are written)."""
    if not value or "/" in value or "\\" in value or value.startswith("."):
        raise argparse.ArgumentTypeError(
            f"a bare name for results/<OUT>-<cpu|gpu>.json (no folder), got {value!r}"
        )
    return value


def write_json(name: str, payload: dict) -> Path:
    """Write `results/<name>-<cpu|gpu>.json` atomically (temp file in the same folder + rename)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{device_tag()}.json"
    fd, tmp = tempfile.mkstemp(dir=RESULTS, prefix=f".{name}-", suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def print_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> None:
    """Print rows as a fixed-width table; columns are (key, header, format spec)."""
    cells = [
        [format(r[k], fmt) if r.get(k) is not None else "-" for k, _, fmt in columns] for r in rows
    ]
    headers = [h for _, h, _ in columns]
    widths = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)))
