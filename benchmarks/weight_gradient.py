"""A weight gradient alone, Σ_r a[r]ᵀ g[r] over all of a batch's rows: XLA's product against the
native kernel (`s5jax.core._native.native_weight_gradient`), in float32 and in bfloat16.

The gradient of W in y = x W contracts the rows, the outer axis of both operands. Variants, each
jitted and timed interleaved in one process (`_common.time_interleaved`), medians:

- `fp32 xla`: `a.T @ g`, float32 (XLA's CPU backend);
- `fp32 native`: the native kernel's float32 tile (AVX2 or AVX-512, whichever the build has);
- `bf16 xla`: bfloat16 operands, float32 sums, as `s5jax.core._products` runs it without the
  native bfloat16 tile: a row-major transposed copy of `a` (`native_transpose`) and XLA's product;
- `bf16 native`: the native kernel's bfloat16 tile (pairs of rows, AVX512_BF16 dot products),
  where the build has it (`native_weight_gradient_bfloat16()`).

Shapes (rows, K, N): the layer benchmark's C̃ and B̃ gradients (8 × 4,096 rows; K = 4P = 512,
N = H = 128; K = H = 128, N = 2P = 256), the first at 8,000 rows (batch 2 × L 4,000, the retrieval
benchmark's rows) and the second at 39,200 (batch 50 × L 784, sMNIST's). The JSON has GFLOP/s
and each variant's largest error against the float64 contraction of the same (rounded) operands,
relative to Σ|a||g|.

    .venv/bin/python benchmarks/weight_gradient.py [--repeats N] [--out NAME]
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from _common import device_info, out_name, print_table, time_interleaved, write_json

from s5jax.core import _native

SHAPES = ((32768, 512, 128), (32768, 128, 256), (8000, 512, 128), (39200, 128, 256))


def variants(a32, g32):
    """name -> (zero-argument callable, its operands as float64)."""
    a16, g16 = a32.astype(jnp.bfloat16), g32.astype(jnp.bfloat16)
    f32 = (np.asarray(a32, np.float64), np.asarray(g32, np.float64))
    b16 = (np.asarray(a16, np.float64), np.asarray(g16, np.float64))
    xla32 = jax.jit(lambda a, g: a.T @ g)
    xla16 = jax.jit(
        lambda a, g: jnp.matmul(_native.native_transpose(a), g, preferred_element_type=jnp.float32)
    )
    native = jax.jit(_native.native_weight_gradient)
    out = {
        "fp32 xla": (functools.partial(xla32, a32, g32), f32),
        "fp32 native": (functools.partial(native, a32, g32), f32),
        "bf16 xla": (functools.partial(xla16, a16, g16), b16),
    }
    if _native.native_weight_gradient_bfloat16():
        out["bf16 native"] = (functools.partial(native, a16, g16), b16)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default="weight-gradient", type=out_name)
    args = parser.parse_args()
    if not _native.native_available():
        raise SystemExit(f"the native library is unavailable: {_native.native_build_error()}")
    info = device_info()
    print(f"{info['cpu_model']} ({info['cpu_family_model']}) | jax {info['jax']} | "
          f"float32 tile {_native.native_weight_gradient_tile()}, bfloat16 tile "
          f"{_native.native_weight_gradient_bfloat16()}")  # fmt: skip
    rows = []
    for R, K, N in SHAPES:
        ka, kg = jax.random.split(jax.random.PRNGKey(R + K + N))
        a = jax.random.normal(ka, (R, K), jnp.float32)
        g = jax.random.normal(kg, (R, N), jnp.float32)
        fns = variants(a, g)
        times = time_interleaved({k: f for k, (f, _) in fns.items()}, repeats=args.repeats)
        for name, (fn, (a64, g64)) in fns.items():
            want = a64.T @ g64
            err = np.abs(np.asarray(fn(), np.float64) - want) / (np.abs(a64).T @ np.abs(g64))
            t = times[name]["median_s"]
            rows.append({"rows": R, "K": K, "N": N, "variant": name, "ms": t * 1e3,
                         "gflops": 2 * R * K * N / t / 1e9, "max_rel_error": float(err.max()),
                         "timing": times[name]})  # fmt: skip
    columns = [("rows", "rows", "d"), ("K", "K", "d"), ("N", "N", "d"), ("variant", "variant", "s"),
               ("ms", "ms", ".2f"), ("gflops", "GFLOP/s", ".0f"),
               ("max_rel_error", "err / Σ|a||g|", ".1e")]  # fmt: skip
    print_table(rows, columns)
    path = write_json(args.out, {
        "benchmark": "weight_gradient", "device": info, "repeats": args.repeats,
        "float32_tile": _native.native_weight_gradient_tile(),
        "bfloat16_tile": _native.native_weight_gradient_bfloat16(),
        "host_has_amx": _native.native_host_has_amx(), "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
