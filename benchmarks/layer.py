"""Forward+backward time of S5 layers: ours (`s5jax.nn.S5SSM`) against the paper's App. A listing.

Shapes (the issue's CPU target): H = 128, P_full = 256 (128 complex states stored under
conjugate symmetry), J = 8 HiPPO-N blocks, bidirectional, L = 4096, batch 8.

A "layer" here is u + GELU(S5SSM(u)) (residual, no normalisation, no dropout), for ours and
for the baseline alike; the stack is 6 such layers. Ours is timed with each way
`s5jax.core.apply_ssm` can compute an SSM on CPU: the `"sequential"` and `"chunked"` scans on
complex arrays (`"chunked"` is what `"auto"` picks on CPU at these shapes), and `"fused"`
(blockwise real matrix products and recurrences, `"auto"`'s pick until 2026-11-26).

BASELINE: written below the way the paper's App. A listing computes a layer: ZOH
discretisation, Λ̄ repeated L times, B̄u by `jax.vmap(lambda u: B_bar @ u)` (complex matmul),
`jax.lax.associative_scan` over L×P elements (and a second one, reversed, for the backward
direction), then `jax.vmap(lambda x, u: (C_tilde @ x + D * u).real)` with C̃ = [C_fwd | C_bwd]
and the factor 2 of conjugate symmetry on C̃x. Its parameters are the complex versions of
ours, so both compute the same outputs (checked before timing).

Timing: fwd+bwd = `jax.value_and_grad` of mean(y²) with respect to all parameters, jitted,
every variant in one run. By default (`--timing blocked`, `_common.time_blocked`) in
`--repeats` rounds, each calling every variant once untimed and then `--per-round` times timed
in a row, as a training loop calls its step; `--timing interleaved` calls the variants
round-robin (`--repeats` rounds), where each call of ours follows a call of another variant
(the baseline's peak is several GiB, and glibc trims the heap after it: see `_common`). The
JSON records the minor page faults of every timed call. Medians are reported. Also a
breakdown of one of our layers computed by the scan path (B̄u, the two scans, the output
projection).

EFFICIENCY (host-independent): the GEMM floor of the stack is the time of the matrix products a
bidirectional fused layer's forward+backward cannot avoid, timed alone at full size (all B·L
rows in one product) in the same run, times the number of layers. Per layer there are nine,
each B·L·H·2P multiply-adds: forward B̄u = u W_B (BL×H · H×2P) and C̃x of each direction (BL×2P
· 2P×H); backward ∂x of each direction (BL×H · H×2P), ∂W_C of each direction and ∂W_B (H×BL ·
BL×2P) and ∂u (BL×2P · 2P×H). The floor is 3× each of the three product shapes' medians, the
weight gradient's in the faster of two layouts (its left operand as the rows of `u` are stored,
or stored transposed: XLA's CPU backend runs the first through float32 copies of bfloat16
operands; `ROW_MAJOR`; since 2026-11-27), or, where the stack's backward pass computes
it with the native library (`NATIVE`, since 2026-12-01 in float32, 2026-12-02 in bfloat16),
the fastest of the three. Reported:
stack / floor for the fused stack and the chunked one (`--efficiency-methods`; both make the
same nine products, so the floor is theirs alike; 1.0 would be a stack made of nothing but
those products; the recurrences, GELU and the rest are the excess). Also reported,
`efficiency_best`: the stack's fastest call over the floor made of each product's fastest call.
On a host whose matrix-product throughput drifts from round to round (a 2-core AMD EPYC with
AVX2, 2026-12-01: the floor's products summed to 1,108–1,548 ms between rounds, and the median
ratio read 1.45, 1.32, 1.22 and 1.14 in four runs), the medians' ratio moves with the floor's
slow rounds; each side at its fastest is the steadier estimate of what the stack costs against
its products (1.50, 1.38, 1.41 and 1.43 there, the first and third with the code before that
day's adjoint change).
With `--precision bf16` the stacks use `S5SSM(precision="bf16")` (bfloat16 product operands,
float32 accumulation) and their floor is the same products on bfloat16 operands; both
precisions are timed when `bf16` is requested, each against its own floor and against the
float32 floor. `--block T` sets `core._ssm.FUSED_BLOCK` (steps per block
of the fused path) before anything is traced. `--efficiency` times only those stacks and the
floors (no baseline, no other methods).

PASS FLOOR: a stack whose recurrences run apart from its products (`"chunked"`) also moves the
(B, L, P) complex states through memory: per layer, each direction's recurrence reads B̄u and
writes x, its adjoint reads ∂x and writes λ, and ∂Λ̄ = Σ λ x reads both (four passes and two
two-array reductions). Those passes are timed alone as plain jitted elementwise ops in the same
run (`pass_floor_fns`) and reported as a second floor: stack / (GEMM floor + pass floor) says
how close the stack is to what that design can reach on the host, where stack / GEMM floor
(the issue's target) says how close it is to its products alone.

    .venv/bin/python benchmarks/layer.py [--quick] [--timing blocked|interleaved]
"""

