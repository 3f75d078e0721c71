"""Forward+backward time and peak memory of the paper's full S5 models against the App. A listing.

Shapes: the paper's runtime comparison (App. E.2, its "As in Table 11" rows): ListOps
L = 2048, Text L = 4096, Path-X L = 16384, each with its Table 11 architecture as loaded by
`s5jax.config.load_experiment(task)` and built by `s5jax.nn.build_model` (encoder, n_layers
sequence layers with BatchNorm, GLU, dropout, head), at the config's batch size (50, 50, 32)
unless `--batch` or `--quick` says otherwise. Inputs are random tokens (ListOps one-hot width
20, Text 135, full lengths) or random pixels (Path-X), with random labels.

Variants, for each task:
- `ours/remat=none|layers|ssm`: `jax.value_and_grad` of the training loss (mean NLL of the
  classification head; BatchNorm state threaded, dropout on) with respect to all parameters,
  the model built with `model.remat` set accordingly (see `s5jax.nn.S5Model`).
- `baseline`: the same number of layers of the paper's App. A listing (`base_stack` of
  `benchmarks/layer.py`, imported: ZOH, Λ̄ repeated L times, B̄u by a vmapped complex matmul,
  `jax.lax.associative_scan` over L×P elements forward and reversed, `(C̃x + Du).real`), with
  u + GELU(SSM(u)) per layer (no norm, no GLU, no encoder or head: less work than ours), on
  (batch, L, H) inputs, SSM parameters taken from our model's layers, `value_and_grad` of
  mean(y²).

Memory: `jax.jit(...).lower(...).compile().memory_analysis()`: `temp` (XLA's scratch: the
saved activations and the backward pass's temporaries) and `args` (parameters, state,
inputs); `temp + args` is the compiled step's footprint. Where the device reports
`memory_stats()` (GPU), each variant also runs once in a fresh process that reports
`peak_bytes_in_use`.

Time: the compiled steps of one task are called round-robin (`_common.time_interleaved`);
medians of `--repeats`; ratios between medians of the same run.

XLA's CPU scheduler: by default (`xla_cpu_enable_concurrency_optimized_scheduler`) it runs
the recomputation of rematerialised layers early, next to the forward pass, which cancels
their memory saving. This script turns that option off (XLA_FLAGS, before JAX starts) unless
`--xla-default-scheduler` is given; the flag only concerns the CPU compiler, and the value
used is recorded in the JSON.

`--memory-only` compiles and reports memory without running anything (so the paper's batch
sizes are cheap on CPU too). Results go to
`results/model[-memory][-xla-default-scheduler]-<cpu|gpu>.json`.

    .venv/bin/python benchmarks/model.py [--quick] [--tasks listops,text,pathx] [--batch N]
        [--remat none,layers,ssm] [--repeats N] [--no-baseline] [--memory-only]
        [--xla-default-scheduler]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # XLA reads its flags once, when the backend starts
    if "--xla-default-scheduler" not in sys.argv and "--child" not in sys.argv:
        flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
        if "concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    # Peak memory on GPU is measured per variant in child processes: the parent must not
    # hold the default 75 % preallocation meanwhile.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import dataclasses
import json
import subprocess

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import device_info, print_table, time_interleaved, write_json
from layer import base_params, base_step  # the App. A baseline (not copied)

from s5jax.config import load_experiment
from s5jax.nn import build_model
from s5jax.train._steps import per_example_loss

# Inputs of the prepared datasets: one-hot width of the token tasks (the authors'; see
# `s5jax.train._engine._model_inputs`), features per step otherwise, and classes.
TASKS = {
    "listops": {"vocab": 20, "d_input": 20, "n_classes": 10},
    "text": {"vocab": 135, "d_input": 135, "n_classes": 2},
    "pathx": {"vocab": None, "d_input": 1, "n_classes": 2},
}
REMATS = ("none", "layers", "ssm")
MB = 2**20


def task_shapes(task: str, batch: int | None) -> dict:
    cfg = load_experiment(task)
    m = cfg.model
    return {
        "task": task, "L": cfg.data.seq_len, "batch": batch or cfg.data.batch_size,
        "paper_batch": cfg.data.batch_size, "n_layers": m.n_layers, "H": m.d_model,
        "P_full": m.ssm_size, "P_stored": m.state_size, "J": m.blocks,
        "bidirectional": m.bidirectional, "conj_sym": m.conj_sym, "activation": m.activation,
        "norm": m.norm, "dropout": m.dropout, "encoder": m.encoder, "pooling": m.pooling,
        **TASKS[task], "dtype": "float32 / complex64",
    }  # fmt: skip


def build_variant(task: str, variant: str, batch: int | None):
    """`(jitted step, args)` of one variant; the step returns (value, grads)."""
    cfg = load_experiment(task)
    spec, shapes = TASKS[task], task_shapes(task, batch)
    B, L = shapes["batch"], shapes["L"]
    remat = variant.split("=", 1)[1] if variant.startswith("ours") else "none"
    model, state = build_model(
        dataclasses.replace(cfg.model, remat=remat), d_input=spec["d_input"],
        n_outputs=spec["n_classes"], vocab=spec["vocab"], key=jax.random.PRNGKey(0),
    )  # fmt: skip
    kx, ky, ku = jax.random.split(jax.random.PRNGKey(1), 3)
    if variant == "baseline":
        params = [base_params(layer.ssm) for layer in model.layers]
        u = jax.random.normal(ku, (B, L, shapes["H"]), jnp.float32)
        return jax.jit(base_step), (params, u)

    if spec["vocab"]:
        x = jax.random.randint(kx, (B, L), 0, spec["vocab"], jnp.int32)
    else:
        x = jax.random.normal(kx, (B, L, spec["d_input"]), jnp.float32)
    data = {
        "x": x,
        "y": jax.random.randint(ky, (B,), 0, spec["n_classes"], jnp.int32),
        "lengths": jnp.full((B,), L, jnp.int32),
    }
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss(params, state, data, key):
        net = eqx.combine(params, static)
        keys = jax.random.split(key, data["y"].shape[0])
        out, state = jax.vmap(
            lambda x, k, n: net(x, state, key=k, lengths=n), axis_name="batch",
            out_axes=(0, None),
        )(data["x"], keys, data["lengths"])  # fmt: skip
        nll = jax.vmap(lambda o, y: per_example_loss("classification", o, y)[0])(out, data["y"])
        return jnp.mean(nll), state

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    return step, (params, state, data, jax.random.PRNGKey(2))


def memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    names = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
             "alias_size_in_bytes", "generated_code_size_in_bytes")  # fmt: skip
    out = {k: getattr(stats, k, None) for k in names} if stats is not None else {}
    if out.get("temp_size_in_bytes") is not None and out.get("argument_size_in_bytes") is not None:
        out["temp_plus_args_bytes"] = out["temp_size_in_bytes"] + out["argument_size_in_bytes"]
    return out


def peak_in_child(task: str, variant: str, batch: int) -> dict:
    """Run one variant once in a fresh process; its device's `peak_bytes_in_use`."""
    cmd = [sys.executable, __file__, "--child", task, variant, "--batch", str(batch)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def child(task: str, variant: str, batch: int) -> None:
    step, args = build_variant(task, variant, batch)
    jax.block_until_ready(step(*args))
    stats = jax.local_devices()[0].memory_stats() or {}
    print(json.dumps({"peak_bytes_in_use": stats.get("peak_bytes_in_use")}))


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """`--tasks` and `--remat`, shared with compile.py."""
    parser.add_argument("--tasks", default="listops,text,pathx")
    parser.add_argument("--remat", default="none,layers,ssm")


def parse_task_arguments(parser, args) -> tuple[list[str], list[str]]:
    """The validated task and remat lists of `add_task_arguments`."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    remats = [r.strip() for r in args.remat.split(",") if r.strip()]
    for t in tasks:
        if t not in TASKS:
            parser.error(f"--tasks: {t!r} is not one of {tuple(TASKS)}")
    for r in remats:
        if r not in REMATS:
            parser.error(f"--remat: {r!r} is not one of {REMATS}")
    return tasks, remats


def print_header(info: dict) -> str:
    """Print the device line; returns the XLA_FLAGS in effect (recorded in the JSON)."""
    xla_flags = os.environ.get("XLA_FLAGS", "")
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | "
          f"{info['device_kind']} | jax {info['jax']} | XLA_FLAGS={xla_flags!r}")  # fmt: skip
    return xla_flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1, 2 repeats")
    add_task_arguments(parser)
    parser.add_argument("--batch", type=int, default=None, help="default: the config's")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--memory-only", action="store_true",
                        help="compile and report memory only (no timing, no GPU peak)")  # fmt: skip
    parser.add_argument("--xla-default-scheduler", action="store_true",
                        help="keep XLA's default CPU scheduler (see the docstring)")  # fmt: skip
    parser.add_argument("--child", nargs=2, metavar=("TASK", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args.batch)

    batch = args.batch or (1 if args.quick else None)
    repeats = args.repeats or (2 if args.quick else 5)
    tasks, remats = parse_task_arguments(parser, args)
    variants = ([] if args.no_baseline else ["baseline"]) + [f"ours/remat={r}" for r in remats]
    info = device_info()
    has_peak = jax.local_devices()[0].memory_stats() is not None
    xla_flags = print_header(info)

    results, rows = [], []
    for task in tasks:
        shapes = task_shapes(task, batch)
        print(f"\n{task}: L {shapes['L']}, batch {shapes['batch']} "
              f"(paper {shapes['paper_batch']}), {shapes['n_layers']} layers, H {shapes['H']}, "
              f"P {shapes['P_full']} ({shapes['P_stored']} stored), J {shapes['J']}",
              flush=True)  # fmt: skip
        peaks = {}
        if has_peak and not args.memory_only:
            peaks = {v: peak_in_child(task, v, shapes["batch"]) for v in variants}
        fns, mem, errors = {}, {}, {}
        for v in variants:
            try:
                step, step_args = build_variant(task, v, batch)
                compiled = step.lower(*step_args).compile()
                mem[v] = memory(compiled)
                if not args.memory_only:  # the warm-up call, here to catch running out of memory
                    jax.block_until_ready(compiled(*step_args))
                fns[v] = lambda c=compiled, a=step_args: c(*a)
            except Exception as e:  # e.g. out of memory on an accelerator: record, go on
                errors[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                print(f"  {v}: {errors[v]}", flush=True)
        times = {}
        if fns and not args.memory_only:
            times = time_interleaved(fns, repeats=repeats, warmup=0)
        base_t = times.get("baseline", {}).get("median_s")
        base_m = mem.get("baseline", {}).get("temp_plus_args_bytes")
        for v in variants:
            if v not in mem:
                continue
            t, m = times.get(v, {}).get("median_s"), mem[v]
            peak = peaks.get(v, {}).get("peak_bytes_in_use")
            rows.append({
                "task": task, "L": shapes["L"], "batch": shapes["batch"], "variant": v,
                "ms": t * 1e3 if t else None, "speedup": base_t / t if t and base_t else None,
                "temp_mb": (m.get("temp_size_in_bytes") or 0) / MB,
                "total_mb": (m.get("temp_plus_args_bytes") or 0) / MB,
                "mem_ratio": (m.get("temp_plus_args_bytes") or 0) / base_m if base_m else None,
                "peak_mb": peak / MB if peak else None,
            })  # fmt: skip
        results.append({"shapes": shapes, "memory": mem, "timings": times, "gpu_peak": peaks,
                        "errors": errors})  # fmt: skip

    print()
    print_table(rows, [
        ("task", "task", "s"), ("L", "L", "d"), ("batch", "B", "d"), ("variant", "variant", "s"),
        ("ms", "median ms", ".0f"), ("speedup", "base/ours time", ".2f"),
        ("temp_mb", "temp MiB", ".0f"), ("total_mb", "temp+args MiB", ".0f"),
        ("mem_ratio", "mem / base", ".2f"), ("peak_mb", "GPU peak MiB", ".0f"),
    ])  # fmt: skip
    suffix = "-memory" if args.memory_only else ""
    suffix += "-xla-default-scheduler" if args.xla_default_scheduler else ""
    path = write_json("model" + suffix, {
        "benchmark": "model", "quick": args.quick, "memory_only": args.memory_only,
        "device": info, "xla_flags": xla_flags,
        "repeats": repeats, "variants": variants, "loss": {
            "ours": "value_and_grad of mean NLL (classification head), BatchNorm state, dropout",
            "baseline": "value_and_grad of mean(y^2) of the App. A layer stack (layer.py)"},
        "tasks": results, "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
