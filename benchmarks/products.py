"""Whole training steps with `s5jax.core._products.matmul` against plain `@` products.

`matmul` (used by the SSM's products B̄u and C̃x, every `Dense` and the pendulum CNN) has the
same value and gradient formulas as `a @ b`, but a custom VJP, so that under the training
step's `jax.vmap` its weight gradient is a product per example and a sum, instead of one
contraction over (batch, rows) that XLA's CPU backend lays out with a transposed copy of the
cotangent. This benchmark builds our jitted training step (`s5jax train`'s, `scan_method =
"auto"`) twice per config: as shipped, and traced with
`s5jax.core._products.VMAP_FRIENDLY_GRADIENT = False` (every product the plain one), and
times the two interleaved in one process at `benchmarks/train_step.py`'s CPU shapes.

    .venv/bin/python benchmarks/products.py [--configs listops,text,...] [--repeats N]
"""

from __future__ import annotations

import argparse
import contextlib

import jax
import train_step as ts
from _common import device_info, print_table, time_interleaved, write_json

from s5jax.config import load_experiment
from s5jax.core import _products

DEFAULT_CONFIGS = "listops,text,retrieval,image,pathfinder,pendulum,smnist,psmnist,scifar"


@contextlib.contextmanager
def _plain_products():
    saved = _products.VMAP_FRIENDLY_GRADIENT
    _products.VMAP_FRIENDLY_GRADIENT = False
    try:
        yield
    finally:
        _products.VMAP_FRIENDLY_GRADIENT = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--methods", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tasks, _ = ts.parse_configs_and_methods(parser, args)

    rows = []
    for task in tasks:
        s = ts.shapes(task, None, None, paper=False)
        cfg = load_experiment(task)
        batch = ts.random_batch(task, s, jax.random.PRNGKey(1))
        key = jax.random.PRNGKey(2)
        fns = {}
        variants = (("vmap-friendly", contextlib.nullcontext), ("plain", _plain_products))
        for name, tracing in variants:
            fns[name], _, _ = ts._ours(cfg, s, batch, key, "auto")
            with tracing():
                jax.block_until_ready(fns[name]())  # traced and compiled here
        timings = time_interleaved(fns, repeats=args.repeats)
        friendly, plain = (timings[n]["median_s"] * 1e3 for n in ("vmap-friendly", "plain"))
        rows.append({
            "config": task, "batch": s["batch"], "L": s["L"], "ms": friendly, "plain_ms": plain,
            "speedup": plain / friendly, "timings": timings,
        })  # fmt: skip
        print(f"{task}: vmap-friendly {friendly:.1f} ms, plain {plain:.1f} ms", flush=True)
    print_table(rows, [
        ("config", "config", ""), ("batch", "batch", "d"), ("L", "L", "d"),
        ("ms", "vmap-friendly ms", ".0f"), ("plain_ms", "plain ms", ".0f"),
        ("speedup", "plain / friendly", ".2f"),
    ])  # fmt: skip
    path = write_json("products", {
        "benchmark": "products", "device": device_info(), "repeats": args.repeats,
        "scan_method": "auto", "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
