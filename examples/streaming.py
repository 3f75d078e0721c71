"""Run a trained pendulum model online: one irregularly timed frame at a time.

The paper's pendulum task (§6.3): frames of a swinging pendulum arrive at irregular times and
the model predicts (sin θ, cos θ) at each one. Online, a new frame costs one recurrent step
per layer (`S5Model.step`, O(PH)), with its Δ scaled by the time since the previous frame;
no history is recomputed. The script prints, frame by frame, the prediction, its variance
and the running mean squared error, then checks that the stream gave what the offline model
gives on the whole sequence.

    python examples/streaming.py                    # trains a model briefly first (~1 min)
    python examples/streaming.py --run runs/pendulum  # the model of `make demo`

With `--run`, the run's best checkpoint is used (its data must be prepared, as after
`make demo`). Without it, the paper's pendulum model is trained here for `--train-steps`
optimiser steps on freshly simulated sequences: enough to see it track the pendulum
roughly, far from the paper's 3.4e-3 test MSE.
"""

from __future__ import annotations

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from s5jax.config import load_experiment
from s5jax.data._pendulum import N_KEEP, N_STEPS, sample_pendulum_split
from s5jax.nn import build_model
from s5jax.train import load_run
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps


def simulate(n: int, seed: int):
    """n pendulum sequences observed at N_KEEP irregular times of the N_STEPS simulated:
    frames (n, N_KEEP, 576) in [0, 1], targets (n, N_KEEP, 2), times (n, N_KEEP)."""
    rng = np.random.RandomState(seed)
    arrays = sample_pendulum_split(rng, n)
    keep = np.sort(
        np.stack([rng.choice(N_STEPS, N_KEEP, replace=False) for _ in range(n)]), axis=1
    )
    rows = np.arange(n)[:, None]
    frames = (arrays["obs"][rows, keep] / 255.0).astype(np.float32).reshape(n, N_KEEP, -1)
    targets = arrays["targets"][rows, keep].astype(np.float32)
    return frames, targets, keep.astype(np.float32)


def multipliers(t: np.ndarray) -> np.ndarray:
    """Per-step Δ multipliers [1, t_1 − t_0, …] (as the trainer computes them)."""
    return np.concatenate([np.ones_like(t[..., :1]), np.diff(t, axis=-1)], axis=-1)


def train_briefly(steps: int, seed: int):
    config = load_experiment("pendulum")
    model, state = build_model(config.model, d_input=576, n_outputs=2, key=jax.random.key(seed))
    optimizer, _ = build_optimizer(config.optim, model, steps_per_epoch=steps, epochs=1)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    train = make_steps(static, optimizer, "gaussian").train
    frames, targets, t = simulate(128, seed + 1)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for k in range(steps):
        rows = rng.choice(len(frames), 32, replace=False)
        batch = {
            "x": frames[rows], "y": targets[rows], "mask": np.ones(32, bool),
            "dt": multipliers(t[rows]),
        }  # fmt: skip
        params, state, opt_state, stats = train(
            params, state, opt_state, batch, jax.random.fold_in(jax.random.key(seed), k)
        )
        if (k + 1) % max(1, steps // 5) == 0:
            print(f"  training step {k + 1}/{steps}: loss {float(stats['loss']):.3f}")
    print(f"  trained in {time.perf_counter() - start:.0f} s")
    return eqx.combine(params, static), state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a pendulum run directory (default: train briefly here)")
    parser.add_argument("--train-steps", type=int, default=100, help="without --run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.run:
        run = load_run(args.run, "best")
        model, state = eqx.combine(run.params, run.static), run.model_state
        print(f"model: {args.run} (best checkpoint)")
    else:
        print(f"model: the paper's pendulum model, trained here for {args.train_steps} steps")
        model, state = train_briefly(args.train_steps, args.seed)

    frames, targets, t = simulate(1, args.seed + 1000)  # a sequence the model has not seen
    frames, targets, t = frames[0], targets[0], t[0]
    dt = multipliers(t)

    # Closed over, the parameters are constants of the compiled step: a call passes only
    # the stream state and the new frame.
    step = jax.jit(lambda stream, frame, dt_t: model.step(stream, frame, dt_t=dt_t))
    stream = model.init_state(state)
    squared = 0.0
    means = []
    print(f"\n{'frame':>5} {'time':>5} {'Δt':>4}  {'prediction (sin, cos)':>22}  "
          f"{'target':>15}  {'variance':>17}  running MSE")  # fmt: skip
    for k in range(len(frames)):
        start = time.perf_counter()
        stream, (mean, variance) = step(stream, frames[k], dt[k])
        mean = np.asarray(mean)
        elapsed = time.perf_counter() - start
        means.append(mean)
        squared += float(np.mean((mean - targets[k]) ** 2))
        if k < 5 or (k + 1) % 5 == 0:
            v = np.asarray(variance)
            note = "" if k else f"   (first call compiles: {elapsed * 1e3:.0f} ms)"
            print(f"{k:>5} {t[k]:>5.0f} {dt[k]:>4.0f}  ({mean[0]:+.3f}, {mean[1]:+.3f})"
                  f"{'':>8}  ({targets[k][0]:+.3f}, {targets[k][1]:+.3f})  "
                  f"({v[0]:.4f}, {v[1]:.4f})  {squared / (k + 1):.4f}"
                  f"{note}")  # fmt: skip

    offline, _ = model(jnp.asarray(frames), state, inference=True, dt=jnp.asarray(dt))
    gap = float(np.max(np.abs(np.stack(means) - np.asarray(offline[0]))))
    print(f"\nrunning MSE over {len(frames)} frames: {squared / len(frames):.4f}")
    print(f"largest difference between the stream and the offline model: {gap:.2e}")
    if gap > 1e-4:
        raise SystemExit("the online and offline predictions disagree")


if __name__ == "__main__":
    main()
