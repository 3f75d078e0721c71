"""A whole training epoch against the sum of its jitted steps (issue 20 §3).

Builds an experiment's run as `s5jax train` does (`s5jax.train._engine._Run`), compiles its
steps, then alternates two kinds of epoch, `--epochs` of each, interleaved (M N M N …) so
that load from other processes on a shared machine falls on both alike:

- measurement (`M`): every batch is made and placed on the device first (untimed), then the
  jitted train step is called and `jax.block_until_ready`-ed, timed alone; likewise every
  val and test evaluation step. The sums are "the sum of its jitted steps".
- normal (`N`): `_Run.train_epoch` (batches made and placed, steps dispatched, statistics
  fetched every `train.log_every` steps and at the end, one step record logged per
  `log_every` steps to a temporary run directory), then `_Run.evaluate("val")` and
  `_Run.evaluate("test")`, timed by the wall clock as a run spends them.

Reported: train epoch wall / sum of train steps, and (train + val + test) wall / sum of all
their steps; medians over the epochs. Both kinds train the model (the parameters move on),
so every epoch is a real one of the same shapes.

    .venv/bin/python benchmarks/epoch.py [EXPERIMENT] [--epochs N] [--set K=V ...] [--out NAME]

The pendulum needs its data: `S5JAX_DATA=/tmp/pend/data s5jax data prepare pendulum`.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import jax
from _common import device_info, print_table, write_json

from s5jax.config import apply_overrides, load_experiment
from s5jax.data._batches import iterate_batches
from s5jax.train._datasets import load_dataset
from s5jax.train._engine import _host_batch, _Run
from s5jax.train._logging import MetricsLogger


def _timed_steps(run: _Run, epoch: int, step: int) -> tuple[int, float]:
    """One measurement epoch: the summed time of its train steps, each blocked on."""
    total = 0.0
    batches = iterate_batches(
        run.dataset.splits["train"],
        run.batch_size,
        shuffle=True,
        seed=run.config.train.seed,
        epoch=epoch,
        drop_last=True,
    )
    for batch in batches:
        key = jax.random.fold_in(run.train_key, step)
        device_batch = jax.block_until_ready(run.parallel.shard(_host_batch(batch, run.head)))
        jax.block_until_ready(key)
        start = time.perf_counter()
        out = run.steps.train(run.params, run.model_state, run.opt_state, device_batch, key)
        jax.block_until_ready(out)
        total += time.perf_counter() - start
        run.params, run.model_state, run.opt_state, _ = out
        step += 1
    return step, total


def _timed_eval_steps(run: _Run, split_name: str) -> float:
    total = 0.0
    split = run.dataset.splits[split_name]
    for batch in iterate_batches(split, run.eval_batch_size, shuffle=False, pad_last=True):
        device_batch = jax.block_until_ready(run.parallel.shard(_host_batch(batch, run.head)))
        start = time.perf_counter()
        jax.block_until_ready(run.steps.evaluate(run.params, run.model_state, device_batch, 1.0))
        total += time.perf_counter() - start
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default="pendulum")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each kind (default 3)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--out", default=None, help="results/<OUT>-<cpu|gpu>.json (default epoch-<experiment>)"
    )
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    cfg = apply_overrides(load_experiment(args.experiment), args.set)
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    dataset = load_dataset(cfg.data)
    with tempfile.TemporaryDirectory() as tmp:
        run = _Run(cfg, Path(tmp), dataset, io.StringIO())
        run.build()
        logger = MetricsLogger(Path(tmp) / "run")
        # Compile and warm up both steps (one training epoch of the measurement kind).
        step, _ = _timed_steps(run, 0, 0)
        _timed_eval_steps(run, "val")
        rows = {"steps": [], "epoch": [], "evals": [], "eval_wall": []}
        epoch = 1
        for _ in range(args.epochs):
            step, steps_s = _timed_steps(run, epoch, step)
            evals_s = _timed_eval_steps(run, "val") + _timed_eval_steps(run, "test")
            rows["steps"].append(steps_s)
            rows["evals"].append(evals_s)
            epoch += 1
            start = time.perf_counter()
            step, _ = run.train_epoch(epoch, step, logger, False)
            train_wall = time.perf_counter() - start
            start = time.perf_counter()
            run.evaluate("val")
            run.evaluate("test")
            rows["epoch"].append(train_wall)
            rows["eval_wall"].append(time.perf_counter() - start)
            epoch += 1
            print(
                f"steps {steps_s:.3f} s, epoch {train_wall:.3f} s "
                f"({train_wall / steps_s:.3f}); eval steps {evals_s:.3f} s, "
                f"eval {rows['eval_wall'][-1]:.3f} s"
            )
        logger.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    train_ratio = med["epoch"] / med["steps"]
    whole_ratio = (med["epoch"] + med["eval_wall"]) / (med["steps"] + med["evals"])
    table = [
        {"what": "train: epoch wall / sum of steps", "a": med["epoch"], "b": med["steps"],
         "r": train_ratio},
        {"what": "val+test: wall / sum of steps", "a": med["eval_wall"], "b": med["evals"],
         "r": med["eval_wall"] / med["evals"]},
        {"what": "epoch incl. eval / sum of steps", "a": med["epoch"] + med["eval_wall"],
         "b": med["steps"] + med["evals"], "r": whole_ratio},
    ]  # fmt: skip
    print(f"{cfg.name}: {run.steps_per_epoch} train steps per epoch, batch {run.batch_size}; "
          f"medians of {args.epochs} epochs of each kind")  # fmt: skip
    print_table(table, [("what", "", "s"), ("a", "wall s", ".3f"), ("b", "steps s", ".3f"),
                        ("r", "ratio", ".3f")])  # fmt: skip
    path = write_json(args.out or f"epoch-{cfg.name}", {
        "benchmark": "epoch", "experiment": cfg.name, "overrides": args.set, "device": info,
        "epochs_each": args.epochs, "steps_per_epoch": run.steps_per_epoch,
        "batch_size": run.batch_size, "eval_batch_size": run.eval_batch_size,
        "log_every": cfg.train.log_every,
        "train_epoch_over_steps": train_ratio, "epoch_with_eval_over_steps": whole_ratio,
        "medians_s": med, "per_epoch_s": rows,
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
