"""One weight product's forward and backward pass in float32 and in bfloat16, the training way.

Our models are `jax.vmap`-ed over the batch, so a weight product is `x @ W` with `x` (B, L, K)
batched and `W` (K, N) shared: its forward pass and the two gradient products of its backward
pass (∂x = g Wᵀ, ∂W = Σ_b x_bᵀ g_b). Variants, each `s5jax.core._products.matmul` under
`jax.vmap` and `jax.vjp`, jitted:

- `fp32`: float32 operands;
- `bf16, JAX gradient`: bfloat16 operands accumulated in float32, backward pass as JAX derives
  it (`REDUCED_PRECISION_GRADIENT = False`: the float32 cotangent times a bfloat16 operand,
  float32 products);
- `bf16`: the same forward pass, backward pass as shipped (the cotangent rounded to bfloat16,
  ∂W from a row-major transposed copy of `x`: bfloat16 products).

Timed interleaved in one process (`_common.time_interleaved`), medians; also the forward
pass alone per precision. Whether bfloat16 pays depends on the CPU (AVX512_BF16 / AMX-BF16:
the JSON records the CPU's flags).

    .venv/bin/python benchmarks/matmul_precision.py [--repeats N] [--out NAME]
"""

from __future__ import annotations

import argparse
import contextlib

import jax
import jax.numpy as jnp
from _common import device_info, out_name, print_table, time_interleaved, write_json

from s5jax.core import _products
from s5jax.core._products import matmul

SHAPES = (  # (B, L, K, N): layer.py's efficiency shape, Text's SSM input product, Image's GLU
    (8, 4096, 128, 256),
    (4, 4096, 192, 384),
    (4, 1024, 512, 512),
)


@contextlib.contextmanager
def _gradient(reduced: bool):
    saved = _products.REDUCED_PRECISION_GRADIENT
    _products.REDUCED_PRECISION_GRADIENT = reduced
    try:
        yield
    finally:
        _products.REDUCED_PRECISION_GRADIENT = saved


def _fwd_bwd(x, w, acc):
    """A jitted zero-argument callable: the forward pass and both gradients (a new function per
    variant, traced at its first call)."""

    def product(w, x):
        return jax.vmap(lambda xi: matmul(xi, w, acc))(x)

    @jax.jit
    def step(w, x):
        y, vjp = jax.vjp(product, w, x)
        return vjp(y.astype(jnp.float32))  # a cotangent of y's shape; its value is immaterial

    return lambda: step(w, x)


def _fwd(x, w, acc):
    f = jax.jit(lambda w, x: jax.vmap(lambda xi: matmul(xi, w, acc))(x))
    return lambda: f(w, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--out", default="matmul-precision", type=out_name, help="results/<OUT>-<cpu|gpu>.json"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")

    rows, results = [], []
    for B, L, K, N in SHAPES:
        k1, k2 = jax.random.split(jax.random.PRNGKey(0))
        x32 = jax.random.normal(k1, (B, L, K), jnp.float32)
        w32 = jax.random.normal(k2, (K, N), jnp.float32) / K**0.5
        x16, w16 = x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16)
        fns = {
            "fp32": _fwd_bwd(x32, w32, None),
            "bf16, JAX gradient": _fwd_bwd(x16, w16, jnp.float32),
            "bf16": _fwd_bwd(x16, w16, jnp.float32),
            "fp32 forward": _fwd(x32, w32, None),
            "bf16 forward": _fwd(x16, w16, jnp.float32),
        }
        for name, fn in fns.items():  # trace each under its own switch
            with _gradient(name != "bf16, JAX gradient"):
                jax.block_until_ready(fn())
        t = time_interleaved(fns, repeats=args.repeats)
        ms = {name: v["median_s"] * 1e3 for name, v in t.items()}
        row = {
            "shape": f"{B}x{L}x{K} @ {K}x{N}", "fp32_ms": ms["fp32"],
            "bf16_jax_ms": ms["bf16, JAX gradient"], "bf16_ms": ms["bf16"],
            "fp32_over_bf16": ms["fp32"] / ms["bf16"],
            "jax_over_ours": ms["bf16, JAX gradient"] / ms["bf16"],
            "fwd_fp32_ms": ms["fp32 forward"], "fwd_bf16_ms": ms["bf16 forward"],
        }  # fmt: skip
        jax_ms = ms["bf16, JAX gradient"]
        print(f"  {row['shape']}: fp32 {ms['fp32']:.1f} ms, bf16 with JAX's gradient "
              f"{jax_ms:.1f} ms, bf16 {ms['bf16']:.1f} ms", flush=True)  # fmt: skip
        rows.append(row)
        results.append({"B": B, "L": L, "K": K, "N": N, "timings": t, **row})
    path = write_json(args.out, {
        "benchmark": "matmul_precision", "device": info, "repeats": args.repeats,
        "protocol": "interleaved, medians; forward + both gradient products under jax.vmap",
        "results": results, "rows": rows,
    })  # fmt: skip
    print()
    print_table(rows, [
        ("shape", "x @ W", "s"), ("fp32_ms", "fp32 ms", ".1f"),
        ("bf16_jax_ms", "bf16 JAX-grad ms", ".1f"), ("bf16_ms", "bf16 ms", ".1f"),
        ("fp32_over_bf16", "fp32/bf16", ".2f"), ("jax_over_ours", "JAX-grad/bf16", ".2f"),
        ("fwd_fp32_ms", "fwd fp32 ms", ".1f"), ("fwd_bf16_ms", "fwd bf16 ms", ".1f"),
    ])  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
