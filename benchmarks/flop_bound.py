"""The largest training-step ratio our matrix products allow on this host, beside the measured one.

Issue 20 asks for our whole training step ≥ 5× the authors' on the paper configs with P ≥ 128.
Whatever the scans, norms and elementwise work cost, our step cannot take less time than its
matrix products at the host's arithmetic peak. This benchmark measures, in one run:

- **the peak** (`fma_peak.cc`, compiled here with the package's C++ compiler and
  `-march=native`, run on every core at once): float32 fused multiply-adds in the widest vector
  registers, and bfloat16 pairs into float32 (AVX512_BF16's VDPBF16PS) where the build has it
  and the host has no AMX tiles (with AMX the bfloat16 peak is the tiles', not probed: None).
  The best of three runs of about half a second each.
- **XLA's best product rate**: a square product (n × n · n × n, n = 2,048 and 4,096, float32,
  and bfloat16 operands with float32 sums), the fastest median: what this host's products
  reach at their most favourable shape.
- **the products of our step** (`product_flops`): the step `s5jax train` runs
  (`train_step.build_ours`, `scan_method = "auto"`, float32), traced (not run), and every
  matrix product in it counted: XLA's `dot_general`s (2 FLOP per multiply-add, batch dims
  included) and the native weight gradients (`s5jax_weight_gradient`, aᵀg, and
  `s5jax_column_dot`, Σ (x − m) ⊙ g over the rows: D's and BatchNorm's). Scans, norms and
  elementwise work are not counted, so the count is a lower bound on the step's arithmetic.
- **the steps**: ours in float32 and in bfloat16 (`model.precision = "bf16"`) and the
  authors' (`baseline_model.py`), each in a process of its own, called in turn
  (`train_step.time_isolated`, the protocol of `train_step.py --isolate`), medians.

Per config and precision: `products_ms` = our products' FLOPs / the peak (a hard lower bound
on our step on this host, and on any implementation that computes those products);
`bound` = baseline / `products_ms`, the largest ratio our step could reach here; `bound_xla` the
same at XLA's best product rate (the bound if no product of ours ran faster than XLA's best);
`ratio` = baseline / ours, measured. Where `bound` < 5 the issue's 5× cannot be met on this
host in that precision without fewer FLOPs, however fast everything else gets.

    .venv/bin/python benchmarks/flop_bound.py [--configs text,image,...] [--repeats N]
        [--batch N] [--length N] [--paper] [--out NAME]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from _common import device_info, out_name, print_table, time_interleaved, write_json
from train_step import TASKS, build_ours, random_batch, shapes, time_isolated

from s5jax.config import load_experiment
from s5jax.core import _native

HERE = Path(__file__).resolve().parent
PROBE = HERE / "fma_peak.cc"
TARGET = 5.0  # issue 20's ratio for P >= 128
DEFAULT_CONFIGS = ("text", "retrieval", "image", "pathfinder", "pathx", "speech", "smnist",
                   "psmnist", "scifar")  # fmt: skip  # the paper configs with P >= 128
WEIGHT_GRADIENT = "s5jax_weight_gradient"
COLUMN_DOT = "s5jax_column_dot"


# --- counting a step's products ---------------------------------------------------------------


def _dot_flops(eqn) -> int:
    """2 × multiply-adds of one `dot_general`: the lhs's size times the rhs's free dims."""
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
    taken = set(rhs_contract) | set(rhs_batch)
    free = math.prod(d for i, d in enumerate(rhs) if i not in taken)
    return 2 * math.prod(lhs) * free


def _weight_gradient_flops(eqn) -> int:
    """2 × multiply-adds of the native aᵀg: a (R, m), g (R, n) → (m, n)."""
    a, g = (v.aval.shape for v in eqn.invars[:2])
    return 2 * math.prod(a) * g[-1]


def _column_dot_flops(eqn) -> int:
    """2 × multiply-adds of the native Σ_r (x − m) ⊙ g (D's gradient, BatchNorm's centred
    sum): one per element of x."""
    return 2 * math.prod(eqn.invars[0].aval.shape)


def _sub_jaxprs(eqn):
    """The jaxprs nested in an equation's parameters (calls, custom rules' primal, loops)."""
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "eqns"):
                yield v
            elif hasattr(getattr(v, "jaxpr", None), "eqns"):
                yield v.jaxpr


def product_flops(jaxpr) -> dict:
    """FLOPs of the matrix products in `jaxpr` (a `jax.make_jaxpr` result or a core Jaxpr),
    nested calls included: {"dot_general", "weight_gradient", "total", "unbounded_loops"}.
    A `scan` body counts `length` times; of a `cond`'s branches the cheapest counts (one runs,
    and a lower bound must not assume the dearer); a `while` body counts once and is reported in
    `unbounded_loops` (its trip count is not in the program)."""
    out = {"dot_general": 0, "weight_gradient": 0, "unbounded_loops": 0}

    def walk(j, times: int) -> dict:
        counts = {"dot_general": 0, "weight_gradient": 0}
        for eqn in j.eqns:
            name = eqn.primitive.name
            if name == "dot_general":
                counts["dot_general"] += times * _dot_flops(eqn)
            elif name == "ffi_call" and eqn.params.get("target_name") == WEIGHT_GRADIENT:
                counts["weight_gradient"] += times * _weight_gradient_flops(eqn)
            elif name == "ffi_call" and eqn.params.get("target_name") == COLUMN_DOT:
                counts["weight_gradient"] += times * _column_dot_flops(eqn)
            subs = list(_sub_jaxprs(eqn))
            if name == "cond":
                branches = [walk(b, times) for b in subs]
                cheapest = min(branches, key=lambda c: sum(c.values()), default=None)
                for k in counts:
                    counts[k] += cheapest[k] if cheapest else 0
                continue
            if name == "while":
                out["unbounded_loops"] += 1
            inner = times * (eqn.params.get("length", 1) if name == "scan" else 1)
            for sub in subs:
                for k, v in walk(sub, inner).items():
                    counts[k] += v
        return counts

    counts = walk(getattr(jaxpr, "jaxpr", jaxpr), 1)
    out.update(counts)
    out["total"] = counts["dot_general"] + counts["weight_gradient"]
    return out


def step_flops(task: str, s: dict) -> dict:
    """`product_flops` of our float32 training step for `task` at shapes `s` (traced only)."""
    _, step, carry = build_ours(load_experiment(task), s, "auto")
    batch = random_batch(task, s, jax.random.PRNGKey(1))
    return product_flops(jax.make_jaxpr(step)(*carry, batch, jax.random.PRNGKey(2)))


# --- the host's peak and XLA's best product rate ---------------------------------------------


def build_probe(directory: Path) -> Path | None:
    """`fma_peak.cc` compiled into `directory`, or None without a C++ compiler; RuntimeError
    where it does not compile (a host without AVX2 and FMA)."""
    cxx = _native._compiler()
    if cxx is None:
        return None
    exe = directory / "fma_peak"
    built = subprocess.run(
        [cxx, "-O2", "-std=c++17", "-march=native", "-pthread", str(PROBE), "-o", str(exe)],
        capture_output=True, text=True,
    )  # fmt: skip
    if built.returncode != 0:
        lines = (built.stderr or built.stdout).strip().splitlines() or ["(no output)"]
        raise RuntimeError(f"{PROBE.name} did not compile with {cxx}: {lines[0]}")
    return exe


def _probe(exe: Path, kind: str, threads: int, iterations: int) -> tuple[float, float] | None:
    """(seconds, GFLOP/s) of one probe run, None where the build has no `kind`; RuntimeError
    (its first line of output) if the probe fails."""
    run = subprocess.run([str(exe), kind, str(threads), str(iterations)], capture_output=True,
                         text=True)  # fmt: skip
    out = run.stdout.split()
    if run.returncode != 0 or not out:
        lines = (run.stderr or run.stdout).strip().splitlines() or [f"exit {run.returncode}"]
        raise RuntimeError(f"{PROBE.name} failed: {lines[0]}")
    return None if out[0] == "none" else (float(out[0]), float(out[1]))


def measure_peak(exe: Path, threads: int, runs: int = 3, seconds: float = 0.5) -> dict:
    """GFLOP/s at the peak: {"fp32": best of `runs`, "bf16": same or None, "runs": all}.
    bf16 is None where the build has no AVX512_BF16, and where the host has AMX tiles (their
    peak is far above the vector unit's and is not probed)."""
    peak, every = {}, {}
    amx = _native.native_host_has_amx()
    for kind, name in (("f", "fp32"), ("b", "bf16")):
        first = None if (name == "bf16" and amx) else _probe(exe, kind, threads, 10_000_000)
        if first is None:
            peak[name], every[name] = None, []
            continue
        iterations = max(1, int(10_000_000 * seconds / max(first[0], 1e-3)))
        every[name] = [_probe(exe, kind, threads, iterations)[1] for _ in range(runs)]
        peak[name] = max(every[name])
    return {**peak, "runs": every, "threads": threads}


def xla_product_rate(sizes=(2048, 4096), repeats: int = 5) -> dict:
    """GFLOP/s of XLA's square products (float32; bfloat16 operands, float32 sums): the best
    median over `sizes`, and every size's."""
    rates = {"fp32": {}, "bf16": {}}
    dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    for n in sizes:
        k1, k2 = jax.random.split(jax.random.PRNGKey(n))
        a, b = jax.random.normal(k1, (n, n)), jax.random.normal(k2, (n, n))
        a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        fns = {"fp32": functools.partial(dot, a, b), "bf16": functools.partial(dot, a16, b16)}
        times = time_interleaved(fns, repeats=repeats)
        for p in rates:
            rates[p][n] = 2 * n**3 / times[p]["median_s"] / 1e9
    return {p: max(r.values()) for p, r in rates.items()} | {"per_size": rates}


# --- the run ----------------------------------------------------------------------------------


def bound_row(task, s, flops, base_ms, ours_ms, peak, xla, precision) -> dict:
    """One config's row for `precision`: products at the peak, the bounds, the measured ratio."""
    row = {"task": task, "precision": precision, "batch": s["batch"], "L": s["L"],
           "P": s["P_full"], "gflop": flops / 1e9, "base_ms": base_ms, "ours_ms": ours_ms,
           "ratio": base_ms / ours_ms}  # fmt: skip
    rate = peak.get(precision)
    row["products_ms"] = flops / rate / 1e6 if rate else None
    row["bound"] = base_ms / row["products_ms"] if rate else None
    row["products_xla_ms"] = flops / xla[precision] / 1e6
    row["bound_xla"] = base_ms / row["products_xla_ms"]
    row["budget_ms"] = base_ms / TARGET
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each step")
    parser.add_argument("--batch", type=int, default=None, help="cap on every config's batch")
    parser.add_argument("--length", type=int, default=None, help="cap on every sequence length")
    parser.add_argument("--paper", action="store_true", help="the paper's batch and length")
    parser.add_argument(
        "--out", default="flop-bound", type=out_name, help="results/<OUT>-<cpu|gpu>.json"
    )
    args = parser.parse_args()
    tasks = [t.strip() for t in args.configs.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            parser.error(f"--configs: {t!r} is not one of {', '.join(TASKS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    if info["backend"] != "cpu":
        parser.error("the peak probe is an x86 CPU program: run this on a CPU backend")
    threads = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            exe = build_probe(Path(tmp))
        except RuntimeError as error:
            parser.error(str(error))
        if exe is None:
            parser.error("no C++ compiler for the peak probe (set $CXX or install g++)")
        try:
            peak = measure_peak(exe, threads)
        except RuntimeError as error:
            parser.error(str(error))
    xla = xla_product_rate()
    bf16_peak = f"{peak['bf16']:.0f}" if peak["bf16"] else "not probed (no AVX512_BF16, or AMX)"
    print(f"peak GFLOP/s on {threads} threads: fp32 {peak['fp32']:.0f}, bf16 "
          f"{bf16_peak}; XLA's best product: fp32 {xla['fp32']:.0f}, "
          f"bf16 {xla['bf16']:.0f} ({100 * xla['fp32'] / peak['fp32']:.0f} % of the fp32 "
          "peak)", flush=True)  # fmt: skip

    rows, results = [], []
    for task in tasks:
        s = shapes(task, args.batch, args.length, args.paper)
        flops = step_flops(task, s)
        print(f"{task}: batch {s['batch']}, L {s['L']}: {flops['total'] / 1e9:.1f} GFLOP of "
              "products per step", flush=True)  # fmt: skip
        times, _ = time_isolated(task, s, ("auto",), False, False, ("fp32", "bf16"), args.repeats)
        base_ms = times["baseline"]["median_s"] * 1e3
        for p in ("fp32", "bf16"):
            ours_ms = times[f"ours[auto/{p}]"]["median_s"] * 1e3
            row = bound_row(task, s, flops["total"], base_ms, ours_ms, peak, xla, p)
            rows.append(row)
            bound = (
                f"products at the peak {row['products_ms']:.0f} ms: bound {row['bound']:.2f}x"
                if row["products_ms"]
                else "no peak probed for this precision"
            )
            print(f"  {p}: ours {ours_ms:.0f} ms, baseline {base_ms:.0f} ms: {row['ratio']:.2f}x"
                  f"; {bound}", flush=True)  # fmt: skip
        results.append({"task": task, "shapes": s, "flops": flops, "timings": times})
        path = write_json(args.out, {
            "benchmark": "flop_bound", "device": info, "repeats": args.repeats,
            "target": TARGET, "threads": threads, "peak_gflops": peak,
            "xla_product_gflops": xla, "load_average_1_5_15": os.getloadavg(),
            "protocol": "peak: fma_peak.cc on every core, best of 3; steps: one process each "
                        "(train_step.time_isolated), medians; ratio = baseline / ours; bound = "
                        "baseline / (product FLOPs / peak)",
            "results": results, "rows": rows,
        })  # fmt: skip  # after every config: a partial run keeps what it measured
    print()
    print_table(rows, [
        ("task", "config", "s"), ("precision", "prec", "s"), ("gflop", "GFLOP", ".1f"),
        ("base_ms", "baseline ms", ".0f"), ("ours_ms", "ours ms", ".0f"),
        ("ratio", "ratio", ".2f"), ("products_ms", "products@peak ms", ".0f"),
        ("bound", "bound", ".2f"), ("bound_xla", "bound@XLA", ".2f"),
        ("budget_ms", f"{TARGET:g}x budget ms", ".0f"),
    ])  # fmt: skip
    shares = [r["products_ms"] / r["ours_ms"] for r in rows if r["products_ms"]]
    if shares:
        print(f"products at the peak / our step, median over rows: {statistics.median(shares):.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
