"""Online inference: the cost of one new observation, step mode against recomputation.

A user with a stream predicts after every new observation. With `S5Model.step` that costs
one recurrent step of every layer (O(PH) per layer, §3.3 and App. C.2), whatever the length
of the history; without a step mode the user recomputes the offline model on the whole
prefix, O(L·PH). This script measures both for

- `pendulum`: the paper's pendulum model (§6.3; 4 layers, H 30, P 16, the CNN encoder,
  irregular Δ, Gaussian head), frames of 24×24;
- `listops-causal-p16` and `listops-causal-p256`: a ListOps-size causal model (8 layers,
  H 128, P 16 or 256, J 8, BatchNorm in inference mode, half-GLU, embedding encoder, masked
  mean pooling), the ListOps config with `bidirectional = false`;

at batch 1 and 64 streams, with a history of L = 1,000 and 10,000 steps.

What is timed (medians over `--repeats` calls, interleaved; `_common.time_interleaved`):
- `step`: one call of `jax.jit(jax.vmap(model.step), donate_argnums=0)` (the parameters
  closed over, so constants of the compiled step; the old stream state donated), starting
  from the stream state reached after L steps (made with `run_online`) and carried from call
  to call, as an online loop calls it: dispatch included. `step_params_argument`: the
  parameters passed as arguments and nothing donated (every leaf is dispatched at every
  call).
- `step_in_scan`: the per-step cost inside a jitted `run_online` of 256 steps (the cost with
  no per-call dispatch), divided by 256.
- `recompute`: one jitted offline forward (inference mode) on the whole (batch, L + 1)
  prefix: what a new observation costs without a step mode. Where it does not fit in memory
  (the pendulum CNN on 64 × 10,001 frames asks for ~28 GB), the row records the error.
- `gemv`: a jitted matrix-vector product (batch 1) or matrix product (batch B) with as many
  multiply-adds as XLA counts in the step (`cost_analysis()["flops"] / 2`), the O(PH) floor.

Reported per row: µs per step, `recompute / step` (the target is ≥ 100× at L = 10,000),
`step(L=10,000) / step(L=1,000)` (flat in L: about 1), the step's analytic multiply-adds
per stream and XLA's flop count, and `step / gemv` (how far the step is from a GEMV of the
same work). Results: `results/stream-<cpu|gpu>.json` with the device and versions.

    .venv/bin/python benchmarks/stream.py [--quick] [--models pendulum,listops-causal-p16]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import _common
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from s5jax.config import load_experiment
from s5jax.nn import build_model

SCAN_STEPS = 256


def _model(name: str):
    if name == "pendulum":
        cfg = load_experiment("pendulum").model
        model, state = build_model(cfg, d_input=576, n_outputs=2, key=jax.random.PRNGKey(0))
        return cfg, model, state
    P = {"listops-causal-p16": 16, "listops-causal-p256": 256}[name]
    cfg = dataclasses.replace(load_experiment("listops").model, bidirectional=False, ssm_size=P)
    model, state = build_model(
        cfg, d_input=20, n_outputs=10, vocab=20, key=jax.random.PRNGKey(0)
    )
    return cfg, model, state


def _inputs(name: str, B: int, L: int, key):
    if name == "pendulum":
        x = jax.random.uniform(key, (B, L, 576), jnp.float32)
        dt = 1.0 + jax.random.uniform(jax.random.fold_in(key, 1), (B, L))
        return x, dt
    return jax.random.randint(key, (B, L), 0, 20), None


def _multiply_adds(cfg) -> int:
    """Multiply-adds of one online step per stream in the sequence layers (the O(PH) part):
    per layer B̄u (P_stored complex × H real: 2·P·H), Re(C̃x) (2·P·H), the gate's H×H
    products (one for half-GLU, two for full GLU), and D⊙u, norm and Λ̄x (O(P + H))."""
    P = cfg.ssm_size // 2 if cfg.conj_sym else cfg.ssm_size
    H = cfg.d_model
    gates = {"gelu": 0, "half_glu1": 1, "half_glu2": 1, "full_glu": 2}[cfg.activation]
    per_layer = 4 * P * H + gates * H * H + 4 * P + 6 * H
    return cfg.n_layers * per_layer


def _flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # not every backend reports it
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return float(cost.get("flops", 0.0)) or None


def measure(name: str, B: int, L: int, repeats: int) -> dict:
    cfg, model, state = _model(name)
    key = jax.random.PRNGKey(1)
    x, dt = _inputs(name, B, L + SCAN_STEPS + 1, key)
    # The state after L steps of the first stream, copied to the B streams: the step's cost
    # does not depend on the state's values, and this keeps the set-up cheap at B = 64.
    history = x[:1, :L]
    streams = model.init_state(state, batch=1)

    @eqx.filter_jit
    def warm(m, s, xs, dts):
        def one(s1, x1, d1):
            return m.run_online(s1, x1, dt=d1)[0]

        return jax.vmap(one, in_axes=(0, 0, None if dts is None else 0))(s, xs, dts)

    t0 = time.perf_counter()
    dt_history = None if dt is None else dt[:1, :L]
    streams = jax.block_until_ready(warm(model, streams, history, dt_history))
    streams = jax.tree.map(lambda a: jnp.broadcast_to(a, (B, *a.shape[1:])), streams)
    history_s = time.perf_counter() - t0

    params, static = eqx.partition(model, eqx.is_inexact_array)

    def step_fn(params, s, x_t, dt_t):
        m = eqx.combine(params, static)
        if dt_t is None:
            return jax.vmap(lambda s1, x1: m.step(s1, x1))(s, x_t)
        return jax.vmap(lambda s1, x1, d1: m.step(s1, x1, dt_t=d1))(s, x_t, dt_t)

    step = jax.jit(step_fn)

    def closed_fn(s, x_t, dt_t):  # the parameters are constants of the compiled step
        if dt_t is None:
            return jax.vmap(lambda s1, x1: model.step(s1, x1))(s, x_t)
        return jax.vmap(lambda s1, x1, d1: model.step(s1, x1, dt_t=d1))(s, x_t, dt_t)

    # As an online loop calls it: the new stream state replaces the old one, whose buffers
    # are donated (`donate_argnums=0`) and so reused for the output.
    closed = jax.jit(closed_fn, donate_argnums=0)
    carried = {"stream": jax.tree.map(jnp.copy, streams)}

    def chained_step():
        carried["stream"], out = closed(carried["stream"], x_t, dt_t)
        return out
    x_t = x[:, L]
    dt_t = None if dt is None else dt[:, L]
    compiled = step.lower(params, streams, x_t, dt_t).compile()
    flops = _flops(compiled)

    def scan_fn(params, s, xs, dts):
        m = eqx.combine(params, static)

        def one(s1, x1, d1):
            return m.run_online(s1, x1, dt=d1)

        return jax.vmap(one, in_axes=(0, 0, None if dts is None else 0))(s, xs, dts)

    scan = jax.jit(scan_fn)
    xs_scan = x[:, L : L + SCAN_STEPS]
    dts_scan = None if dt is None else dt[:, L : L + SCAN_STEPS]

    def offline_fn(params, xs, dts):
        m = eqx.combine(params, static)
        lengths = jnp.full((xs.shape[0],), xs.shape[1]) if m.pooling == "masked_mean" else None

        def one(x1, d1, n1):
            return m(x1, state, inference=True, dt=d1, lengths=n1)[0]

        return jax.vmap(
            one, in_axes=(0, None if dts is None else 0, None if lengths is None else 0)
        )(xs, dts, lengths)

    offline = jax.jit(offline_fn)
    prefix = x[:, : L + 1]
    dts_prefix = None if dt is None else dt[:, : L + 1]

    n_ma = max(1, round(flops / 2)) if flops else _multiply_adds(cfg) * B
    H = cfg.d_model
    rows = max(1, n_ma // (H * B)) if B > 1 else max(1, n_ma // H)
    W = jax.random.normal(key, (rows, H), jnp.float32)
    v = jax.random.normal(key, (B, H), jnp.float32)
    gemv = jax.jit(lambda W, v: v @ W.T)

    timings = _common.time_interleaved(
        {
            "step": chained_step,
            "step_params_argument": lambda: step(params, streams, x_t, dt_t),
            "step_in_scan": lambda: scan(params, streams, xs_scan, dts_scan),
            "gemv": lambda: gemv(W, v),
        },
        repeats=max(repeats, 15),
    )
    try:
        recompute = _common.time_interleaved(
            {"recompute": lambda: offline(params, prefix, dts_prefix)}, repeats=repeats
        )
        rec_s, rec_error = recompute["recompute"]["median_s"], None
    except jax.errors.JaxRuntimeError as error:  # e.g. the pendulum CNN on 64 × 10,001 frames
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        recompute, rec_s = {}, None
        rec_error = str(error).splitlines()[0][:200]
    step_s = timings["step"]["median_s"]
    scan_step_s = timings["step_in_scan"]["median_s"] / SCAN_STEPS
    return {
        "model": name, "batch": B, "L": L,
        "step_us": step_s * 1e6, "step_in_scan_us": scan_step_s * 1e6,
        "step_params_argument_us": timings["step_params_argument"]["median_s"] * 1e6,
        "recompute_ms": rec_s and rec_s * 1e3, "recompute_error": rec_error,
        "recompute_over_step": rec_s and rec_s / step_s,
        "recompute_over_step_in_scan": rec_s and rec_s / scan_step_s,
        "gemv_us": timings["gemv"]["median_s"] * 1e6,
        "step_over_gemv": step_s / timings["gemv"]["median_s"],
        "step_in_scan_over_gemv": scan_step_s / timings["gemv"]["median_s"],
        "multiply_adds_per_stream_layers": _multiply_adds(cfg),
        "xla_flops_per_call": flops, "history_seconds": history_s,
        "timings": {**timings, **recompute},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="pendulum,listops-causal-p16,listops-causal-p256")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--lengths", default="1000,10000")
    parser.add_argument("--repeats", type=int, default=3, help="calls of the recomputation")
    parser.add_argument(
        "--quick", action="store_true", help="batch 1 only, L = 1,000 and 10,000, 2 repeats"
    )
    args = parser.parse_args()
    batches = [1] if args.quick else [int(b) for b in args.batches.split(",")]
    lengths = [int(v) for v in args.lengths.split(",")]
    repeats = 2 if args.quick else args.repeats
    rows = []
    for name in args.models.split(","):
        for B in batches:
            for L in lengths:
                row = measure(name, B, L, repeats)
                rows.append(row)
                rec = (
                    f"{row['recompute_ms']:.1f} ms = {row['recompute_over_step']:.0f}x"
                    if row["recompute_ms"] is not None
                    else row["recompute_error"]
                )
                print(
                    f"{name} B={B} L={L}: step {row['step_us']:.0f} µs "
                    f"(in scan {row['step_in_scan_us']:.1f} µs), recompute {rec}",
                    flush=True,
                )
    for row in rows:
        same = [
            r for r in rows
            if r["model"] == row["model"] and r["batch"] == row["batch"] and r["L"] == min(lengths)
        ]  # fmt: skip
        row["step_over_step_at_min_L"] = row["step_us"] / same[0]["step_us"] if same else None
    _common.print_table(
        rows,
        [
            ("model", "model", "s"), ("batch", "B", "d"), ("L", "L", "d"),
            ("step_us", "step µs", ".1f"), ("step_in_scan_us", "in scan µs", ".2f"),
            ("recompute_ms", "recompute ms", ".1f"), ("recompute_over_step", "rec/step", ".0f"),
            ("step_over_step_at_min_L", "step/step(L min)", ".2f"),
            ("step_over_gemv", "step/gemv", ".1f"),
            ("step_in_scan_over_gemv", "scan step/gemv", ".1f"),
        ],
    )  # fmt: skip
    path = _common.write_json(
        "stream",
        {
            "device": _common.device_info(),
            "command": "benchmarks/stream.py " + " ".join(
                f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            ),
            "scan_steps": SCAN_STEPS,
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