from __future__ import annotations

import argparse
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import (
    device_info,
    out_name,
    print_table,
    time_blocked,
    time_interleaved,
    write_json,
)

from s5jax import core, nn
from s5jax.core import _native, _products, _ssm

# --- the baseline: the App. A listing, made bidirectional ------------------------------------


def base_discretize(Lambda, B_tilde, Delta):
    Identity = jnp.ones(Lambda.shape[0])
    Lambda_bar = jnp.exp(Lambda * Delta)
    B_bar = (1 / Lambda * (Lambda_bar - Identity))[..., None] * B_tilde
    return Lambda_bar, B_bar


def base_binary_operator(element_i, element_j):
    A_i, Bu_i = element_i
    A_j, Bu_j = element_j
    return A_j * A_i, A_j * Bu_i + Bu_j


def base_apply_ssm(Lambda_bar, B_bar, C_tilde, D, input_sequence):
    Lambda_elements = jnp.repeat(Lambda_bar[None, ...], input_sequence.shape[0], axis=0)
    Bu_elements = jax.vmap(lambda u: B_bar @ u)(input_sequence)
    elements = (Lambda_elements, Bu_elements)
    _, xs = jax.lax.associative_scan(base_binary_operator, elements)
    _, xs_b = jax.lax.associative_scan(base_binary_operator, elements, reverse=True)
    xs = jnp.concatenate([xs, xs_b], axis=-1)  # (L, 2P) for C̃ = [C_fwd | C_bwd]
    return jax.vmap(lambda x, u: (2 * (C_tilde @ x) + D * u).real)(xs, input_sequence)


def base_layer(params, u):
    Lambda, B_tilde, C_tilde, D, log_Delta = params
    Lambda_bar, B_bar = base_discretize(Lambda, B_tilde, jnp.exp(log_Delta))
    return u + jax.nn.gelu(base_apply_ssm(Lambda_bar, B_bar, C_tilde, D, u))


def base_stack(params_list, u):
    for params in params_list:
        u = base_layer(params, u)
    return u


def base_params(ssm: nn.S5SSM):
    return (
        jax.lax.complex(ssm.Lambda_re, ssm.Lambda_im),
        jax.lax.complex(ssm.B_re, ssm.B_im),
        jax.lax.complex(ssm.C_re, ssm.C_im),
        ssm.D,
        ssm.log_step,
    )


# --- ours ------------------------------------------------------------------------------------


class Stack(eqx.Module):
    layers: list[nn.S5SSM]

    def __call__(self, u):
        for layer in self.layers:
            u = u + jax.nn.gelu(layer(u))
        return u


