"""Seeds trained together (issue 19 §2): k pendulum seeds in one vmapped step, or k steps in turn.

For k in {1, 2, 4, 8}, times, interleaved in one run:
- `seq k`: k jitted training steps of the paper's pendulum model (batch 32, L = 50, 24×24
  frames), one per seed, each seed with its own parameters, optimiser state, key and batch,
  called one after another (what `s5jax train pendulum --seeds ...` does today);
- `vmap k`: one jitted step of `jax.vmap` over the k seeds' parameters, optimiser states, keys
  and batches (what a seeds-together trainer would run).

The figure of merit is `seq k / vmap k` (> 1: vmapping wins). Writes
`results/vmap-seeds-<cpu|gpu>.json`.

    .venv/bin/python benchmarks/vmap_seeds.py [--repeats N] [--ks 1,2,4,8]
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import device_info, print_table, time_interleaved, write_json

from s5jax.config import load_experiment
from s5jax.nn import build_model
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps


def _batch(rng: np.random.Generator, batch: int, L: int) -> dict:
    return {
        "x": rng.random((batch, L, 576), np.float32),
        "y": rng.standard_normal((batch, L, 2)).astype(np.float32),
        "mask": np.ones((batch,), bool),
        "dt": rng.integers(1, 4, (batch, L)).astype(np.float32),
    }


def _seed(cfg, seed: int, optimizer_for):
    """One seed's (params, state, opt_state) and the model's static part."""
    model, state = build_model(cfg.model, d_input=576, n_outputs=2, key=jax.random.PRNGKey(seed))
    optimizer = optimizer_for(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    return (params, state, opt_state), static, optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ks", default="1,2,4,8", help="comma-separated seed counts")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]

    cfg = load_experiment("pendulum")
    batch, L = cfg.data.batch_size, 50

    def optimizer_for(model):
        return build_optimizer(cfg.optim, model, steps_per_epoch=62, epochs=cfg.train.epochs)[0]

    kmax = max(ks)
    seeds = [_seed(cfg, s, optimizer_for) for s in range(kmax)]
    static, optimizer = seeds[0][1], seeds[0][2]
    steps = make_steps(static, optimizer, cfg.model.head)
    rng = np.random.default_rng(0)
    batches = [{k: jnp.asarray(v) for k, v in _batch(rng, batch, L).items()} for _ in range(kmax)]
    keys = [jax.random.PRNGKey(100 + s) for s in range(kmax)]

    # The vmapped step: the same step function, mapped over every argument's leading axis.
    raw = make_steps(static, optimizer, cfg.model.head).train.__wrapped__
    vstep = jax.jit(jax.vmap(raw), donate_argnums=(0, 1, 2))

    def stack(trees):
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)

    fns = {}
    for k in ks:
        carries = [[jax.tree_util.tree_map(jnp.copy, t) for t in seeds[s][0]] for s in range(k)]

        def seq(carries=carries, k=k):
            out = None
            for s in range(k):
                p, st, o = carries[s]
                carries[s][0], carries[s][1], carries[s][2], stats = steps.train(
                    p, st, o, batches[s], keys[s]
                )
                out = stats["loss"]
            return out

        vcarry = [stack([seeds[s][0][i] for s in range(k)]) for i in range(3)]
        vbatch, vkeys = stack(batches[:k]), jnp.stack(keys[:k])

        def vmapped(vcarry=vcarry, vbatch=vbatch, vkeys=vkeys):
            vcarry[0], vcarry[1], vcarry[2], stats = vstep(*vcarry, vbatch, vkeys)
            return stats["loss"]

        fns[f"seq {k}"], fns[f"vmap {k}"] = seq, vmapped

    # The two forms compute the same losses: check on the first step from equal starts.
    check_k = min(2, kmax)
    p_seq = [
        steps.train(
            *[jax.tree_util.tree_map(jnp.copy, t) for t in seeds[s][0]], batches[s], keys[s]
        )[3]["loss"]
        for s in range(check_k)
    ]
    vc = [
        stack([jax.tree_util.tree_map(jnp.copy, seeds[s][0][i]) for s in range(check_k)])
        for i in range(3)
    ]
    p_vmap = vstep(*vc, stack(batches[:check_k]), jnp.stack(keys[:check_k]))[3]["loss"]
    max_loss_diff = float(np.max(np.abs(np.asarray(p_seq) - np.asarray(p_vmap))))

    timings = time_interleaved(fns, repeats=args.repeats)
    rows = []
    for k in ks:
        s, v = timings[f"seq {k}"]["median_s"], timings[f"vmap {k}"]["median_s"]
        rows.append(
            {
                "k": k,
                "seq_ms": s * 1e3,
                "vmap_ms": v * 1e3,
                "seq_per_seed_ms": s * 1e3 / k,
                "vmap_per_seed_ms": v * 1e3 / k,
                "speedup": s / v,
            }
        )
    print_table(
        rows,
        [
            ("k", "k", "d"),
            ("seq_ms", "seq ms", ".1f"),
            ("vmap_ms", "vmap ms", ".1f"),
            ("seq_per_seed_ms", "seq ms/seed", ".1f"),
            ("vmap_per_seed_ms", "vmap ms/seed", ".1f"),
            ("speedup", "seq/vmap", ".2f"),
        ],
    )
    print(f"first-step losses, vmapped vs one at a time: max |difference| {max_loss_diff:.2e}")
    path = write_json(
        "vmap-seeds",
        {
            "benchmark": "vmap_seeds",
            "device": device_info(),
            "repeats": args.repeats,
            "shapes": {"batch": batch, "L": L, "frame": [24, 24, 1], "H": cfg.model.d_model},
            "rows": rows,
            "timings": timings,
            "max_first_step_loss_diff": max_loss_diff,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
