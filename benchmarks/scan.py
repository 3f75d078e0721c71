"""Throughput of the diagonal linear recurrence x_k = Λ̄ ⊙ x_{k−1} + b_k, per scan method.

For every (L, P) the batch is chosen so that batch × P ≥ 4096 lanes, unless one (B, L, P)
complex64 array would exceed `--max-array-mb` (then the batch is smaller and the row says
so). Each row times, interleaved in one run: a plain elementwise pass `b * c + d` over the
same (B, L, P) complex64 array (the practical bandwidth ceiling), and for every method the
forward scan and the forward+backward (`jax.grad` of sum(Re(w ⊙ x)) with respect to Λ̄ and b).

Bytes counted: read b (B·L·P complex64) + write x (B·L·P complex64) = 16·B·L·P bytes, for the
scan and the elementwise pass alike. The fwd+bwd figure uses the same byte count (it moves
more: that is what the ratio to the forward pass shows), so its GB/s is "forward bytes per
second of fwd+bwd time".

    .venv/bin/python benchmarks/scan.py            # full grid
    .venv/bin/python benchmarks/scan.py --quick    # small grid

On a GPU backend the fused Pallas (Triton) kernel, method `"pallas"`, and the scan as matrix
products, `"matmul"`, are timed too, and the summary gives Pallas's fwd+bwd speed-up over
`parallel` (associative_scan) at L = 16384 and its bandwidth against the elementwise pass
(targets in benchmarks/README.md). Elsewhere Pallas would run in interpret mode, so it is left
out, and `"matmul"` (made for accelerators) is timed only when named.

`--shape B,L,P` times one case instead of the grid (ListOps' scans at the paper's batch:
`--shape 50,2048,8`, one direction); `--methods` names the methods; `--matmul-chunks 16,32,64`
adds `"matmul"` at each chunk size T (`matmul@T`; the default is `_scan.MATMUL_CHUNK`).

    .venv/bin/python benchmarks/scan.py --shape 50,2048,8 --methods parallel,pallas,matmul \
        --matmul-chunks 16,32,64,128 --out scan-listops
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from _common import device_info, print_table, time_interleaved, write_json

from s5jax import core
from s5jax.core import _scan

METHODS = ("sequential", "parallel", "chunked")
if jax.default_backend() == "gpu":  # the Pallas kernel; off GPU it would only be interpreted
    METHODS += ("pallas", "matmul")
if core.native_available():  # the C++ kernel (CPU; compiled on first use)
    METHODS += ("native",)
else:
    print(f"native scan not measured: {core.native_build_error()}")


def parse_methods(parser, methods: str | None, chunks: str | None) -> tuple[str, ...]:
    """`--methods` (default `METHODS`) and `--matmul-chunks` as method names, each checked
    (`parser.error` otherwise); a chunk size T adds `matmul@T`."""
    names = METHODS
    if methods:
        names = tuple(dict.fromkeys(m.strip() for m in methods.split(",") if m.strip()))
        bad = [m for m in names if m not in core.SCAN_METHODS]
        if not names or bad:
            parser.error(
                f"--methods: each must be one of {', '.join(core.SCAN_METHODS)}, got {methods!r}"
            )
    if chunks:
        try:
            sizes = [int(c) for c in chunks.split(",") if c.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            parser.error(f"--matmul-chunks: positive integers, comma-separated; got {chunks!r}")
        names += tuple(f"matmul@{T}" for T in sizes)
    return names


def parse_shape(parser, shape: str) -> tuple[int, int, int]:
    """`--shape B,L,P` as three positive integers (`parser.error` otherwise)."""
    try:
        B, L, P = (int(x) for x in shape.split(","))
    except ValueError:
        parser.error(f"--shape: three integers B,L,P (e.g. 50,2048,8), got {shape!r}")
    if min(B, L, P) < 1:
        parser.error(f"--shape: B, L and P must be positive, got {shape!r}")
    return B, L, P


def make_inputs(B, L, P, seed=0):
    rng = np.random.default_rng(seed)
    a = 0.999 * np.exp(1j * rng.uniform(-np.pi, np.pi, P))
    b = rng.normal(size=(B, L, P)) + 1j * rng.normal(size=(B, L, P))
    w = rng.normal(size=(B, L, P)) + 1j * rng.normal(size=(B, L, P))
    as64 = functools.partial(jnp.asarray, dtype=jnp.complex64)
    return as64(a), as64(b), as64(w)


def build(method):
    """Jitted forward and gradient of `method` over a batch; `matmul@T` is `"matmul"` with
    chunks of T steps."""
    if method.startswith("matmul@"):
        T = int(method.split("@")[1])

        def one(a, bb):
            return _scan._matmul(a, bb, False, chunk_size=T)
    else:

        def one(a, bb):
            return core.linear_recurrence(a, bb, method=method)[0]

    def forward(a, b):
        return jax.vmap(lambda bb: one(a, bb))(b)

    def loss(a, b, w):
        return jnp.sum(jnp.real(w * forward(a, b)))

    return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


def run_case(L, P, lanes, max_array_mb, repeats, methods=METHODS, batch=None):
    B = max(1, -(-lanes // P))
    B_mem = max(1, int(max_array_mb * 2**20 // (L * P * 8)))
    B = min(B, B_mem) if batch is None else batch
    a, b, w = make_inputs(B, L, P)
    c, d = jnp.complex64(0.5 + 0.5j), jnp.complex64(0.25)
    elementwise = jax.jit(lambda x: x * c + d)
    fns = {"elementwise": functools.partial(elementwise, b)}
    for m in methods:
        fwd, grad = build(m)
        fns[f"{m}/fwd"] = functools.partial(fwd, a, b)
        fns[f"{m}/fwd+bwd"] = functools.partial(grad, a, b, w)
    times = time_interleaved(fns, repeats=repeats)
    nbytes = 2 * B * L * P * 8
    ew = times["elementwise"]["median_s"]
    row = {
        "L": L, "P": P, "batch": B, "lanes": B * P, "lanes_ge_4096": B * P >= 4096,
        "bytes": nbytes, "elementwise_s": ew, "elementwise_GBps": nbytes / ew / 1e9,
    }  # fmt: skip
    for m in methods:
        for kind in ("fwd", "fwd+bwd"):
            t = times[f"{m}/{kind}"]["median_s"]
            row[f"{m}/{kind}_s"] = t
            row[f"{m}/{kind}_GBps"] = nbytes / t / 1e9
            row[f"{m}/{kind}_vs_elementwise"] = ew / t
    best = max(methods, key=lambda m: row[f"{m}/fwd_vs_elementwise"])
    row["best_fwd"] = best
    row["best_fwd_vs_elementwise"] = row[f"{best}/fwd_vs_elementwise"]
    row["timings"] = times
    return row


def pallas_summary(rows, L=16384):
    """The fused kernel against its targets at length L: fwd+bwd ≥ 3× faster than
    `parallel` (associative_scan), and ≥ 0.70 of the elementwise (copy) bandwidth.

    Bandwidth of fwd+bwd counts the bytes it must move at least: read b, write x (forward),
    read g and x, write λ (backward): 5 × 8 bytes per complex64 element, against the
    elementwise pass's 2 × 8 at the elementwise GB/s.
    """
    out = {}
    for r in rows:
        if r["L"] != L:
            continue
        fb_bytes = 5 * r["bytes"] / 2
        fb_gbps = fb_bytes / r["pallas/fwd+bwd_s"] / 1e9
        out[f"P={r['P']}"] = {
            "fwd+bwd_speedup_vs_parallel": r["parallel/fwd+bwd_s"] / r["pallas/fwd+bwd_s"],
            "fwd_GBps": r["pallas/fwd_GBps"],
            "fwd_vs_elementwise": r["pallas/fwd_vs_elementwise"],
            "fwd+bwd_min_bytes_GBps": fb_gbps,
            "fwd+bwd_vs_elementwise": fb_gbps / r["elementwise_GBps"],
        }
        o = out[f"P={r['P']}"]
        print(
            f"pallas L={L} P={r['P']}: fwd+bwd {o['fwd+bwd_speedup_vs_parallel']:.2f}x "
            f"parallel (target 3), fwd {o['fwd_GBps']:.0f} GB/s = "
            f"{o['fwd_vs_elementwise']:.2f} of elementwise, fwd+bwd "
            f"{o['fwd+bwd_vs_elementwise']:.2f} of elementwise (target 0.70)"
        )
    if not out:
        print(f"pallas: no row at L={L} (use the full grid, not --quick)")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small grid, fewer repeats")
    parser.add_argument("--lanes", type=int, default=4096, help="target batch × P")
    parser.add_argument("--max-array-mb", type=float, default=256.0)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--shape", help="one case B,L,P instead of the grid (e.g. 50,2048,8)")
    parser.add_argument("--methods", help=f"comma-separated (default {','.join(METHODS)})")
    parser.add_argument("--matmul-chunks", help="add matmul@T for each T, e.g. 16,32,64")
    parser.add_argument("--out", default="scan", help="results/<out>-<backend>.json")
    args = parser.parse_args()
    methods = parse_methods(parser, args.methods, args.matmul_chunks)
    batch = None
    if args.shape:
        batch, L, P = parse_shape(parser, args.shape)
        Ls, Ps, repeats = (L,), (P,), args.repeats or 5
    elif args.quick:
        Ls, Ps, repeats = (1024, 4096), (64, 128), args.repeats or 5
    else:
        Ls, Ps, repeats = (1024, 4096, 16384, 65536), (64, 128, 256), args.repeats or 5
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    rows = []
    for L in Ls:
        for P in Ps:
            rows.append(run_case(L, P, args.lanes, args.max_array_mb, repeats, methods, batch))
            r = rows[-1]
            print(
                f"  L={L} P={P} B={r['batch']}: best {r['best_fwd']} "
                f"{r['best_fwd_vs_elementwise']:.2f} of elementwise",
                flush=True,
            )
    columns = [
        ("L", "L", "d"),
        ("P", "P", "d"),
        ("batch", "B", "d"),
        ("elementwise_GBps", "elem GB/s", ".2f"),
    ]
    for m in methods:
        short = m if m.startswith("matmul@") else m[:3]
        columns += [
            (f"{m}/fwd_GBps", f"{short} GB/s", ".2f"),
            (f"{m}/fwd_vs_elementwise", f"{short}/elem", ".2f"),
            (f"{m}/fwd+bwd_s", f"{short} f+b ms", ".1f"),
        ]
    table = [{**r, **{f"{m}/fwd+bwd_s": r[f"{m}/fwd+bwd_s"] * 1e3 for m in methods}} for r in rows]
    print_table(table, columns)
    eligible = [r for r in rows if r["lanes_ge_4096"]]
    summary = {
        "target": "best scan >= 0.70 of the elementwise pass at batch*P >= 4096",
        "min_best_fwd_vs_elementwise": min(r["best_fwd_vs_elementwise"] for r in eligible)
        if eligible else None,
        "median_best_fwd_vs_elementwise": float(
            np.median([r["best_fwd_vs_elementwise"] for r in eligible])
        ) if eligible else None,
    }  # fmt: skip
    if eligible:
        print(
            f"best-scan / elementwise at batch*P >= 4096: min "
            f"{summary['min_best_fwd_vs_elementwise']:.2f}, median "
            f"{summary['median_best_fwd_vs_elementwise']:.2f} (target 0.70)"
        )
    if "pallas" in methods and "parallel" in methods:
        summary["pallas"] = pallas_summary(rows)
    path = write_json(args.out, {
        "benchmark": "scan", "quick": args.quick, "device": info, "repeats": repeats,
        "methods": list(methods), "shape": args.shape,
        "dtype": "complex64", "chunk_size": _scan.CHUNK_SIZE, "matmul_chunk": _scan.MATMUL_CHUNK,
        "bytes_counted": "read b + write x, 16 * B * L * P bytes (complex64)",
        "summary": summary, "rows": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