def make_ours(n_layers, H, P_full, J, method, key, precision="fp32"):
    keys = jax.random.split(key, n_layers)
    return Stack(
        [
            nn.S5SSM(
                H, P_full, J=J, bidirectional=True, scan_method=method, precision=precision, key=k
            )
            for k in keys
        ]
    )


def gemm_floor_fns(batch, L, H, P_stored, dtype):
    """The three product shapes of a fused layer's forward+backward (module docstring), jitted,
    on random operands in `dtype` with float32 results (as the fused path accumulates)."""
    k = jax.random.split(jax.random.PRNGKey(2), 4)
    rows, width = batch * L, 2 * P_stored
    a = jax.random.normal(k[0], (rows, H), jnp.float32).astype(dtype)  # u or ∂y
    x = jax.random.normal(k[1], (rows, width), jnp.float32).astype(dtype)  # states or λ
    w_in = jax.random.normal(k[2], (H, width), jnp.float32).astype(dtype)  # W_B or W_Cᵀ
    w_out = jax.random.normal(k[3], (width, H), jnp.float32).astype(dtype)  # W_C or W_Bᵀ

    def dot(p, q, dims):
        return jax.lax.dot_general(p, q, (dims, ((), ())), preferred_element_type=jnp.float32)

    into_state = jax.jit(lambda a, w: dot(a, w, ((1,), (0,))))  # (BL,H)·(H,2P)
    out_of_state = jax.jit(lambda x, w: dot(x, w, ((1,), (0,))))  # (BL,2P)·(2P,H)
    weight_grad = jax.jit(lambda a, x: dot(a, x, ((0,), (0,))))  # (H,BL)·(BL,2P)
    a_t = jnp.transpose(a)  # (H, BL): computed here, so stored row-major
    fns = {
        "(BL,H)x(H,2P)": functools.partial(into_state, a, w_in),
        "(BL,2P)x(2P,H)": functools.partial(out_of_state, x, w_out),
        "(H,BL)x(BL,2P)": functools.partial(weight_grad, a, x),
        f"(H,BL)x(BL,2P){ROW_MAJOR}": functools.partial(into_state, a_t, x),
    }
    if _products._native_float32_weight_gradient(
        a, w_in, x, jnp.float32
    ) or _products._native_bf16_weight_gradient(a, x, jnp.float32):
        native = jax.jit(_native.native_weight_gradient)  # what the stack's backward pass runs
        fns[f"(H,BL)x(BL,2P){NATIVE}"] = functools.partial(native, a, x)
    return fns


ROW_MAJOR = " row-major"
"""Suffix of the weight gradient's second floor entry: the same product with its left operand
stored transposed (row-major (H, BL)). XLA's CPU backend converts bfloat16 operands to float32
when the contracted axis is the left operand's outer one (`benchmarks/README.md`,
`matmul_precision.py`), so each precision's floor takes the faster of the two layouts."""


NATIVE = " native"
"""Suffix of the weight gradient's third floor entry, where the stack's backward pass runs it
(`s5jax.core._products.NATIVE_FLOAT32_WEIGHT_GRADIENT`: float32, one CPU device, a build with
an AVX2 or AVX-512 tile; `NATIVE_BF16_WEIGHT_GRADIENT`: bfloat16, a build with AVX512_BF16 on a
host without AMX): `s5jax.core._native.native_weight_gradient`, the same product by the native
library. The floor is the fastest way this package has to compute each product."""


def gemm_floor(times: dict, prefix: str, stat: str = "median_s") -> float:
    """One layer's GEMM floor in seconds from `gemm_floor_fns`' timings (keys `prefix` + name):
    3× each product shape's `stat` (its median, or with "min_s" its fastest call), the weight
    gradient's in its fastest form (layout, or the native kernel where the stack uses it)."""
    med = {k[len(prefix) :]: v[stat] for k, v in times.items() if k.startswith(prefix)}
    wg = "(H,BL)x(BL,2P)"
    weight_grad = min(v for k, v in med.items() if k.startswith(wg))
    return 3 * (med["(BL,H)x(H,2P)"] + med["(BL,2P)x(2P,H)"] + weight_grad)


