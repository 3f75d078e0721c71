"""C allocator tuning on CPU (`s5jax.configure_cpu_malloc`): the pendulum steps with and without.

The setting is process-wide and permanent, so each measurement runs in its own child process:
`tuned` calls `configure_cpu_malloc()` before JAX starts, `glibc default` sets
`S5JAX_MALLOC_TUNING=0`. Children alternate (tuned, default, tuned, …) for `--rounds` rounds;
each compiles the paper's pendulum training step (batch 32) and evaluation step (batch 50),
warms them up, then times `--repeats` calls of each, interleaved, and counts the minor page
faults per call. The parent reports the median over rounds of each child's median and the ratio.

    .venv/bin/python benchmarks/malloc.py [--rounds 3] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

MODES = {"tuned": "1", "glibc default": "0"}


def child(repeats: int) -> dict:
    import jax
    from _common import MALLOC_TUNED, time_interleaved  # tunes unless S5JAX_MALLOC_TUNING=0
    from pendulum import pendulum_steps

    from s5jax.config import load_experiment
    from s5jax.nn import build_model

    cfg = load_experiment("pendulum")
    model, state = build_model(cfg.model, d_input=576, n_outputs=2, key=jax.random.PRNGKey(0))
    train_step, eval_step = pendulum_steps(cfg, model, state)
    faults = {}

    def counted(name, fn):
        def call():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = jax.block_until_ready(fn())
            faults.setdefault(name, []).append(
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            )
            return out

        return call

    timings = time_interleaved(
        {"train step": counted("train step", train_step),
         "eval step": counted("eval step", eval_step)},
        repeats=repeats, warmup=2,
    )  # fmt: skip
    return {
        "applied": MALLOC_TUNED,
        "median_ms": {k: v["median_s"] * 1e3 for k, v in timings.items()},
        # the warm-up calls are in the lists too: report the timed calls only
        "minor_faults_per_call": {k: statistics.median(v[-repeats:]) for k, v in faults.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.repeats)))
        return

    from _common import device_info, write_json

    here = os.path.dirname(os.path.abspath(__file__))
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, flag in MODES.items():
            out = subprocess.run(
                [sys.executable, os.path.join(here, "malloc.py"), "--child",
                 "--repeats", str(args.repeats)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "S5JAX_MALLOC_TUNING": flag},
            ).stdout  # fmt: skip
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    if not runs["tuned"][0]["applied"]:
        print("configure_cpu_malloc() was not applied here (not Linux/glibc): nothing to compare")
    summary = {
        mode: {
            step: {
                "median_ms": statistics.median(r["median_ms"][step] for r in rs),
                "minor_faults_per_call": statistics.median(
                    r["minor_faults_per_call"][step] for r in rs
                ),
            }
            for step in ("train step", "eval step")
        }
        for mode, rs in runs.items()
    }
    print(f"{'allocator':14s} {'step':10s} {'median ms':>10s} {'faults/call':>12s}")
    for mode, steps in summary.items():
        for step, s in steps.items():
            faults = s["minor_faults_per_call"]
            print(f"{mode:14s} {step:10s} {s['median_ms']:10.1f} {faults:12.0f}")
    speedups = {
        step: summary["glibc default"][step]["median_ms"] / summary["tuned"][step]["median_ms"]
        for step in ("train step", "eval step")
    }
    for step, r in speedups.items():
        print(f"{step}: tuned {r:.2f}x faster than glibc's default")
    path = write_json("malloc", {
        "benchmark": "malloc", "device": device_info(), "rounds": args.rounds,
        "repeats": args.repeats, "shapes": {"train_batch": 32, "eval_batch": 50, "L": 50},
        "summary": summary, "speedup_tuned_vs_default": speedups, "runs": runs,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
