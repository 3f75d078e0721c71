"""Compiled memory of our whole training step per SSM method, at the paper's shapes.

For each config (`s5jax.config.load_experiment(task)`) and each `--methods` entry
(`model.scan_method`): the step `s5jax train` runs (`s5jax.train._steps.make_steps`, built as
in `train_step.py`) is lowered for the task's input shapes (the paper's batch and length
unless `--batch` / `--length` cap them) and compiled, nothing run, and XLA's
`memory_analysis()` is recorded: `temp` (scratch: the saved activations and the backward
pass's temporaries), `args` (parameters, BatchNorm state, optimiser state, batch) and
`temp + args`, the step's footprint. Also recorded per config: the stored states of one
sequence in one layer (L × P × directions, P the stored complex states per direction) and
what `"auto"` resolves to for it on this backend (`train_step.auto_method`; the pendulum's
per-step Δ never runs the fused path).

Why: on CPU `"auto"` picks a scan (`"native"` where the C++ kernel builds, else `"chunked"`)
for speed but `"fused"` above
`s5jax.core._ssm.AUTO_CPU_FUSED_ABOVE` stored states per sequence, for memory; this script
is the measurement behind that threshold. Compiling the paper's Path-X step takes about a
minute per method on 2 cores and needs no more memory than the compiler's.

`--baseline` adds the authors' model's step (`baseline_model.py`, built as `train_step.py`
times it, one-hot float inputs included) as one more column: whether both steps fit a host's
memory at the paper's batch, which `train_step.py --paper` needs before it runs them. The
figures are a lower bound on a run's resident memory: leave 15-40 % headroom (Retrieval at
batch 24, baseline compiled at 16.7 GiB, was killed at 23 GiB resident on a 24 GiB host).

    .venv/bin/python benchmarks/train_step_memory.py [--configs pathx,speech,...]
        [--methods chunked,fused,auto] [--baseline] [--batch N] [--length N]

Results: `results/train-step-memory-<cpu|gpu>.json`.
"""

from __future__ import annotations

import argparse
import time

import baseline_model as base
import jax
from _common import device_info, out_name, print_table, write_json
from train_step import (
    TASKS,
    auto_method,
    build_baseline,
    build_ours,
    parse_configs_and_methods,
    random_batch,
    shapes,
)

from s5jax.config import load_experiment
from s5jax.core._ssm import AUTO_CPU_FUSED_ABOVE

GIB = 2**30
BASELINE = "baseline"


def compiled_memory(task: str, s: dict, method: str, cfg=None) -> dict:
    """`memory_analysis()` of our compiled training step, or of the authors' model's
    (`baseline_model.py`, as `train_step.py` times it) for `method == BASELINE`. `cfg`: the
    experiment's config (default: `load_experiment(task)`)."""
    cfg = cfg if cfg is not None else load_experiment(task)
    model, step, carry = build_ours(cfg, s, "chunked" if method == BASELINE else method,
                                    init=jax.eval_shape)  # fmt: skip
    batch = jax.eval_shape(lambda: random_batch(task, s, jax.random.PRNGKey(1)))
    if method == BASELINE:
        spec, step, carry = build_baseline(cfg, model, carry[1], init=jax.eval_shape)
        concrete = random_batch(task, s, jax.random.PRNGKey(1))
        batch = jax.eval_shape(lambda: base.model_inputs(spec, concrete))
    compiled = step.lower(*carry, batch, jax.random.PRNGKey(2)).compile()
    stats = compiled.memory_analysis()
    temp, args = stats.temp_size_in_bytes, stats.argument_size_in_bytes
    out = {"temp_bytes": temp, "args_bytes": args, "temp_plus_args_bytes": temp + args}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(TASKS))
    parser.add_argument("--methods", default="chunked,fused,auto")
    parser.add_argument("--batch", type=int, default=None, help="cap on every config's batch")
    parser.add_argument("--length", type=int, default=None, help="cap on every sequence length")
    parser.add_argument(
        "--baseline", action="store_true",
        help="also the authors' model's step (baseline_model.py, as train_step.py times it)",
    )  # fmt: skip
    parser.add_argument(
        "--out", default="train-step-memory", type=out_name, help="results/<OUT>-<cpu|gpu>.json"
    )
    args = parser.parse_args()
    tasks, methods = parse_configs_and_methods(parser, args)
    methods = methods + ((BASELINE,) if args.baseline else ())
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")

    results, rows = [], []
    for task in tasks:
        s = shapes(task, args.batch, args.length, paper=True)
        auto, per_sequence = auto_method(task, s)
        per_method = {}
        for m in methods:
            t0 = time.perf_counter()
            mem = compiled_memory(task, s, m)
            mem["compile_s"] = time.perf_counter() - t0
            per_method[m] = mem
            print(f"{task} (batch {s['batch']}, L {s['L']}) {m}: temp "
                  f"{mem['temp_bytes'] / GIB:.2f} GiB, args {mem['args_bytes'] / GIB:.2f} GiB",
                  flush=True)  # fmt: skip
        row = {"task": task, "batch": s["batch"], "L": s["L"], "states": per_sequence,
               "auto": auto}  # fmt: skip
        for m in methods:
            row[f"{m}_gib"] = per_method[m]["temp_plus_args_bytes"] / GIB
        rows.append(row)
        results.append({"shapes": s, "stored_states_per_sequence": per_sequence,
                        "auto_resolves_to": auto, "methods": per_method})  # fmt: skip
        path = write_json(args.out, {
            "benchmark": "train_step_memory", "device": info, "methods": methods,
            "auto_cpu_fused_above": AUTO_CPU_FUSED_ABOVE,
            "protocol": "compiled only (nothing run); XLA memory_analysis() of the train step",
            "shape_caps": {"batch": args.batch, "length": args.length},
            "results": results, "rows": rows,
        })  # fmt: skip  # after every config: a partial run keeps what it measured

    print()
    columns = [("task", "config", "s"), ("batch", "batch", "d"), ("L", "L", "d"),
               ("states", "L·P·dirs", ",d"), ("auto", "auto", "s")]  # fmt: skip
    columns += [(f"{m}_gib", f"{m} GiB", ".2f") for m in methods]
    print_table(rows, columns)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