def pass_floor_fns(batch, L, P_stored):
    """The passes over the (B, L, P) complex states that an SSM whose recurrences run apart
    from its products cannot avoid (module docstring, PASS FLOOR), each timed alone as one
    jitted elementwise pass: `pass` reads one complex (B, L, P) array and writes one, as a
    recurrence does; `reduce` reads two and sums their product over B and L, as ∂Λ̄ does."""
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    shape = (batch, L, P_stored)
    x, y = (jax.lax.complex(jax.random.normal(q, shape), jax.random.normal(q, shape)[..., ::-1])
            for q in k[:2])  # fmt: skip
    s = jnp.exp(1j * jax.random.uniform(k[2], (P_stored,))).astype(jnp.complex64)
    one_pass = jax.jit(lambda x: s * x + 1.0)
    reduce = jax.jit(lambda x, y: jnp.sum(x * y, axis=(0, 1)))
    return {
        "pass (B,L,P)": functools.partial(one_pass, x),
        "reduce (B,L,P)x2": functools.partial(reduce, x, y),
    }


PASSES_PER_LAYER = {"pass (B,L,P)": 4, "reduce (B,L,P)x2": 2}
"""Per bidirectional layer: each direction's recurrence forward and its adjoint backward (one
read and one write each), and each direction's ∂Λ̄ = Σ λ x (two reads)."""


def ours_step(model, u):
    def loss(m):
        return jnp.mean(jax.vmap(m)(u) ** 2)

    return eqx.filter_value_and_grad(loss)(model)


def base_step(params, u):
    def loss(p):
        return jnp.mean(jax.vmap(functools.partial(base_stack, p))(u) ** 2)

    return jax.value_and_grad(loss)(params)


# --- the breakdown of one of our layers --------------------------------------------------


def components(ssm: nn.S5SSM, method):
    """fwd+bwd functions of the parts of one layer's SSM (batched), on the layer's inputs."""
    Lambda_bar, B_bar = ssm.discretized()
    C = ssm.C_tilde()
    P = ssm.P

    def bu(u):
        return jnp.sum(jnp.abs(jax.vmap(lambda v: _ssm._complex_matvecs(v, B_bar))(u)) ** 2)

    def scans(Bu):
        def one(b):
            xf, _ = core.linear_recurrence(Lambda_bar, b, method=method)
            xb, _ = core.linear_recurrence(Lambda_bar, b, reverse=True, method=method)
            return xf.real + xb.real

        return jnp.sum(jax.vmap(one)(Bu) ** 2)

    def project(xs):
        def one(x):
            return _ssm._project(x, C[:, :P]) + _ssm._project(x, C[:, P:])

        return jnp.sum(jax.vmap(one)(xs) ** 2)

    return {
        "B_bar u": jax.jit(jax.grad(bu)),
        "2 scans": jax.jit(jax.grad(scans)),
        "projection": jax.jit(jax.grad(project)),
    }


