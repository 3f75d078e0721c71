"""The native planar scan kernels alone, at each paper config's SSM shape (one layer's call).

What `scan_method = "auto"` runs on CPU for the S5 layers (`s5jax.core._native`): the forward
pass over [Re | Im] rows, float32 states (`fp32 forward`) or float32 states with their
bfloat16 copy (`mixed forward`, what `model.precision = "bf16"` runs), and the adjoint pass
that writes b̄ and ā (`fp32 adjoint`, b̄ float32; `bf16 adjoint`, b̄ bfloat16). Shapes come
from `train_step.py`'s CPU shapes (`--paper` for the paper's batch and length): batch N,
length L, P stored lanes (half the config's P with conjugate symmetry), one or two
directions. Each config's variants are jitted and timed interleaved in one process
(`_common.time_interleaved`), medians.

Bytes counted per call (what the pass must move at least): forward, b read (N·L·2P reals)
and the states written (N·L·2DP reals; the mixed pass also their bfloat16 copy); adjoint,
g and the states read (2 · N·L·2DP) and b̄ written (N·L·2P). GB/s = bytes / median time.

Two builds (e.g. before and after a kernel change) compare by running this script once per
build in alternating processes, `PYTHONPATH=<other tree>/src` for the other; each build of
`_native.cc` is cached under its own source hash.

    .venv/bin/python benchmarks/planar_scan.py [--configs speech,pathx] [--threads N]
        [--repeats N] [--paper] [--out NAME]
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from _common import device_info, out_name, print_table, time_interleaved, write_json
from train_step import TASKS, shapes

from s5jax.config import load_experiment
from s5jax.core import _native

DEFAULT_CONFIGS = ("listops", "text", "image", "pathfinder", "pathx", "speech", "smnist")


def config_shape(task: str, paper: bool) -> dict:
    """N, L, P (stored lanes) and the directions of one layer's scan for `task`."""
    s = shapes(task, None, None, paper)
    m = load_experiment(task).model
    P = m.state_size
    N = s["batch"] * (2 if task == "retrieval" else 1)  # retrieval's two documents
    return {"task": task, "N": N, "L": s["L"], "P": P, "directions": 2 if m.bidirectional else 1}


def variants(N: int, L: int, P: int, bidirectional: bool, key) -> dict:
    """name -> (zero-argument callable, bytes it must move)."""
    D = 2 if bidirectional else 1
    ka, kp, kb, kg = jax.random.split(key, 4)
    radius = jax.random.uniform(ka, (P,), jnp.float32, 0.9, 0.999)
    phase = jax.random.uniform(kp, (P,), jnp.float32, -np.pi, np.pi)
    a = jnp.broadcast_to(
        jnp.concatenate([radius * jnp.cos(phase), radius * jnp.sin(phase)]), (N, 2 * P)
    )
    b = jax.random.normal(kb, (N, L, 2 * P), jnp.float32)
    g = jax.random.normal(kg, (N, L, 2 * D * P), jnp.float32)
    fwd = jax.jit(lambda a, b: _native._planar_forward(a, b, bidirectional))  # the FFI call
    mixed = jax.jit(lambda a, b: _native.planar_states_mixed(a, b, bidirectional))
    xs = jax.block_until_ready(fwd(a, b))
    adj32 = jax.jit(lambda a, g, x: _native.planar_adjoint(a, g, x, bidirectional))
    adj16 = jax.jit(lambda a, g, x: _native.planar_adjoint(a, g, x, bidirectional, jnp.bfloat16))
    states, inputs = N * L * 2 * D * P, N * L * 2 * P
    return {
        "fp32 forward": (lambda: fwd(a, b), 4 * (inputs + states)),
        "mixed forward": (lambda: mixed(a, b), 4 * inputs + 6 * states),
        "fp32 adjoint": (lambda: adj32(a, g, xs), 4 * (2 * states + inputs)),
        "bf16 adjoint": (lambda: adj16(a, g, xs), 8 * states + 2 * inputs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--paper", action="store_true", help="the paper's batch and length")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="the kernels' threads (S5JAX_NATIVE_THREADS; default: the host's cores)",
    )  # fmt: skip
    parser.add_argument("--out", default="planar-scan", type=out_name)
    args = parser.parse_args()
    tasks = [t.strip() for t in args.configs.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            parser.error(f"--configs: {t!r} is not one of {', '.join(TASKS)}")
        if t == "pendulum":  # per-step Δ: `auto` runs the complex-array kernel there
            parser.error("--configs: pendulum's SSM (per-step Δ) does not run the planar kernels")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        os.environ["S5JAX_NATIVE_THREADS"] = str(args.threads)  # read by each kernel call
    if not _native.native_available():
        raise SystemExit(f"the native library is unavailable: {_native.native_build_error()}")
    info = device_info()
    print(f"{info['cpu_model']} ({info['cpu_family_model']}) | jax {info['jax']} | "
          f"threads {args.threads or 'auto'} | {_native.__file__}")  # fmt: skip
    rows = []
    for i, task in enumerate(tasks):
        c = config_shape(task, args.paper)
        fns = variants(c["N"], c["L"], c["P"], c["directions"] == 2, jax.random.PRNGKey(i))
        times = time_interleaved({k: f for k, (f, _) in fns.items()}, repeats=args.repeats)
        for name, (_, nbytes) in fns.items():
            t = times[name]["median_s"]
            rows.append({**c, "variant": name, "ms": t * 1e3, "min_ms": times[name]["min_s"] * 1e3,
                         "gb_per_s": nbytes / t / 1e9, "timing": times[name]})  # fmt: skip
    columns = [("task", "config", "s"), ("N", "N", "d"), ("L", "L", "d"), ("P", "P", "d"),
               ("directions", "dirs", "d"), ("variant", "variant", "s"), ("ms", "ms", ".3f"),
               ("min_ms", "min ms", ".3f"), ("gb_per_s", "GB/s", ".1f")]  # fmt: skip
    print_table(rows, columns)
    path = write_json(args.out, {
        "benchmark": "planar_scan", "device": info, "repeats": args.repeats,
        "threads": args.threads, "paper_shapes": args.paper, "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
