"""Whole `s5jax` commands with and without the compilation cache (s5jax/_cache.py).

Each command is a fresh process, as a user runs it: `s5jax eval RUN`, `s5jax predict RUN` and
a one-epoch `s5jax train EXPERIMENT`, timed end to end (import, data, compile, steps, writing)
with `S5JAX_COMPILATION_CACHE=0` (every program compiled) and with a cache that an earlier
process filled (every program loaded), alternating, `--repeats` rounds. The run they read is
trained first, one epoch, which also fills the cache. The native kernel is built before the
timings (it has its own cache, `$S5JAX_CACHE_DIR`).

    .venv/bin/python benchmarks/compile_cache.py [--experiment pendulum] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import device_info, print_table, write_json

S5JAX = [sys.executable, "-m", "s5jax"]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*S5JAX, *argv], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="pendulum")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "S5JAX_COMP"))}
    with tempfile.TemporaryDirectory(prefix="s5jax-compile-cache-") as tmp:
        work = Path(tmp)
        on = {**base, "JAX_COMPILATION_CACHE_DIR": str(work / "xla")}
        off = {**base, "S5JAX_COMPILATION_CACHE": "0"}
        one_epoch = ["--set", "train.epochs=1", "--no-progress"]
        run = work / "run"
        subprocess.run([*S5JAX, "train", args.experiment, "--workdir", str(run), *one_epoch],
                       env=on, check=True, capture_output=True)  # fmt: skip
        commands = {
            "eval": lambda tag, r: ["eval", str(run)],
            "predict": lambda tag, r: [
                "predict",
                str(run),
                "--out",
                str(work / f"{tag}.npz"),
                "--no-progress",
            ],
            "train 1 epoch": lambda tag, r: [
                "train",
                args.experiment,
                "--workdir",
                str(work / f"t-{tag}-{r}"),
                *one_epoch,
            ],
        }
        times: dict[str, dict[str, list[float]]] = {c: {"off": [], "on": []} for c in commands}
        for r in range(args.repeats):
            for name, argv in commands.items():
                for tag, env in (("off", off), ("on", on)):
                    times[name][tag].append(_timed(argv(tag, r), env))
        cache_bytes = sum(p.stat().st_size for p in (work / "xla").iterdir())
    rows = []
    for name, t in times.items():
        off_s, on_s = statistics.median(t["off"]), statistics.median(t["on"])
        rows.append({"command": name, "off_s": off_s, "on_s": on_s, "ratio": off_s / on_s,
                     "off_all_s": t["off"], "on_all_s": t["on"]})  # fmt: skip
    print_table(rows, [("command", "command", "s"), ("off_s", "no cache s", ".2f"),
                       ("on_s", "warm cache s", ".2f"), ("ratio", "off / on", ".2f")])  # fmt: skip
    print(f"cache folder: {cache_bytes / 2**20:.1f} MiB")
    path = write_json(
        "compile-cache",
        {"experiment": args.experiment, "repeats": args.repeats, "device": device_info(),
         "cache_bytes": cache_bytes, "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
