"""The fused path's buffer reuse (`s5jax.core._ssm.FUSED_REUSE_BYTES`): kept vs made again.

A bidirectional fused layer uses each block's B̄u twice in the forward pass (once per scan
direction) and the backward scan's ∂x twice in the backward pass (pre-pass and main loop).
Below `FUSED_REUSE_BYTES` each is made once and kept in a (B, L, 2P) buffer, and the kept B̄u is
also saved for the backward pass, which then makes no B̄u; with the limit at 0 all are made
again (one matrix product per block more in the forward pass, two in the backward pass).
This script times one layer's SSM (`s5jax.nn.S5SSM`, fused, the layer benchmark's shape:
H 128, P_full 256, J 8, L 4096, batch 8) both ways, forward and backward separately (the
backward timed alone, through the VJP function of a forward computed beforehand), interleaved
calls, and checks that both ways give the same outputs and gradients.

    .venv/bin/python benchmarks/fused_reuse.py [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import device_info, print_table, time_interleaved, write_json

from s5jax import nn
from s5jax.core import _ssm


def build(layer, u, limit):
    """(forward, backward) zero-argument callables with the reuse limit `limit` (bytes)."""
    _ssm._fused_ssm.cache_clear()  # the kernels read the limit when they are traced
    _ssm.FUSED_REUSE_BYTES = limit
    forward = functools.partial(eqx.filter_jit(lambda m, u: jax.vmap(m)(u)), layer, u)
    y = forward()
    _, vjp = eqx.filter_vjp(lambda m: jax.vmap(m)(u), layer)
    backward = functools.partial(eqx.filter_jit(lambda f, g: f(g)), vjp, jnp.cos(y))
    grads = backward()
    return forward, backward, y, grads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="L = 1024")
    args = parser.parse_args()
    H, P_full, J, batch = 128, 256, 8, 8
    L = 1024 if args.quick else 4096
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    layer = nn.S5SSM(H, P_full, J=J, bidirectional=True, scan_method="fused",
                     key=jax.random.PRNGKey(0))  # fmt: skip
    u = jax.random.normal(jax.random.PRNGKey(1), (batch, L, H), jnp.float32)
    default = _ssm.FUSED_REUSE_BYTES
    buffer_bytes = batch * L * P_full * 4  # B·L·2P float32 (P_full / 2 stored states)
    try:
        fk, bk, yk, gk = build(layer, u, default)
        fm, bm, ym, gm = build(layer, u, 0)
    finally:
        _ssm.FUSED_REUSE_BYTES = default
        _ssm._fused_ssm.cache_clear()
    diff = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree_util.tree_leaves((yk, gk)), jax.tree_util.tree_leaves((ym, gm)),
                        strict=True)
    )  # fmt: skip
    print(f"max |kept - made again| over outputs and gradients: {diff:.2e}")
    times = time_interleaved(
        {"forward, kept": fk, "forward, made again": fm,
         "backward, kept": bk, "backward, made again": bm},
        repeats=args.repeats,
    )  # fmt: skip
    rows = [
        {"what": k, "ms": v["median_s"] * 1e3, "min_ms": v["min_s"] * 1e3} for k, v in times.items()
    ]
    mib = 2**20
    print(f"one bidirectional layer, batch {batch}, L {L}, H {H}, P_full {P_full}; "
          f"kept buffer {buffer_bytes / mib:.0f} MiB (limit {default / mib:.0f} MiB)")  # fmt: skip
    print_table(rows, [("what", "pass", "s"), ("ms", "median ms", ".1f"),
                       ("min_ms", "min ms", ".1f")])  # fmt: skip
    ratios = {
        p: times[f"{p}, made again"]["median_s"] / times[f"{p}, kept"]["median_s"]
        for p in ("forward", "backward")
    }
    print("made again / kept: " + ", ".join(f"{p} {r:.2f}" for p, r in ratios.items()))
    path = write_json("fused-reuse", {
        "benchmark": "fused_reuse", "quick": args.quick, "device": info, "repeats": args.repeats,
        "shapes": {"H": H, "P_full": P_full, "J": J, "L": L, "batch": batch,
                   "bidirectional": True, "dtype": "float32"},
        "buffer_bytes": buffer_bytes, "reuse_limit_bytes": default,
        "max_abs_diff_kept_vs_made_again": diff,
        "made_again_over_kept": ratios, "rows": rows, "timings": times,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
