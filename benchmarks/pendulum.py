"""Pendulum training step (issue 4): our CNN encoder against the per-frame definition.

Times, interleaved in one run:
- `reference CNN`: forward + gradient of the App. G.3.8 encoder written as the definition,
  per frame with Equinox layers (conv → ReLU → max-pool, twice; vmapped over frames);
- `s5jax CNN`: forward + gradient of `PendulumCNN.features` (exactly equal, cheaper form);
- `train step`: one full jitted training step of the paper's pendulum model (batch 32,
  L = 50, 24×24 frames), as `s5jax train pendulum` runs it.

    .venv/bin/python benchmarks/pendulum.py [--repeats N]
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import device_info, time_interleaved, write_json

from s5jax.config import load_experiment
from s5jax.nn import build_model
from s5jax.train._optim import build_optimizer
from s5jax.train._steps import make_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    cfg = load_experiment("pendulum")
    batch, L = cfg.data.batch_size, 50
    model, state = build_model(cfg.model, d_input=576, n_outputs=2, key=jax.random.PRNGKey(0))
    cnn = model.encoder
    frames = jax.random.uniform(jax.random.PRNGKey(1), (batch * L, 576))
    pool = eqx.nn.MaxPool2d(2, stride=2)

    def reference_frame(c, pixels):
        x = pixels.reshape(1, 24, 24)
        x = pool(jax.nn.relu(c.conv1(x)))
        x = pool(jax.nn.relu(c.conv2(x)))
        return jax.nn.relu(c.hidden(jnp.transpose(x, (1, 2, 0)).reshape(-1)))

    def ref_loss(c):
        return jnp.mean(jax.vmap(lambda p: reference_frame(c, p))(frames) ** 2)

    def our_loss(c):
        return jnp.mean(c.features(frames) ** 2)

    ref_grad = eqx.filter_jit(eqx.filter_value_and_grad(ref_loss))
    our_grad = eqx.filter_jit(eqx.filter_value_and_grad(our_loss))
    diff = float(jnp.max(jnp.abs(jax.vmap(lambda p: reference_frame(cnn, p))(frames)
                                 - cnn.features(frames))))  # fmt: skip

    train_step, _ = pendulum_steps(cfg, model, state)
    timings = time_interleaved(
        {"reference CNN": lambda: ref_grad(cnn), "s5jax CNN": lambda: our_grad(cnn),
         "train step": train_step},
        repeats=args.repeats,
    )  # fmt: skip
    ratio = timings["reference CNN"]["median_s"] / timings["s5jax CNN"]["median_s"]
    print(f"{'what':16s} {'median ms':>10s}")
    for name, t in timings.items():
        print(f"{name:16s} {t['median_s'] * 1000:10.1f}")
    print(f"CNN forward+gradient: s5jax {ratio:.2f}x faster than the per-frame definition "
          f"(max |difference| of the features {diff:.2e})")  # fmt: skip
    path = write_json("pendulum", {
        "benchmark": "pendulum", "device": device_info(), "repeats": args.repeats,
        "shapes": {"batch": batch, "L": L, "frame": [24, 24, 1], "H": cfg.model.d_model},
        "timings": timings, "cnn_speedup_vs_definition": ratio, "max_abs_feature_diff": diff,
    })  # fmt: skip
    print(f"wrote {path}")


def _pendulum_batch(rng: np.random.Generator, batch: int, L: int) -> dict:
    return {
        "x": jnp.asarray(rng.random((batch, L, 576), np.float32)),
        "y": jnp.asarray(rng.standard_normal((batch, L, 2)).astype(np.float32)),
        "mask": jnp.ones((batch,), bool),
        "dt": jnp.asarray(rng.integers(1, 4, (batch, L)).astype(np.float32)),
    }


def pendulum_steps(cfg, model, state, L: int = 50):
    """Zero-argument callables for one jitted training step (batch `cfg.data.batch_size`)
    and one evaluation step (batch `cfg.data.eval_batch_size`) of the pendulum model, as
    `s5jax train pendulum` runs them, on random frames. Each returns a scalar to block on."""
    optimizer, _ = build_optimizer(cfg.optim, model, steps_per_epoch=62, epochs=cfg.train.epochs)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    params = jax.tree_util.tree_map(jnp.copy, params)  # donated by the step: keep `model` alive
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(params)
    steps = make_steps(static, optimizer, cfg.model.head)
    rng = np.random.default_rng(0)
    train_batch = _pendulum_batch(rng, cfg.data.batch_size, L)
    eval_batch = _pendulum_batch(rng, cfg.data.eval_batch_size or cfg.data.batch_size, L)
    train = steps.train  # jitted, buffers donated: the carry is replaced each call
    carry = {"p": params, "s": state, "o": opt_state}

    def train_step():
        carry["p"], carry["s"], carry["o"], stats = train(
            carry["p"], carry["s"], carry["o"], train_batch, jax.random.PRNGKey(0)
        )
        return stats["loss"]

    def eval_step():
        return steps.evaluate(carry["p"], carry["s"], eval_batch, 1.0)["loss_sum"]

    return train_step, eval_step


if __name__ == "__main__":
    main()
