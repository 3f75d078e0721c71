"""Whole training steps with `s5jax.core._products.matmul` against plain `@` products, or with
its bfloat16 cast inside the product against outside it.

`matmul` (used by the SSM's products B̄u and C̃x, every `Dense` and the pendulum CNN) has the
same value and gradient formulas as `a @ b`, but a custom VJP, so that under the training
step's `jax.vmap` its weight gradient is a product per example and a sum, instead of one
contraction over (batch, rows) that XLA's CPU backend lays out with a transposed copy of the
cotangent. This benchmark builds our jitted training step (`s5jax train`'s, `scan_method =
"auto"`) twice per config: as shipped, and traced with
`s5jax.core._products.VMAP_FRIENDLY_GRADIENT = False` (every product the plain one), and
times the two interleaved in one process at `benchmarks/train_step.py`'s CPU shapes.

`--switch master-weight` compares instead, in `--precision bf16`, the products as shipped
(bfloat16 cast inside `matmul`: a float32 weight's gradient is the float32 accumulator of its
product) against `MASTER_WEIGHT_GRADIENT = False` (the cast outside: each example's weight
gradient rounded to bfloat16 before the batch's sum).

`--switch native-planar` compares the native scan on the products' [Re | Im] rows
(`s5jax.core._ssm.NATIVE_PLANAR`, as shipped) against the same kernel on complex arrays (with
the passes that pack the products' output into them and back), where `auto` runs the native
scan (one CPU device, a C++ compiler).

`--switch native-float32-wg` compares float32 weight gradients through the native kernel
(`s5jax.core._products.NATIVE_FLOAT32_WEIGHT_GRADIENT`, as shipped where the native build has a
vector tile) against XLA's products.

`--switch native-bf16-wg` (with `--precision bf16`) compares bfloat16 weight gradients through
the native kernel's bfloat16 tile (`NATIVE_BF16_WEIGHT_GRADIENT`, as shipped where the build has
AVX512_BF16 and the host no AMX) against a transposed copy and XLA's product.

`--switch native-planar-mixed` (with `--precision bf16`) compares the planar scan and its two
bfloat16 products as one custom VJP whose kernels write the bfloat16 operands themselves
(`s5jax.core._mixed.NATIVE_PLANAR_MIXED`, as shipped) against the three pieces with their own
VJPs (a convert pass over the states forward and over b̄ backward).

`--switch native-column-dot` compares D's gradient in the feed-through (Σ over the rows of
∂y ⊙ u) and BatchNorm's Σ_t ∂y ⊙ (x − mean) through the native kernel
(`s5jax.core._products.NATIVE_COLUMN_DOT`, as shipped on one CPU device with the native
library), which reads u and x as they are stored, against XLA's products over the rows, which
take a float32 copy of a bfloat16 u and x − mean written to memory.

`--memory` also compiles each variant's step once more, nothing run, and records XLA's
`memory_analysis()` scratch (`temp_mib`, `plain_temp_mib`: the saved activations and the
backward pass's temporaries), as `train_step_memory.py` does.

    .venv/bin/python benchmarks/products.py [--configs listops,text,...] [--repeats N]
        [--switch vmap-friendly|master-weight|native-planar|native-float32-wg|native-bf16-wg|
                  native-planar-mixed|native-column-dot]
        [--precision fp32|bf16] [--memory] [--paper] [--batch N] [--out NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import jax
import train_step as ts
from _common import device_info, out_name, print_table, time_interleaved, write_json
from train_step_memory import compiled_memory

from s5jax.config import load_experiment
from s5jax.core import _mixed, _products, _ssm

DEFAULT_CONFIGS = "listops,text,retrieval,image,pathfinder,pendulum,smnist,psmnist,scifar"


SWITCHES = {  # --switch: (module, its flag, the names of the variants with it on and off)
    "vmap-friendly": (_products, "VMAP_FRIENDLY_GRADIENT", "vmap-friendly", "plain"),
    "master-weight": (_products, "MASTER_WEIGHT_GRADIENT", "cast inside", "cast outside"),
    "native-planar": (_ssm, "NATIVE_PLANAR", "planar", "complex"),
    "native-float32-wg": (_products, "NATIVE_FLOAT32_WEIGHT_GRADIENT", "native wg", "xla wg"),
    "native-bf16-wg": (_products, "NATIVE_BF16_WEIGHT_GRADIENT", "native bf16 wg", "xla bf16 wg"),
    "native-planar-mixed": (_mixed, "NATIVE_PLANAR_MIXED", "one vjp", "three vjps"),
    "native-column-dot": (_products, "NATIVE_COLUMN_DOT", "native col dot", "xla col dot"),
}


@contextlib.contextmanager
def _switched_off(module, flag: str):
    """While tracing: `module.<flag>` False."""
    saved = getattr(module, flag)
    setattr(module, flag, False)
    try:
        yield
    finally:
        setattr(module, flag, saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--methods", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="vmap-friendly")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument(
        "--memory", action="store_true", help="also record each variant's compiled scratch memory"
    )
    parser.add_argument("--paper", action="store_true", help="the paper's batch and length")
    parser.add_argument("--batch", type=int, default=None, help="cap on every config's batch")
    parser.add_argument(
        "--out", type=out_name, default="products", help="results/<OUT>-<cpu|gpu>.json"
    )
    args = parser.parse_args()
    tasks, _ = ts.parse_configs_and_methods(parser, args)
    module, flag, on, off = SWITCHES[args.switch]

    rows = []
    for task in tasks:
        s = ts.shapes(task, args.batch, None, paper=args.paper)
        cfg = load_experiment(task)
        cfg = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, precision=args.precision)
        )
        batch = ts.random_batch(task, s, jax.random.PRNGKey(1))
        key = jax.random.PRNGKey(2)
        fns = {}
        variants = ((on, contextlib.nullcontext()), (off, _switched_off(module, flag)))
        for name, tracing in variants:
            fns[name], _, _ = ts._ours(cfg, s, batch, key, "auto")
            with tracing:
                jax.block_until_ready(fns[name]())  # traced and compiled here
        timings = time_interleaved(fns, repeats=args.repeats)
        ms_on, ms_off = (timings[n]["median_s"] * 1e3 for n in (on, off))
        rows.append({
            "config": task, "batch": s["batch"], "L": s["L"], "ms": ms_on, "plain_ms": ms_off,
            "speedup": ms_off / ms_on, "timings": timings,
        })  # fmt: skip
        if args.memory:
            mib = compiled_memory(task, s, "auto", cfg)["temp_bytes"] / 2**20
            with _switched_off(module, flag):
                plain_mib = compiled_memory(task, s, "auto", cfg)["temp_bytes"] / 2**20
            rows[-1].update(temp_mib=mib, plain_temp_mib=plain_mib)
        print(f"{task}: {on} {ms_on:.1f} ms, {off} {ms_off:.1f} ms", flush=True)
    memory = [("temp_mib", f"{on} MiB", ".1f"), ("plain_temp_mib", f"{off} MiB", ".1f")]
    print_table(rows, [
        ("config", "config", ""), ("batch", "batch", "d"), ("L", "L", "d"),
        ("ms", f"{on} ms", ".0f"), ("plain_ms", f"{off} ms", ".0f"),
        ("speedup", f"{off} / {on}", ".2f"), *(memory if args.memory else ()),
    ])  # fmt: skip
    path = write_json(args.out, {
        "benchmark": "products", "device": device_info(), "repeats": args.repeats,
        "scan_method": "auto", "switch": args.switch, "flag": f"{module.__name__}.{flag}",
        "variants": [on, off],
        "precision": args.precision, "memory": args.memory, "paper": args.paper, "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
