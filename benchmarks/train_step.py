"""One whole training step of ours against the authors' whole model, for every paper config.

For each config (`s5jax.config.load_experiment(task)`): our model from `s5jax.nn.build_model`,
our optimiser from `s5jax.train._optim.build_optimizer` and our jitted step from
`s5jax.train._steps.make_steps` (the step `s5jax train` runs: loss, gradients, optax update,
BatchNorm state, dropout, buffers donated); against `benchmarks/baseline_model.py` holding the
same parameters (`from_ours`) with the authors' step (`value_and_grad`, optax
`multi_transform` of Adam and AdamW, not donated). Inputs are random, of the task's shape:
token ids below the one-hot width (the baseline gets the one-hot floats its `prep_batch` makes
on the host, outside the timed step), pixels/samples in [0, 1), pendulum frames with irregular
Δ multipliers; random labels.

Timing (`_common.time_interleaved`): both steps compiled and called once, then called in turn
(ours, base, ours, base, ...) for `--repeats` rounds, each call ended by
`jax.block_until_ready` and fed the parameters, statistics and optimiser state the previous
call of the same step returned (as a training loop does). Medians; ratio = baseline median /
ours median, from the same run.

`--ceiling` also times our step with every SSM replaced by its feed-through (y = D ⊙ u; the
rest of the model unchanged): the time of everything both models share, so baseline / that is
the largest ratio any SSM, however fast, could give (`ceiling` in the JSON and the table).
`--no-scan` also times our step with every recurrence replaced by its input (x = B̄u: the
SSM's matrix products B̄u and C̃x, the feed-through and everything else kept, as the chunked
path computes them): baseline / that is the largest ratio any scan, however fast, could give
with our products (`scan_ceiling`). `--precision bf16` builds ours with `model.precision =
"bf16"` (bfloat16 matrix products, float32 accumulation, parameters and state; every variant
of ours), the baseline staying float32 as the authors' code is; `--precision fp32,bf16` times
ours in each precision in the same interleaved run (variants `ours[<method>/<precision>]`,
every method in every precision; `--ceiling` and `--no-scan` in the first precision).

`--methods auto,fused,chunked` times our step once per SSM method (`model.scan_method`; default
`auto`, what `s5jax train` runs) in the same interleaved run, each against the same baseline:
the columns `ours_ms`/`ratio` are the first method's, `methods` in the JSON has every one.

`--isolate` runs every step in a process of its own (spawned; each builds its model, compiles
its step alone and times its calls) and still calls them in turn, round by round: in one
process our step ran slower once the authors' program had been compiled beside it (ListOps'
float32 step 150–162 → 172–185 ms), theirs did not beside ours (`docs/results.md`).

Batch and length: the paper's where they fit this machine's memory and time, else smaller, the
same for both (`--batch N` and `--length N` cap every config; `--paper` uses the paper's
shapes everywhere). The JSON and the table record the shapes used and the paper's.

    .venv/bin/python benchmarks/train_step.py [--configs listops,text,...] [--repeats N]
        [--batch N] [--length N] [--paper] [--methods auto,fused,...] [--ceiling] [--no-scan]
        [--precision fp32|bf16|fp32,bf16] [--isolate] [--out NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import os
import time

import baseline_model as base
import equinox as eqx
import jax
import jax.numpy as jnp
from _common import (
    _summary,
    _timed_call,
    device_info,
    out_name,
    print_table,
    time_interleaved,
    write_json,
)

from s5jax.config import load_experiment
from s5jax.core import SCAN_METHODS
from s5jax.core._ssm import resolve_ssm_method
from s5jax.nn import S5SSM, build_model
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps

# Input width (one-hot width for token tasks: the authors' IN_DIM, datasets.md) and outputs.
TASKS = {
    "listops": {"vocab": 20, "n_outputs": 10},
    "text": {"vocab": 135, "n_outputs": 2},
    "retrieval": {"vocab": 98, "n_outputs": 2},  # AAN: len(vocab) of the train tokens
    "image": {"d_input": 1, "n_outputs": 10},
    "pathfinder": {"d_input": 1, "n_outputs": 2},
    "pathx": {"d_input": 1, "n_outputs": 2},
    "speech": {"d_input": 1, "n_outputs": 35},
    "pendulum": {"d_input": 576, "n_outputs": 2},
    "smnist": {"d_input": 1, "n_outputs": 10},
    "psmnist": {"d_input": 1, "n_outputs": 10},
    "scifar": {"d_input": 3, "n_outputs": 10},
}

# The shapes used on a 2-core CPU by default (batch, length): the paper's batch where one
# baseline step stays within a few seconds, else smaller; Path-X and Speech also shorter.
# sMNIST and psMNIST run at the paper's batch 50 (a baseline step 1.7-2.4 s on a 2-core Xeon,
# 2026-11-27; until then batch 8, so older results files differ there).
CPU_SHAPES = {
    "listops": (8, None),
    "text": (4, None),
    "retrieval": (2, None),
    "image": (4, None),
    "pathfinder": (4, None),
    "pathx": (1, 4096),
    "speech": (1, 8000),
    "pendulum": (None, None),
    "smnist": (None, None),
    "psmnist": (None, None),
    "scifar": (2, None),
}


def shapes(task: str, batch: int | None, length: int | None, paper: bool) -> dict:
    cfg = load_experiment(task)
    pb, pl = cfg.data.batch_size, cfg.data.seq_len
    cb, cl = (None, None) if paper else CPU_SHAPES[task]
    b = min(x for x in (pb, cb, batch) if x is not None)
    n = min(x for x in (pl, cl, length) if x is not None)
    m = cfg.model
    return {
        "task": task, "batch": b, "L": n, "paper_batch": pb, "paper_L": pl,
        "n_layers": m.n_layers, "H": m.d_model, "P_full": m.ssm_size, "J": m.blocks,
        "bidirectional": m.bidirectional, "norm": m.norm, "prenorm": m.prenorm,
        "activation": m.activation, "dropout": m.dropout, "encoder": m.encoder,
        "head": m.head, **TASKS[task],
    }  # fmt: skip


def random_batch(task: str, s: dict, key) -> dict:
    B, L = s["batch"], s["L"]
    kx, ky, kl, kt = jax.random.split(key, 4)
    if task == "retrieval":
        x = jax.random.randint(kx, (B, 2, L), 0, s["vocab"], jnp.int32)
        lengths = jax.random.randint(kl, (B, 2), L // 2, L + 1, jnp.int32)
    elif "vocab" in s:
        x = jax.random.randint(kx, (B, L), 0, s["vocab"], jnp.int32)
        lengths = jax.random.randint(kl, (B,), L // 2, L + 1, jnp.int32)
    else:
        x = jax.random.uniform(kx, (B, L, s["d_input"]), jnp.float32)
        lengths = None
    batch = {"x": x, "mask": jnp.ones((B,), bool)}
    if lengths is not None:
        batch["lengths"] = lengths
    if task == "pendulum":
        batch["y"] = jax.random.normal(ky, (B, L, 2), jnp.float32)
        gaps = jax.random.uniform(kt, (B, L - 1), jnp.float32, 0.5, 3.0)
        batch["dt"] = jnp.concatenate([jnp.ones((B, 1), jnp.float32), gaps], axis=1)
    else:
        batch["y"] = jax.random.randint(ky, (B,), 0, s["n_outputs"], jnp.int32)
    return batch


def build_ours(cfg, s: dict, method: str, init=None):
    """Our model for `model.scan_method = method` and the jitted step `s5jax train` runs:
    `(model, step, (params, state, opt_state))`. `init` makes the optimiser state from
    `(optimizer.init, params)` (default: calls it; `jax.eval_shape` for shapes only)."""
    model_cfg = dataclasses.replace(cfg.model, scan_method=method)
    model, state = build_model(
        model_cfg, d_input=s.get("d_input", s.get("vocab")), n_outputs=s["n_outputs"],
        vocab=s.get("vocab"), key=jax.random.PRNGKey(0),
    )  # fmt: skip
    optimizer, _ = build_optimizer(cfg.optim, model, steps_per_epoch=100, epochs=cfg.train.epochs)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = (init or (lambda f, p: f(p)))(optimizer.init, params)
    step = make_steps(static, optimizer, cfg.model.head).train
    return model, step, (params, state, opt_state)


def build_baseline(cfg, model, state, init=None):
    """The authors' model (`baseline_model.py`) holding `model`'s parameters and `state`'s
    BatchNorm statistics, with their optimiser: `(spec, step, (params, stats, opt_state))`.
    `init` as in `build_ours`."""
    spec, bparams, bstats = base.from_ours(model, state)
    # Copies: our step donates its buffers, which `from_ours` would otherwise share.
    bparams, bstats = jax.tree_util.tree_map(jnp.copy, (bparams, bstats))
    lr = cfg.optim.ssm_lr * cfg.optim.lr_factor
    b_opt = base.make_optimizer(
        bparams, ssm_lr=cfg.optim.ssm_lr, lr=lr, weight_decay=cfg.optim.weight_decay
    )
    opt_state = (init or (lambda f, p: f(p)))(b_opt.init, bparams)
    return spec, base.make_train_step(spec, b_opt), (bparams, bstats, opt_state)


def auto_method(task: str, s: dict, precision: str = "fp32") -> tuple[str, int]:
    """What `scan_method = "auto"` runs for `task` at shapes `s` and `model.precision` on this
    backend, and the stored states of one sequence in one layer (L × P × directions). The
    pendulum's per-step Δ runs `"auto"`'s scan whatever the length (never the fused path)."""
    m = load_experiment(task).model
    states = s["L"] * m.state_size * (2 if m.bidirectional else 1)
    if task == "pendulum":
        return resolve_ssm_method("auto"), states
    mm = jnp.bfloat16 if precision == "bf16" else None
    return resolve_ssm_method("auto", states=states, matmul_dtype=mm), states


PRECISIONS = ("fp32", "bf16")


def parse_precisions(parser, value: str) -> tuple[str, ...]:
    """`--precision` as a tuple of distinct names, each checked (`parser.error` otherwise)."""
    names = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
    if not names or any(p not in PRECISIONS for p in names):
        parser.error(f"--precision: each must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return names


def variant_label(method: str, precision: str, precisions) -> str:
    """The key of one variant in a row's `methods` (the method, with its precision when
    several are timed)."""
    return method if len(precisions) == 1 else f"{method}/{precision}"


def variant_name(method: str, precision: str, methods, precisions) -> str:
    """The timing key of ours for one method and precision: `"ours"` when it is the only
    variant, else `"ours[<variant_label>]"`."""
    if len(methods) == 1 and len(precisions) == 1:
        return "ours"
    return f"ours[{variant_label(method, precision, precisions)}]"


def parse_configs_and_methods(parser, args) -> tuple[list[str], tuple[str, ...]]:
    """`--configs` and `--methods` as lists, each name checked (`parser.error` otherwise)."""
    tasks = [t.strip() for t in args.configs.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            parser.error(f"--configs: {t!r} is not one of {', '.join(TASKS)}")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    known = ("auto", "fused", *SCAN_METHODS)
    if not methods or any(m not in known for m in methods):
        parser.error(f"--methods: each must be one of {', '.join(known)}, got {args.methods!r}")
    return tasks, methods


def _ours(cfg, s: dict, batch: dict, key, method: str):
    """Our jitted step (the one `s5jax train` runs) for `model.scan_method = method`, as a
    zero-argument callable that feeds each call the state the previous one returned."""
    model, ours_step, carry = build_ours(cfg, s, method)
    state = carry[1]
    ours = {"carry": carry}

    def run_ours():
        p, st, o, stats = ours_step(*ours["carry"], batch, key)
        ours["carry"] = (p, st, o)
        return stats["loss"]

    return run_ours, model, state


NO_SSM = "ours[no SSM]"


@contextlib.contextmanager
def _feed_through_only():
    """While tracing: every S5SSM computes only y = D ⊙ u (for `--ceiling`)."""
    original = S5SSM.__call__
    S5SSM.__call__ = lambda self, u, **kwargs: u.astype(self.D.dtype) * self.D[None, :]
    try:
        yield
    finally:
        S5SSM.__call__ = original


NO_SCAN = "ours[no scan]"


@contextlib.contextmanager
def _products_only():
    """While tracing: every recurrence returns its input (x = B̄u), so an S5SSM computes only
    its products and feed-through (for `--no-scan`; the variant is built with `"chunked"`)."""
    kernels = dict(SCAN_METHODS)
    SCAN_METHODS.update({name: (lambda a, b, reverse: b) for name in SCAN_METHODS})
    try:
        yield
    finally:
        SCAN_METHODS.update(kernels)


def _tracing(name: str):
    """The patch under which variant `name` is traced (at its first call in `build`)."""
    if name == NO_SSM:
        return _feed_through_only()
    if name == NO_SCAN:
        return _products_only()
    return contextlib.nullcontext()


def build(
    task: str, s: dict, methods=("auto",), ceiling=False, no_scan=False, precision="fp32",
    only: str | None = None,
):  # fmt: skip
    """`{name: zero-argument callable}` for ours (one per SSM method and precision, named by
    `variant_name`), the baseline and the `ceiling`/`no_scan` variants, and the compile
    seconds. `precision` is our model's `model.precision`, or a tuple of them (the baseline is
    float32; `ceiling`/`no_scan` use the first). `only`: compile and return that variant
    alone (the others are built, as the baseline needs our model's parameters, but never
    traced or compiled: `--isolate`)."""
    precisions = (precision,) if isinstance(precision, str) else tuple(precision)
    base_cfg = load_experiment(task)
    batch = random_batch(task, s, jax.random.PRNGKey(1))
    key = jax.random.PRNGKey(2)
    fns = {}
    first = None
    for p in precisions:
        model_cfg = dataclasses.replace(base_cfg.model, precision=p)
        cfg_p = dataclasses.replace(base_cfg, model=model_cfg)
        for method in methods:
            name = variant_name(method, p, methods, precisions)
            fns[name], model_p, state_p = _ours(cfg_p, s, batch, key, method)
            first = first or (cfg_p, model_p, state_p)
    cfg, model, state = first  # the first precision's: the variants below and the baseline's
    if ceiling:
        fns[NO_SSM], _, _ = _ours(cfg, s, batch, key, methods[0])
    if no_scan:
        fns[NO_SCAN], _, _ = _ours(cfg, s, batch, key, "chunked")
    spec, b_step, b_carry = build_baseline(cfg, model, state)
    b_batch = base.model_inputs(spec, batch)
    theirs = {"carry": b_carry}

    def run_base():
        p, st, o, loss = b_step(*theirs["carry"], b_batch, key)
        theirs["carry"] = (p, st, o)
        return loss

    fns["baseline"] = run_base
    if only is not None:
        fns = {only: fns[only]}
    compile_s = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        with _tracing(name):
            jax.block_until_ready(fn())  # compile (traced here) + first call
        compile_s[name] = time.perf_counter() - t0
    return fns, compile_s


def variant_names(methods, precisions, ceiling=False, no_scan=False) -> list[str]:
    """The names `build` gives its callables, in its order."""
    names = [variant_name(m, p, methods, precisions) for p in precisions for m in methods]
    return names + [NO_SSM] * ceiling + [NO_SCAN] * no_scan + ["baseline"]


def _isolated_worker(conn, task, s, methods, ceiling, no_scan, precisions, name):
    """One `--isolate` process: builds and compiles `name`'s step alone, sends its first-call
    seconds, then times one call per "run" message (`_common._timed_call`) until None."""
    fns, compile_s = build(task, s, methods, ceiling, no_scan, precisions, only=name)
    conn.send(compile_s[name])
    while conn.recv() is not None:
        conn.send(_timed_call(fns[name]))


def time_isolated(task, s, methods, ceiling, no_scan, precisions, repeats):
    """(timings as `time_interleaved` gives them, compile seconds) with every variant in its own
    process (multiprocessing, spawned), called in turn for `repeats` rounds: one runs while the
    others wait. No process holds another's compiled program: in one process, our ListOps step
    ran 150–162 ms alone and 172–185 ms once the authors' step had been compiled beside it,
    while theirs was unchanged by ours (416.5 / 423.5, 419.2 / 421.1 ms; `docs/results.md`)."""
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    try:
        for name in variant_names(methods, precisions, ceiling, no_scan):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_isolated_worker, daemon=True,
                args=(child, task, s, methods, ceiling, no_scan, precisions, name),
            )  # fmt: skip
            proc.start()
            child.close()
            workers[name] = (proc, parent)
        compile_s = {name: conn.recv() for name, (_, conn) in workers.items()}
        calls = {name: [] for name in workers}
        for _ in range(repeats):
            for name, (_, conn) in workers.items():
                conn.send("run")
                calls[name].append(conn.recv())
        for _, conn in workers.values():
            conn.send(None)
    except EOFError as error:
        dead = [n for n, (p, _) in workers.items() if not p.is_alive()]
        raise RuntimeError(f"{task}: a timing process ended early ({', '.join(dead)})") from error
    finally:
        for proc, _ in workers.values():
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    return _summary(calls), compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(TASKS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=None, help="cap on every config's batch")
    parser.add_argument("--length", type=int, default=None, help="cap on every sequence length")
    parser.add_argument("--paper", action="store_true", help="the paper's batch and length")
    parser.add_argument(
        "--methods", default="auto", help="SSM methods of ours (model.scan_method), comma-separated"
    )
    parser.add_argument(
        "--ceiling", action="store_true", help="also time ours without the SSM (y = D u)"
    )
    parser.add_argument(
        "--no-scan", action="store_true",
        help="also time ours with every recurrence replaced by its input (x = B̄u)",
    )  # fmt: skip
    parser.add_argument(
        "--precision", default="fp32",
        help="our model's model.precision (bf16: bfloat16 products), or several comma-separated "
        "(each timed in the same run); the baseline stays fp32",
    )  # fmt: skip
    parser.add_argument(
        "--isolate", action="store_true",
        help="every step in its own process (spawned), called in turn: no compiled program "
        "of one beside another's",
    )  # fmt: skip
    parser.add_argument(
        "--out", default="train-step", type=out_name, help="results/<OUT>-<cpu|gpu>.json"
    )
    args = parser.parse_args()
    tasks, methods = parse_configs_and_methods(parser, args)
    precisions = parse_precisions(parser, args.precision)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")

    results, rows = [], []
    for task in tasks:
        s = shapes(task, args.batch, args.length, args.paper)
        print(f"{task}: batch {s['batch']} (paper {s['paper_batch']}), L {s['L']} "
              f"(paper {s['paper_L']})", flush=True)  # fmt: skip
        if args.isolate:
            times, compile_s = time_isolated(
                task, s, methods, args.ceiling, args.no_scan, precisions, args.repeats
            )
            fns = None
        else:
            fns, compile_s = build(task, s, methods, args.ceiling, args.no_scan, precisions)
            times = time_interleaved(fns, repeats=args.repeats, warmup=0)
        b = times["baseline"]["median_s"]
        per_method = {}
        for p in precisions:
            for m in methods:
                o = times[variant_name(m, p, methods, precisions)]["median_s"]
                label = variant_label(m, p, precisions)
                per_method[label] = {"ours_ms": o * 1e3, "ratio": b / o}
                print(f"  ours ({label}) {o * 1e3:.0f} ms, baseline {b * 1e3:.0f} ms: "
                      f"{b / o:.2f}x", flush=True)  # fmt: skip
        first = variant_label(methods[0], precisions[0], precisions)
        row = {"task": task, "batch": s["batch"], "L": s["L"], "P": s["P_full"],
               "ours_ms": per_method[first]["ours_ms"], "base_ms": b * 1e3,
               "ratio": per_method[first]["ratio"],
               "auto_resolves_to": auto_method(task, s, precisions[0])[0]}  # fmt: skip
        if len(precisions) > 1:
            row["auto_resolves_to_per_precision"] = {
                p: auto_method(task, s, p)[0] for p in precisions
            }
        if args.ceiling:
            n = times[NO_SSM]["median_s"]
            row["no_ssm_ms"], row["ceiling"] = n * 1e3, b / n
            print(f"  ours without the SSM {n * 1e3:.0f} ms: ceiling {b / n:.2f}x", flush=True)
        if args.no_scan:
            n = times[NO_SCAN]["median_s"]
            row["no_scan_ms"], row["scan_ceiling"] = n * 1e3, b / n
            print(f"  ours without the scans {n * 1e3:.0f} ms: {b / n:.2f}x", flush=True)
        rows.append(row)
        results.append({"shapes": s, "timings": times, "first_call_s": compile_s,
                        "methods": per_method, **row})  # fmt: skip
        del fns
        path = write_json(args.out, {
            "benchmark": "train_step", "device": info, "repeats": args.repeats,
            "methods": methods, "ceiling": args.ceiling, "no_scan": args.no_scan,
            "precision": ",".join(precisions), "precisions": precisions,
            "auto_on_this_backend": resolve_ssm_method("auto"),  # per row: auto_resolves_to
            "load_average_1_5_15": os.getloadavg(),
            "protocol": ("isolated: one process per step, " if args.isolate else "")
            + "interleaved (ours, baseline, ...), medians; ratio = baseline / ours",
            "isolate": args.isolate,
            "shape_caps": {"batch": args.batch, "length": args.length, "paper": args.paper,
                           "cpu_defaults": None if args.paper else CPU_SHAPES},
            "results": results, "rows": rows,
        })  # fmt: skip  # after every config: a partial run keeps what it measured

    print()
    columns = [
        ("task", "config", "s"), ("batch", "batch", "d"), ("L", "L", "d"), ("P", "P", "d"),
        ("ours_ms", "ours ms", ".0f"), ("base_ms", "baseline ms", ".0f"),
        ("ratio", "base/ours", ".2f"),
    ]  # fmt: skip
    if args.ceiling:
        columns += [("no_ssm_ms", "no-SSM ms", ".0f"), ("ceiling", "ceiling", ".2f")]
    if args.no_scan:
        columns += [("no_scan_ms", "no-scan ms", ".0f"), ("scan_ceiling", "scan ceiling", ".2f")]
    print_table(rows, columns)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
