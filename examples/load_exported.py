"""Run a model exported by `s5jax export` with jax and numpy only (no s5jax needed).

    python examples/load_exported.py DIR [--data FILE.npz] [--n 4] [--length 16] [--save OUT.npz]

Reads DIR/spec.json, deserialises DIR/forward.jax (the whole-sequence forward) and, for causal
models, DIR/step.jax (one online step of a batch of streams), runs the forward on a few
sequences (from `--data`, keys `x`/`x_test` and optional `lengths`/`t`, or random ones of the
spec's shapes), then feeds the same sequences one step at a time through the step function and
prints how closely the two agree. `--save` writes the inputs and both outputs to an `.npz`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np


def load(folder: Path):
    """(spec, forward, step or None, initial state leaves)."""
    spec = json.loads((folder / "spec.json").read_text())
    forward = jax.export.deserialize(bytearray((folder / "forward.jax").read_bytes()))
    if spec["step"] is None:
        return spec, forward, None, ()
    step = jax.export.deserialize(bytearray((folder / "step.jax").read_bytes()))
    with np.load(folder / "init_state.npz") as npz:
        init = tuple(npz[leaf["name"]] for leaf in spec["state"])
    return spec, forward, step, init


def make_inputs(spec, data: Path | None, n: int, length: int, seed: int = 0) -> dict:
    """x, lengths and dt for the forward: from `data`, or random of the spec's shapes."""
    fixed = spec["forward"]["length"]
    L = length if fixed == "symbolic" else int(spec["forward"]["inputs"][0]["shape"][1])
    rng = np.random.default_rng(seed)
    if data is not None:
        with np.load(data) as npz:
            suffix = "" if "x" in npz.files else "_test"
            x = npz[f"x{suffix}"][:n]
            lengths = npz[f"lengths{suffix}"][:n] if f"lengths{suffix}" in npz.files else None
            t = npz[f"t{suffix}"][:n] if f"t{suffix}" in npz.files else None
        L = x.shape[1]
    else:  # random tokens or features at irregular times
        lengths, t = None, np.cumsum(rng.uniform(0.5, 1.5, (n, L)), axis=1)
        if spec["vocab_size"] is not None:
            x = rng.integers(0, spec["vocab_size"], (n, L))
        else:
            x = rng.standard_normal((n, L, spec["d_input"]))
    tokens = spec["vocab_size"] is not None
    inputs = {"x": x.astype(np.int32 if tokens else np.float32)}
    if lengths is None:
        lengths = np.full(len(x), L)
    inputs["lengths"] = lengths.astype(np.int32)
    if t is None:
        dt = np.ones((len(x), L), np.float32)
    else:  # Δ multipliers as in training: 1 at the first step, then t_k - t_(k-1)
        dt = np.concatenate([np.ones_like(t[:, :1]), np.diff(t, axis=1)], axis=1)
    inputs["dt"] = dt.astype(np.float32)
    return inputs


def run_forward(spec, forward, inputs: dict):
    names = [i["name"] for i in spec["forward"]["inputs"]]
    return forward.call(*(inputs[name] for name in names))


def run_steps(spec, step, init, inputs: dict):
    """Feed each sequence one step at a time; keep the step outputs the forward gives."""
    x, dt, lengths = inputs["x"], inputs["dt"], inputs["lengths"]
    n, L = x.shape[:2]
    state = tuple(np.broadcast_to(leaf, (n, *leaf.shape)) for leaf in init)
    outs = []
    for k in range(L):
        reset = np.full((n,), k == 0)
        state, out = step.call(state, x[:, k], dt[:, k], reset)
        outs.append(jax.tree.map(np.asarray, out))
    stacked = jax.tree.map(lambda *o: np.stack(o, axis=1), *outs)  # (n, L, ...)
    if spec["pooling"] == "none":
        return stacked
    # A pooled head's prediction is its output after the last step the forward pools.
    last = lengths - 1 if spec["pooling"] == "masked_mean" else np.full(n, L - 1)
    return jax.tree.map(lambda o: o[np.arange(n), last], stacked)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the folder written by `s5jax export`")
    parser.add_argument("--data", type=Path, help="an .npz with x (or x_test), lengths, t")
    parser.add_argument("--n", type=int, default=4, help="sequences to run (default 4)")
    parser.add_argument("--length", type=int, default=16, help="random sequences' length")
    parser.add_argument("--save", type=Path, help="write inputs and outputs to this .npz")
    args = parser.parse_args(argv)
    if not (args.folder / "spec.json").is_file():
        parser.error(f"{args.folder} holds no spec.json: give a folder written by `s5jax export`")
    spec, forward, step, init = load(args.folder)
    inputs = make_inputs(spec, args.data, args.n, args.length)
    names = [o["name"] for o in spec["forward"]["outputs"]]
    offline = jax.tree.leaves(jax.tree.map(np.asarray, run_forward(spec, forward, inputs)))
    shapes = {k: list(v.shape) for k, v in zip(names, offline, strict=True)}
    report = {"n": len(inputs["x"]), "outputs": shapes}
    saved = {**inputs, **{f"forward_{k}": v for k, v in zip(names, offline, strict=True)}}
    if step is None:
        report["step"] = f"none: {spec['no_step']}"
    else:
        online = jax.tree.leaves(run_steps(spec, step, init, inputs))
        saved |= {f"step_{k}": v for k, v in zip(names, online, strict=True)}
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(offline, online, strict=True))
        report["max_abs_difference_forward_vs_step"] = diff
    print(json.dumps(report))
    if args.save is not None:
        np.savez(args.save, **saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