def time_efficiency(args, u, timed, key, fp32_stacks=None):
    """The stacks of `args.efficiency_methods` and the GEMM floors, timed in one call of
    `timed`; returns (rows, timings, floors). `fp32_stacks`: already built float32 stacks by
    method, reused."""
    batch, L, H = u.shape
    P_full, J = 256, 8
    precisions = ("fp32", "bf16") if args.precision == "bf16" else ("fp32",)
    methods = args.efficiency_methods
    fns = {}
    for prec in precisions:
        for m in methods:
            stack = (fp32_stacks or {}).get(m) if prec == "fp32" else None
            if stack is None:
                stack = make_ours(args.layers, H, P_full, J, m, key, precision=prec)
            fns[f"{m} {prec}/{args.layers} layers"] = functools.partial(
                eqx.filter_jit(ours_step), stack, u
            )
        dtype = jnp.bfloat16 if prec == "bf16" else jnp.float32
        fns |= {f"floor {prec}: {k}": f for k, f in gemm_floor_fns(
            batch, L, H, P_full // 2, dtype).items()}  # fmt: skip
    fns |= {f"passes: {k}": f for k, f in pass_floor_fns(batch, L, P_full // 2).items()}
    times = timed(fns)
    floors = {prec: args.layers * gemm_floor(times, f"floor {prec}: ") for prec in precisions}
    best_floors = {p: args.layers * gemm_floor(times, f"floor {p}: ", "min_s") for p in precisions}
    floors["passes"] = args.layers * sum(
        n * times[f"passes: {k}"]["median_s"] for k, n in PASSES_PER_LAYER.items()
    )
    rows = []
    for prec in precisions:
        for m in methods:
            stack = times[f"{m} {prec}/{args.layers} layers"]
            t = stack["median_s"]
            rows.append({"what": f"{m} {prec}, {args.layers} layers", "method": m, "ms": t * 1e3,
                         "floor_ms": floors[prec] * 1e3, "efficiency": t / floors[prec],
                         "efficiency_best": stack["min_s"] / best_floors[prec],
                         "vs_fp32_floor": t / floors["fp32"],
                         "passes_ms": floors["passes"] * 1e3,
                         "vs_floor_and_passes": t / (floors[prec] + floors["passes"])})  # fmt: skip
    return rows, times, floors


def print_efficiency(rows):
    print(
        "efficiency: stack fwd+bwd / GEMM floor (its nine products per layer alone); pass "
        "floor: its recurrences' unavoidable passes over the states, when run apart"
    )
    print_table(rows, [("what", "stack", "s"), ("ms", "median ms", ".1f"),
                       ("floor_ms", "floor ms", ".1f"), ("efficiency", "stack / floor", ".2f"),
                       ("efficiency_best", "best / best floor", ".2f"),
                       ("vs_fp32_floor", "/ fp32 floor", ".2f"),
                       ("passes_ms", "pass floor ms", ".1f"),
                       ("vs_floor_and_passes", "/ (floor + passes)", ".2f")])  # fmt: skip


def efficiency_only(args):
    H, batch = 128, 8
    L = 1024 if args.quick else 4096
    repeats = args.repeats or (2 if args.quick else 3)
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    u = jax.random.normal(jax.random.PRNGKey(1), (batch, L, H), jnp.float32)

    def timed(fns):
        if args.timing == "blocked":
            return time_blocked(fns, rounds=repeats, per_round=args.per_round)
        return time_interleaved(fns, repeats=repeats)

    rows, times, floors = time_efficiency(args, u, timed, jax.random.PRNGKey(0))
    print(f"fwd+bwd, batch {batch}, L {L}, H {H}, P 128 stored, block "
          f"{_ssm._block_size(L)}, timing {args.timing}, {repeats} rounds")  # fmt: skip
    print_efficiency(rows)
    tag = f"layer-efficiency-{args.precision}" + (f"-block{args.block}" if args.block else "")
    path = write_json(args.out or tag, {
        "benchmark": "layer --efficiency", "quick": args.quick, "device": info,
        "cpu_flags_bf16": _bf16_flags(), "repeats": repeats, "timing": args.timing,
        "per_round": args.per_round if args.timing == "blocked" else None,
        "block": _ssm._block_size(L), "layers": args.layers,
        "shapes": {"H": H, "P_stored": 128, "L": L, "batch": batch},
        "efficiency_methods": list(args.efficiency_methods),
        "floor_s": floors, "rows": rows, "timings": times,
    })  # fmt: skip
    print(f"wrote {path}")


def _bf16_flags():
    """The CPU's bfloat16-related instruction-set flags (/proc/cpuinfo), [] when none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(
                        w for w in line.split() if "bf16" in w or w in ("avx512f", "amx_tile")
                    )
    except OSError:
        pass
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="L = 1024, fewer repeats")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rounds (default 3, --quick 2 blocked; 5, --quick 3 interleaved)",
    )
    parser.add_argument("--timing", choices=("blocked", "interleaved"), default="blocked")
    parser.add_argument(
        "--per-round",
        type=int,
        default=3,
        help="timed calls per variant and round (--timing blocked)",
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: also time the stacks with S5SSM(precision='bf16') and their floor",
    )
    parser.add_argument("--block", type=int, default=None, help="fused path's FUSED_BLOCK")
    parser.add_argument(
        "--efficiency",
        action="store_true",
        help="only the stacks of --efficiency-methods and the GEMM floors",
    )
    parser.add_argument(
        "--efficiency-methods", default="fused,chunked",
        help="SSM methods whose stack is set against the GEMM floor, comma-separated",
    )  # fmt: skip
    parser.add_argument(
        "--out", default=None, type=out_name,
        help="results/<OUT>-<cpu|gpu>.json (default layer, or with --efficiency "
             "layer-efficiency-<precision>[-block<T>])",
    )  # fmt: skip
    args = parser.parse_args()
    args.efficiency_methods = tuple(
        m.strip() for m in args.efficiency_methods.split(",") if m.strip()
    )
    known = ("fused", *core.SCAN_METHODS)
    if not args.efficiency_methods or any(m not in known for m in args.efficiency_methods):
        parser.error(f"--efficiency-methods: each must be one of {', '.join(known)}")
    if args.block is not None:
        if args.block < 4:
            parser.error("--block must be at least 4")
        _ssm.FUSED_BLOCK = args.block
    if args.efficiency:
        efficiency_only(args)
        return
    H, P_full, J, batch = 128, 256, 8, 8
    L = 1024 if args.quick else 4096
    if args.timing == "blocked":
        repeats = args.repeats or (2 if args.quick else 3)
    else:
        repeats = args.repeats or (3 if args.quick else 5)
    if repeats < 1 or args.per_round < 1:
        parser.error("--repeats and --per-round must be at least 1")

    def timed(fns):
        if args.timing == "blocked":
            return time_blocked(fns, rounds=repeats, per_round=args.per_round)
        return time_interleaved(fns, repeats=repeats)

    methods = ("sequential", "chunked", "fused")
    scan_methods = ("sequential", "chunked")  # the breakdown splits the scan path only
    if core.native_available():  # the C++ kernel (CPU; compiled on first use)
        methods += ("native",)
        scan_methods += ("native",)
    else:
        print(f"native scan not measured: {core.native_build_error()}")
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")

    key = jax.random.PRNGKey(0)
    u = jax.random.normal(jax.random.PRNGKey(1), (batch, L, H), jnp.float32)
    ours = {m: make_ours(args.layers, H, P_full, J, m, key) for m in methods}
    base = [base_params(layer) for layer in ours["sequential"].layers]

    # Same numbers first: every variant computes the same stack.
    y_base = jax.jit(jax.vmap(functools.partial(base_stack, base)))(u)
    run_stack = eqx.filter_jit(lambda stack, u: jax.vmap(stack)(u))
    diffs = {m: float(jnp.max(jnp.abs(run_stack(ours[m], u) - y_base))) for m in methods}
    max_diff = max(diffs.values())
    for m, d in diffs.items():
        print(f"max |ours-{m} - baseline| on the {args.layers}-layer stack output: {d:.2e}")

    step_ours = eqx.filter_jit(ours_step)
    step_base = jax.jit(base_step)
    one_ours = {m: Stack(ours[m].layers[:1]) for m in methods}
    fns = {"baseline/1 layer": functools.partial(step_base, base[:1], u)}
    fns |= {f"ours-{m}/1 layer": functools.partial(step_ours, one_ours[m], u) for m in methods}
    fns[f"baseline/{args.layers} layers"] = functools.partial(step_base, base, u)
    fns |= {
        f"ours-{m}/{args.layers} layers": functools.partial(step_ours, ours[m], u) for m in methods
    }
    times = timed(fns)
    eff_rows, eff_times, floors = time_efficiency(args, u, timed, key, fp32_stacks=ours)

    # Breakdown of one layer (the first), timed separately with the same protocol.
    first = ours["sequential"].layers[0]
    Lambda_bar, B_bar = first.discretized()
    Bu = jax.vmap(lambda v: _ssm._complex_matvecs(v, B_bar))(u)
    xs = jax.vmap(lambda b: core.linear_recurrence(Lambda_bar, b, method="sequential")[0])(Bu)
    parts = {}
    for m in scan_methods:
        comp = components(first, m)
        parts[f"{m}: B_bar u"] = functools.partial(comp["B_bar u"], u)
        parts[f"{m}: 2 scans"] = functools.partial(comp["2 scans"], Bu)
        parts[f"{m}: projection"] = functools.partial(comp["projection"], xs)
    part_times = timed(parts)

    rows = []
    for n in (1, args.layers):
        tag = "1 layer" if n == 1 else f"{n} layers"
        tb = times[f"baseline/{tag}"]["median_s"]
        rows.append({"what": f"baseline {tag}", "ms": tb * 1e3, "speedup": 1.0})
        for m in methods:
            t = times[f"ours-{m}/{tag}"]["median_s"]
            rows.append({"what": f"ours-{m} {tag}", "ms": t * 1e3, "speedup": tb / t})
    print(
        f"timing: {args.timing}, {repeats} rounds"
        + (f" x {args.per_round} calls" if args.timing == "blocked" else "")
    )
    print(f"fwd+bwd, batch {batch}, L {L}, H {H}, P_full {P_full} ({P_full // 2} stored), J {J}")
    print_table(rows, [("what", "variant", "s"), ("ms", "median ms", ".1f"),
                       ("speedup", "baseline / ours", ".2f")])  # fmt: skip
    part_rows = [{"what": k, "ms": v["median_s"] * 1e3} for k, v in part_times.items()]
    print("breakdown of one of our layers' SSM, fwd+bwd of each part alone:")
    print_table(part_rows, [("what", "part", "s"), ("ms", "median ms", ".1f")])

    print_efficiency(eff_rows)

    stack_tag = f"{args.layers} layers"
    best = min(methods, key=lambda m: times[f"ours-{m}/{stack_tag}"]["median_s"])
    ratio = (
        times[f"baseline/{stack_tag}"]["median_s"] / times[f"ours-{best}/{stack_tag}"]["median_s"]
    )
    print(f"{stack_tag}: baseline / ours ({best}) = {ratio:.2f} (target >= 5)")
    path = write_json(args.out or "layer", {
        "benchmark": "layer", "quick": args.quick, "device": info, "repeats": repeats,
        "timing": args.timing, "per_round": args.per_round if args.timing == "blocked" else None,
        "model_note": "layer = u + GELU(S5SSM(u)), no norm/dropout, ours and baseline alike",
        "methods": list(methods),
        "shapes": {"H": H, "P_full": P_full, "P_stored": P_full // 2, "J": J, "L": L,
                   "batch": batch, "layers": args.layers, "bidirectional": True,
                   "conj_sym": True, "dtype": "float32 / complex64"},
        "max_abs_diff_ours_vs_baseline": max_diff, "max_abs_diff_by_method": diffs,
        "stack_speedup_vs_baseline": ratio, "stack_best_method": best,
        "rows": rows, "timings": times, "breakdown": part_times,
        "efficiency": {"rows": eff_rows, "floor_s": floors, "timings": eff_times,
                       "block": _ssm._block_size(L), "cpu_flags_bf16": _bf16_flags(),
                       "methods": list(args.efficiency_methods)},
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
