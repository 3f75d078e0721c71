"""Compile time of the paper's training step for the runtime shapes (App. E.2).

For ListOps (L = 2048), Text (L = 4096) and Path-X (L = 16384), each with its Table 11
architecture (`s5jax.config.load_experiment`, `s5jax.nn.build_model`) and the config's batch
size (50, 50, 32; `--batch` overrides): the jitted training step of `s5jax.train` (`make_steps`
with the config's optimiser from `build_optimizer`: forward, backward, gradient norm, optimiser
update) is traced and lowered (`jax.jit(...).lower`) and compiled (`.compile()`) from abstract
inputs (`jax.ShapeDtypeStruct`; nothing of batch size is allocated), for `model.remat` none,
layers and ssm. Each repeat builds a fresh step function, so nothing is reused from a cache.
Also recorded: the compiled step's `memory_analysis()` (temp and argument bytes).

As in `model.py`, XLA's concurrency-optimised CPU scheduler is switched off (XLA_FLAGS, set
before JAX starts) unless `--xla-default-scheduler` (results then go to
`compile-xla-default-scheduler-*.json`); the value used is in the JSON.

    .venv/bin/python benchmarks/compile.py [--quick] [--tasks listops,text,pathx]
        [--remat none,layers,ssm] [--batch N] [--repeats N] [--xla-default-scheduler]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--xla-default-scheduler" not in sys.argv:
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    if "concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()

import argparse
import dataclasses
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import device_info, print_table, write_json
from model import TASKS, add_task_arguments, memory, parse_task_arguments, print_header, task_shapes

from s5jax.config import load_experiment
from s5jax.nn import build_model
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps

MB = 2**20


def abstract_inputs(task: str, batch: int | None):
    """`(shapes, batch)` of one task; the batch holds `jax.ShapeDtypeStruct`s."""
    shapes = task_shapes(task, batch)
    B, L = shapes["batch"], shapes["L"]
    spec = TASKS[task]
    if spec["vocab"]:
        data = {
            "x": jax.ShapeDtypeStruct((B, L), jnp.int32),
            "lengths": jax.ShapeDtypeStruct((B,), jnp.int32),
        }
    else:
        data = {"x": jax.ShapeDtypeStruct((B, L, spec["d_input"]), jnp.float32)}
    data["y"] = jax.ShapeDtypeStruct((B,), jnp.int32)
    data["mask"] = jax.ShapeDtypeStruct((B,), jnp.bool_)
    return shapes, data


def compile_once(task: str, remat: str, data) -> dict:
    cfg = load_experiment(task)
    spec = TASKS[task]
    model, state = build_model(
        dataclasses.replace(cfg.model, remat=remat), d_input=spec["d_input"],
        n_outputs=spec["n_classes"], vocab=spec["vocab"], key=jax.random.PRNGKey(0),
    )  # fmt: skip
    optimizer, _ = build_optimizer(cfg.optim, model, steps_per_epoch=100, epochs=cfg.train.epochs)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    steps = make_steps(static, optimizer, cfg.model.head)  # a fresh jax.jit each call
    t0 = time.perf_counter()
    lowered = steps.train.lower(params, state, opt_state, data, jax.random.PRNGKey(1))
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return {"lower_s": t1 - t0, "compile_s": t2 - t1, "memory": memory(compiled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    add_task_arguments(parser)
    parser.add_argument("--batch", type=int, default=None, help="default: the config's")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--xla-default-scheduler", action="store_true")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    tasks, remats = parse_task_arguments(parser, args)
    info = device_info()
    xla_flags = print_header(info)

    rows, results = [], []
    for task in tasks:
        shapes, data = abstract_inputs(task, args.batch)
        runs = {}
        # Round-robin over the remat variants, as `_common.time_interleaved` does for runs.
        for _ in range(repeats):
            for r in remats:
                runs.setdefault(r, []).append(compile_once(task, r, data))
        for r in remats:
            lower = statistics.median(x["lower_s"] for x in runs[r])
            comp = statistics.median(x["compile_s"] for x in runs[r])
            mem = runs[r][-1]["memory"]
            rows.append({
                "task": task, "L": shapes["L"], "batch": shapes["batch"], "remat": r,
                "lower": lower, "compile": comp, "total": lower + comp,
                "temp_mb": (mem.get("temp_size_in_bytes") or 0) / MB,
                "args_mb": (mem.get("argument_size_in_bytes") or 0) / MB,
            })  # fmt: skip
            print(f"  {task} remat={r}: lower {lower:.1f} s, compile {comp:.1f} s", flush=True)
        results.append({"shapes": shapes, "runs": runs})

    print_table(rows, [
        ("task", "task", "s"), ("L", "L", "d"), ("batch", "B", "d"), ("remat", "remat", "s"),
        ("lower", "trace+lower s", ".1f"), ("compile", "compile s", ".1f"),
        ("total", "total s", ".1f"), ("temp_mb", "temp MiB", ".0f"), ("args_mb", "args MiB", ".0f"),
    ])  # fmt: skip
    suffix = "-xla-default-scheduler" if args.xla_default_scheduler else ""
    path = write_json("compile" + suffix, {
        "benchmark": "compile", "quick": args.quick, "device": info, "xla_flags": xla_flags,
        "repeats": repeats, "step": "s5jax.train._steps.make_steps(...).train (jit, donated)",
        "tasks": results, "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
