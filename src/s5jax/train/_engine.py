"""`train_and_evaluate(config, workdir)`: the epoch loop of every experiment.

Per epoch: shuffled training batches (order a function of seed and epoch), then val
evaluation, and test evaluation when val improved (or every epoch with
`train.test_every_epoch`); the reported test figure is the one at the best-validation epoch,
identical either way. Checkpoints
(latest every epoch, best on improvement) make `resume=True` continue a killed run with the
same losses as an uninterrupted one: the data order, the dropout keys (folded from the step)
and the optimiser state are all restored or recomputed identically.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ..config import ExperimentConfig, PaperResult, dump_json, to_dict, to_toml
from ..data import PreparedDataset
from ..data._batches import iterate_batches
from ..nn import build_model, count_parameters
from ._checkpoint import Checkpoints
from ._data_spec import check_same_data, write_data_spec
from ._datasets import load_dataset
from ._logging import MetricsLogger
from ._optim import build_optimizer, describe_groups, format_groups, set_lr_scale
from ._plots import paper_reference, plot_curves
from ._progress import Progress
from ._run_info import native_scan_status, pallas_scan_status, run_info, write_json
from ._rundir import (
    RunDirLock,
    check_same_config,
    check_workdir,
    has_checkpoint,
    replace_run_dir,
)
from ._schedule import EarlyStopState, PlateauState, early_stop_update, plateau_update
from ._sharding import (
    DataParallel,
    SilentLogger,
    announce,
    await_announcement,
    is_first_process,
)
from ._steps import balanced_accuracy_of, make_steps
from ._tensorboard import flat_hparams, ssm_statistics

__all__ = ["TrainingDiverged", "train_and_evaluate"]

_log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def _metric_name(head: str) -> str:
    return "accuracy" if head in ("classification", "retrieval") else "mse"


def _model_inputs(dataset: PreparedDataset, head: str) -> dict[str, Any]:
    x = dataset.splits["train"].x
    y = dataset.splits["train"].y
    if dataset.vocab_size is not None:
        # The authors one-hot token tasks to a fixed width (ListOps 20, Text 135) that can
        # exceed the vocabulary; the readers record it so parameter counts match the paper.
        width = max(dataset.vocab_size, int(dataset.meta.get("one_hot_width", 0)))
        d_input, vocab = width, width
    else:
        d_input, vocab = int(x.shape[-1]), None
    targets = None
    if head in ("classification", "retrieval"):
        n_outputs = dataset.n_classes
    else:
        n_outputs = 1 if y.ndim == 1 else int(y.shape[-1])
        info = dataset.meta.get("target_normalization")  # data.normalize_targets
        if info is not None and info.get("mode") == "standard":
            targets = (tuple(info["mean"]), tuple(info["std"]))
    return {"d_input": d_input, "vocab": vocab, "n_outputs": n_outputs, "targets": targets}


def _loss_scale(targets, head: str):
    """The per-target std a regression loss divides by (`data.normalize_targets`; `targets`
    from `_model_inputs`), or None."""
    return None if targets is None or head != "regression" else targets[1]


def _check_widths(inputs: dict[str, Any], config: ExperimentConfig, head: str) -> None:
    """The vocabulary and class count the data asks for, against the config's bounds."""
    m = config.model
    if inputs["vocab"] is not None and inputs["vocab"] > m.max_vocab_size:
        raise ValueError(
            f"the data's vocabulary has {inputs['vocab']:,} token ids (largest id + 1), more "
            f"than model.max_vocab_size = {m.max_vocab_size:,}: fix the token ids, or allow "
            f"more with --set model.max_vocab_size={inputs['vocab']}"
        )
    if head in ("classification", "retrieval") and inputs["n_outputs"] > m.max_classes:
        raise ValueError(
            f"the data has {inputs['n_outputs']:,} classes (largest label + 1, or its n_classes), "
            f"more than model.max_classes = {m.max_classes:,}: fix the labels, or allow more "
            f"with --set model.max_classes={inputs['n_outputs']}"
        )


def _host_batch(batch: dict[str, np.ndarray], head: str) -> dict[str, np.ndarray]:
    """Numpy batch → model inputs: per-step Δ multipliers from times; column targets."""
    out = {"x": batch["x"], "y": batch["y"], "mask": batch["mask"]}
    if "lengths" in batch:
        out["lengths"] = batch["lengths"]
    if "t" in batch:
        t = np.asarray(batch["t"], np.float32)
        out["dt"] = np.concatenate([np.ones_like(t[:, :1]), np.diff(t, axis=1)], axis=1)
    if head == "regression" and out["y"].ndim == 1:
        out["y"] = out["y"][:, None]
    return out


class _Run:
    """The state of one run between epochs (host side)."""

    def __init__(self, config: ExperimentConfig, workdir: Path, dataset: PreparedDataset, out):
        self.config, self.workdir, self.dataset, self.out = config, workdir, dataset, out
        self.head = config.model.head
        self.metric = _metric_name(self.head)
        self.higher_is_better = self.metric == "accuracy"
        self.parallel = DataParallel.local()
        self.batch_size = config.data.batch_size
        self.eval_batch_size = config.data.resolved_eval_batch_size
        self.parallel.check_batch_size(self.batch_size, "data.batch_size")
        self.parallel.check_batch_size(self.eval_batch_size, "data.eval_batch_size")
        self.steps_per_epoch = len(dataset.splits["train"]) // self.batch_size
        self.saved_latest = False  # a `latest` checkpoint exists (for TrainingDiverged's message)
        self.has_val = "val" in dataset.splits
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"data.batch_size={self.batch_size} is larger than the training split "
                f"({len(dataset.splits['train'])} examples); lower it"
            )

    # --- building ---------------------------------------------------------------------------

    def build(self):
        cfg = self.config
        key = jax.random.PRNGKey(cfg.train.seed)
        model_key, self.train_key = jax.random.split(key)
        inputs = _model_inputs(self.dataset, self.head)
        _check_widths(inputs, cfg, self.head)
        model, state = build_model(cfg.model, key=model_key, **inputs)
        self.optimizer, labels = build_optimizer(
            cfg.optim, model, steps_per_epoch=self.steps_per_epoch, epochs=cfg.train.epochs
        )
        self.params, self.static = eqx.partition(model, eqx.is_inexact_array)
        with jax.numpy_dtype_promotion("standard"):
            opt_state = self.optimizer.init(self.params)
        self.n_params = count_parameters(model)
        self.group_table = format_groups(describe_groups(model, labels))
        self.steps = make_steps(
            self.static, self.optimizer, self.head, members=cfg.model.members,
            target_scale=_loss_scale(inputs["targets"], self.head),
        )  # fmt: skip
        self.params = self.parallel.replicate(self.params)
        self.model_state = self.parallel.replicate(state)
        self.opt_state = self.parallel.replicate(opt_state)

    def train_state(self):
        return {"params": self.params, "state": self.model_state, "opt_state": self.opt_state}

    def load_train_state(self, tree):
        self.params = self.parallel.replicate(tree["params"])
        self.model_state = self.parallel.replicate(tree["state"])
        self.opt_state = self.parallel.replicate(tree["opt_state"])

    # --- one epoch --------------------------------------------------------------------------

    def train_epoch(self, epoch: int, step: int, logger, show_progress: bool) -> tuple[int, dict]:
        cfg = self.config
        split = self.dataset.splits["train"]
        progress = (
            Progress(self.steps_per_epoch, f"epoch {epoch}", self.out, unit="step")
            if show_progress
            else None
        )
        sums, start = {"loss": 0.0, "metric": 0.0}, time.perf_counter()
        # The step statistics stay on the device and are fetched every `log_every` steps and
        # at the epoch's end: the host queues the next steps instead of waiting for each one.
        window: list[dict] = []
        # The last partial batch is dropped in training (as the authors' loader does): every
        # step then has one static shape and BatchNorm never sees padding rows.
        # Each process reads only its rows of each batch (all of them with one process).
        batches = iterate_batches(
            split,
            self.batch_size,
            shuffle=True,
            seed=cfg.train.seed,
            epoch=epoch,
            drop_last=True,
            rows=self.parallel.local_rows(self.batch_size),
        )
        # One batch ahead: batch i + 1 is read and placed on the devices right after step i is
        # dispatched, while step i runs, so a fetch of the statistics below never leaves the
        # device waiting for the host to make its next batch.
        placed = (
            self.parallel.shard_local(_host_batch(b, self.head), self.batch_size) for b in batches
        )
        ahead = next(placed, None)
        for i in range(self.steps_per_epoch):
            key = jax.random.fold_in(self.train_key, step)
            device_batch = ahead
            self.params, self.model_state, self.opt_state, stats = self.steps.train(
                self.params, self.model_state, self.opt_state, device_batch, key
            )
            ahead = next(placed, None)
            step += 1
            window.append(stats)
            postfix = {}
            if step % cfg.train.log_every == 0 or i == self.steps_per_epoch - 1:
                last = self._fetch(window, step, epoch, sums)
                window = []
                postfix["loss"] = f"{last['loss']:.4f}"
                if step % cfg.train.log_every == 0:
                    logger.log_step(step, epoch, **last)
            if progress is not None:
                progress.update(1, **postfix)
        if progress is not None:
            progress.close()
        seconds = time.perf_counter() - start
        n = self.steps_per_epoch
        return step, {
            "train_loss": sums["loss"] / n,
            f"train_{self.metric}": sums["metric"] / n,
            "epoch_seconds": seconds,
            "train_examples_per_second": n * self.batch_size / seconds,
        }

    def _fetch(self, window: list[dict], step: int, epoch: int, sums: dict) -> dict[str, float]:
        """Bring the statistics of the steps in `window` (the last one is `step`) to the host.

        Adds their losses and metrics to `sums`, raises `TrainingDiverged` naming the first
        step whose loss is not finite, and returns the last step's record: loss, metric and
        gradient norm as floats.
        """
        keys = ("loss", "metric", "grad_norm")
        host = jax.device_get([tuple(s[k] for k in keys) for s in window])
        first = step - len(window) + 1
        for offset, (loss, metric, _) in enumerate(host):
            loss = float(loss)
            if not math.isfinite(loss):
                checked = f" (steps {first}-{step} checked together)" if first < step else ""
                kept = (
                    f"the last good checkpoint is kept in {self.workdir / 'checkpoints' / 'latest'}"
                    if self.saved_latest
                    else "no checkpoint was written (none is kept before an epoch ends)"
                )
                raise TrainingDiverged(
                    f"the training loss became {loss} at step {first + offset} (epoch {epoch})"
                    f"{checked}; {kept}. Lower the learning rate (optim.ssm_lr / "
                    "optim.lr_factor) or set optim.grad_clip"
                )
            sums["loss"] += loss
            sums["metric"] += float(metric)
        loss, metric, grad_norm = (float(v) for v in host[-1])
        return {"loss": loss, self.metric: metric, "grad_norm": grad_norm}

    def evaluate(self, split_name: str, step_rescale: float = 1.0) -> dict[str, float]:
        split = self.dataset.splits[split_name]
        totals = {"loss_sum": 0.0, "metric_sum": 0.0, "count": 0}
        pending = []  # the batches' statistics, left on the device until the end
        size, rows = self.eval_batch_size, self.parallel.local_rows(self.eval_batch_size)
        batches = iterate_batches(split, size, shuffle=False, pad_last=True, rows=rows)
        placed = (self.parallel.shard_local(_host_batch(b, self.head), size) for b in batches)
        # One batch ahead, as in training: batch i + 1 is read and placed while step i runs.
        # Evaluation steps do not depend on each other, so a CPU backend would run two queued
        # steps at once, and on two cores they slowed each other: the pendulum's val split
        # (20 steps of ~47 ms) took 1.19-1.29 s with two queued, 0.99-1.01 s in this loop
        # (2-core Intel Xeon, 2026-11-29; CHANGELOG.md). Accelerators keep two queued.
        depth = 1 if jax.default_backend() == "cpu" else 2
        ahead = next(placed, None)
        while ahead is not None:
            stats = self.steps.evaluate(self.params, self.model_state, ahead, step_rescale)
            pending.append(stats)
            ahead = next(placed, None)
            if len(pending) >= depth:
                jax.block_until_ready(pending[-depth])
        # One transfer at the end, summed in batch order as the host always did.
        classes = {"class_hits": 0.0, "class_count": 0.0}  # per class (C,), classifiers only
        for stats in jax.device_get(pending):
            for k in totals:
                totals[k] += float(stats[k])
            for k in classes.keys() & stats.keys():
                classes[k] = classes[k] + np.asarray(stats[k], np.float64)
        n = max(totals["count"], 1)
        result = {"loss": totals["loss_sum"] / n, self.metric: totals["metric_sum"] / n}
        if self.head in ("classification", "retrieval") and pending:
            result["balanced_accuracy"] = balanced_accuracy_of(
                classes["class_hits"], classes["class_count"]
            )
        return result

    def better(self, val: dict[str, float], history: dict[str, Any]) -> bool:
        """Whether this epoch's val figures make it the best epoch so far (`train.best_ties`
        decides a tie in the metric: the earliest epoch stays, or the lower val loss wins)."""
        best, value = history["best_val"], val[self.metric]
        if best is None:
            return True
        if value == best and self.config.train.best_ties == "lower_loss":
            best_loss = history.get("best_val_loss")  # absent in runs saved before the setting
            return best_loss is not None and val["loss"] < best_loss
        return value > best if self.higher_is_better else value < best


def _check_without_val(config: ExperimentConfig, dataset: PreparedDataset) -> None:
    """A dataset without a val split trains only where nothing needs val figures."""
    needs = []
    if config.train.select == "best_val":
        needs.append(("train.select = 'best_val'", "set train.select = last"))
    if config.train.early_stop_patience:
        needs.append(("train.early_stop_patience", "unset train.early_stop_patience"))
    if config.optim.reduce_on_plateau:
        needs.append(("optim.reduce_on_plateau", "set optim.reduce_on_plateau = false"))
    if needs:
        raise ValueError(
            f"{dataset.name} has no val split, but {' and '.join(n for n, _ in needs)} "
            f"need{'s' if len(needs) == 1 else ''} one: {' and '.join(f for _, f in needs)}, "
            "or give a val split (data.val_fraction > 0 for a .ts file)"
        )


def train_and_evaluate(
    config: ExperimentConfig,
    workdir: str | os.PathLike,
    *,
    resume: bool | str = False,
    overwrite: bool = False,
    dataset: PreparedDataset | None = None,
    progress: bool = True,
    stream=None,
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train `config` in `workdir`; return the run's summary (also written to results.json).

    **Arguments:**
    - `config`: a resolved `ExperimentConfig`.
    - `workdir`: the run directory (created); holds config.json, run_info.json,
      metrics.jsonl, TensorBoard events, checkpoints/, curves.png and results.json. The run
      holds a lock on it (`.lock`) while it runs; see `s5jax.train._rundir`.
    - `resume`: `True` continues from the latest checkpoint in `workdir` (an error when there
      is none); `"auto"` resumes when there is one and starts otherwise; `False` starts a new
      run, which refuses a `workdir` that is not empty.
    - `overwrite`: replace the run in `workdir` (built aside and swapped in).
    - `dataset`: use this dataset instead of the one the config names.
    - `progress`: show a progress bar per epoch.
    - `stream`: where messages go (default stderr); warnings go through `logging` (logger
      `s5jax.train._engine`).
    - `defaults`: the settings chosen from the data (`s5jax.train._defaults.defaults_record`),
      printed first and recorded in run_info.json under `"defaults"`.

    Every input (config, data, `workdir`) is checked before anything is written to `workdir`;
    a resumed run's config.json and checkpoint are checked against `config` (a config that
    trains differently is refused, naming the keys; `train.epochs` may grow) before
    config.json is replaced.
    """
    out = stream or sys.stderr
    workdir = Path(workdir)
    # Several processes: process 0 owns the folder (checks it, locks it, writes its files);
    # the others follow its decision, or stop with its error (`_sharding.announce`).
    owner, lock, stage = is_first_process(), None, "s5jax/checked"
    try:
        if owner:  # a refused folder stops every process before it loads the data
            check_workdir(workdir, resume=resume, overwrite=overwrite)
            announce(stage)
            stage = "s5jax/run-dir"
        else:
            await_announcement(stage)
        dataset = dataset if dataset is not None else load_dataset(config.data)
        run = _Run(config, workdir, dataset, out)
        if not run.has_val:
            _check_without_val(config, dataset)
        run.build()
        if owner:
            lock = RunDirLock(workdir).acquire()
            mode = check_workdir(workdir, resume=resume, overwrite=overwrite)
    except BaseException as e:
        if owner:
            if lock is not None:
                lock.release()
            announce(stage, error=e)
        raise
    mode = announce("s5jax/run-dir", mode) if owner else await_announcement("s5jax/run-dir")
    try:
        return _own_run(run, lock, mode, progress, out, defaults)
    finally:
        if lock is not None:
            lock.release()


def _own_run(run: _Run, lock, mode: str, progress: bool, out, defaults=None) -> dict[str, Any]:
    """The run in its locked folder: restore or start, write the config, train, finish."""
    config, workdir = run.config, run.workdir
    history: dict[str, Any] = {
        "epoch": 0,
        "step": 0,
        "best_val": None,
        "best_val_loss": None,
        "best_epoch": None,
        "test_at_best": None,
        "plateau": asdict(PlateauState()),
        "stopper": asdict(EarlyStopState()),
        "epochs": [],
    }
    resumed = mode == "resume" and has_checkpoint(workdir)
    ckpt = Checkpoints(workdir) if resumed else None
    if resumed:
        # Before config.json is written: a config that trains differently, or a checkpoint
        # that does not fit the config, is refused with the run's files untouched.
        check_same_config(workdir, config)
        check_same_data(
            workdir, run.dataset, "the run continues on the data as they are now; to continue "
            "on those it started with, stop it and put them back, then --resume",
        )  # fmt: skip
        try:
            tree, history = ckpt.restore("latest", run.train_state())
        except BaseException:  # close the managers on a failed restore too
            ckpt.close()
            raise
        run.load_train_state(tree)
        run.saved_latest = True
        if _complete(config, history):
            ckpt.close()
            print(
                f"{workdir} holds a complete run ({history['epoch']} of {config.train.epochs} "
                "epochs): nothing to train; its results:",
                file=out,
            )
            return _finish(run, history, out)

    def write_start(folder: Path) -> None:
        dump_json(config, folder / "config.json")
        write_data_spec(folder, run.dataset)
        info = run_info(
            n_params=run.n_params,
            devices=run.parallel,
            scan_method=config.model.scan_method,
            native_scan=native_scan_status(config.model.scan_method),
            pallas_scan=pallas_scan_status(config.model.scan_method),
        )
        write_json(folder / "run_info.json", info | ({"defaults": defaults} if defaults else {}))

    owner = is_first_process()
    if owner:
        try:
            if mode == "overwrite":
                replace_run_dir(workdir, lock, write_start)
            else:
                write_start(workdir)
        except BaseException as e:
            announce("s5jax/started", error=e)
            raise
        announce("s5jax/started")
    else:  # the folder is in place (--overwrite swaps it) before anyone opens checkpoints
        await_announcement("s5jax/started")
    if defaults:
        print("\n".join(defaults["lines"]), file=out)
    print(
        f"{config.name}: {run.n_params:,} parameters{_members(config, run.n_params)}; "
        f"{run.steps_per_epoch} steps per epoch "
        f"on {run.parallel.describe()}",
        file=out,
    )
    print(run.group_table, file=out)
    print(_describe_data(run.dataset), file=out)
    for warning in (_remat_warning(config), _precision_warning(config)):
        if warning is not None:  # through logging: `s5jax -q` keeps warnings
            _log.warning(warning.removeprefix("warning: "))
    if resumed:
        print(f"resumed from epoch {history['epoch']} (step {history['step']})", file=out)
    ckpt = ckpt or Checkpoints(workdir)
    logger = (
        MetricsLogger(workdir, resume_step=history["step"] if mode == "resume" else None)
        if owner
        else SilentLogger()
    )
    try:
        if history["step"] == 0:
            logger.log_text("config", f"```toml\n{to_toml(config)}\n```")
        _epochs(run, ckpt, logger, history, progress, out)
        logger.log_hparams(history["step"], _hparams(config), _final_metrics(run, history))
    finally:
        logger.close()
        ckpt.close()
    return _finish(run, history, out)


def _complete(config: ExperimentConfig, history) -> bool:
    """Whether a restored run has nothing left to train (all epochs, or stopped early)."""
    return history["epoch"] >= config.train.epochs or bool(history["stopper"].get("stop"))


def _epochs(run: _Run, ckpt: Checkpoints, logger, history, progress, out) -> None:
    cfg = run.config
    plateau = PlateauState(**history["plateau"])
    stopper = EarlyStopState(**history["stopper"])
    for epoch in range(history["epoch"] + 1, cfg.train.epochs + 1):
        step, record = run.train_epoch(epoch, history["step"], logger, progress)
        val = run.evaluate("val") if run.has_val else None  # no val: select = "last"
        if val is not None:
            record.update({f"val_{k}": v for k, v in val.items()})
            stopper = early_stop_update(
                stopper,
                val[run.metric],
                patience=cfg.train.early_stop_patience,
                mode="max" if run.higher_is_better else "min",
            )
        if cfg.train.select == "last":  # the model where training ends is the one reported
            improved = epoch == cfg.train.epochs or stopper.stop
        else:
            improved = run.better(val, history)
        test = run.evaluate("test") if improved or cfg.train.test_every_epoch else None
        if test is not None:
            record.update({f"test_{k}": v for k, v in test.items()})
        if improved:
            history.update(
                best_val=None if val is None else val[run.metric],
                best_val_loss=None if val is None else val["loss"],
                best_epoch=epoch,
                test_at_best=test[run.metric],
            )
            record.update(_zero_shot(run))
        if cfg.optim.reduce_on_plateau and val is not None:
            plateau = plateau_update(
                plateau,
                val[run.metric],
                patience=cfg.optim.plateau_patience,
                factor=cfg.optim.plateau_factor,
                mode="max" if run.higher_is_better else "min",
            )
            run.opt_state = set_lr_scale(run.opt_state, plateau.scale)
        logger.log_epoch(step, epoch, **record)
        logger.log_histograms(step, *ssm_statistics(eqx.combine(run.params, run.static)))
        history["epochs"].append({"epoch": epoch, **record})
        history.update(epoch=epoch, step=step, plateau=asdict(plateau), stopper=asdict(stopper))
        if improved and cfg.train.save_best:
            ckpt.save("best", step, run.train_state(), history)
        if cfg.train.save_last:
            ckpt.save("latest", step, run.train_state(), history)
            run.saved_latest = True
        print(
            f"epoch {epoch}: train loss {record['train_loss']:.4f}"
            + ("" if val is None else f"  val {run.metric} {val[run.metric]:.4f}")
            + (f"  test {run.metric} {test[run.metric]:.4f}" if test is not None else "")
            + (
                ("  (best)" if cfg.train.select == "best_val" else "  (reported)")
                if improved
                else ""
            ),
            file=out,
        )
        if stopper.stop:
            print(
                f"early stop: no val improvement for {cfg.train.early_stop_patience} epochs",
                file=out,
            )
            break


_CPU_REMAT_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def cpu_remat_flag(config: ExperimentConfig) -> None:
    """`model.remat` saves memory on CPU only with XLA's concurrency-optimised scheduler off
    (it schedules the recomputation next to the forward pass: benchmarks/README.md). XLA
    reads XLA_FLAGS once, when JAX's backend starts, which in `s5jax train` and `s5jax sweep`
    has not happened yet when the config is known: add the flag then, as `_remat_warning`
    would ask the user to (any platform accepts it; only CPU compilation reads it). Too late,
    nothing is changed and the trainer warns."""
    from jax._src import xla_bridge

    flags = os.environ.get("XLA_FLAGS", "")
    if config.model.remat == "none" or _CPU_REMAT_FLAG in flags:
        return
    if xla_bridge.backends_are_initialized():
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_CPU_REMAT_FLAG}".strip()
    _log.info(
        "model.remat = %r: added %s to XLA_FLAGS (XLA's CPU scheduler would undo the "
        "rematerialisation)", config.model.remat, _CPU_REMAT_FLAG,
    )  # fmt: skip


def _remat_warning(config: ExperimentConfig) -> str | None:
    """On CPU, XLA's default scheduler undoes rematerialisation (benchmarks/README.md)."""
    if getattr(config.model, "remat", "none") == "none" or jax.default_backend() != "cpu":
        return None
    if _CPU_REMAT_FLAG in os.environ.get("XLA_FLAGS", ""):
        return None
    return (
        f"warning: model.remat = {config.model.remat!r} saves little memory on CPU unless JAX "
        f"starts with XLA_FLAGS={_CPU_REMAT_FLAG} (set it before running s5jax)"
    )


_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bfloat16 arithmetic, which XLA's bfloat16 products (and
s5jax's native bfloat16 weight gradient) can use."""


def _cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The first processor's x86 flags (its `flags` line), or None where there is none to read
    (not Linux, or not x86: an Arm CPU lists `Features` instead)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def _precision_warning(config: ExperimentConfig, flags: set[str] | None = None) -> str | None:
    """bf16 on an x86 CPU without bfloat16 arithmetic, where its steps are slower than float32
    ones (1.31-1.50x as long on nine paper configs, a 2-core AMD EPYC with AVX2 only,
    `benchmarks/flop_bound.py`, docs/results.md). `flags`: the CPU's flags (default:
    `_cpu_flags()`)."""
    if getattr(config.model, "precision", "fp32") != "bf16" or jax.default_backend() != "cpu":
        return None
    flags = _cpu_flags() if flags is None else flags
    if flags is None or any(f in flags for f in _BF16_CPU_FLAGS):
        return None
    return (
        "warning: model.precision = 'bf16' on a CPU without bfloat16 arithmetic (no avx512_bf16 "
        "or amx_bf16 in /proc/cpuinfo): bf16 training steps took 1.3-1.5x as long as float32 "
        "ones on such a CPU (docs/results.md); model.precision = 'fp32' is faster here"
    )


def _members(config: ExperimentConfig, n_params: int) -> str:
    k = config.model.members
    return "" if k == 1 else f" ({k} ensemble members of {n_params // k:,} each)"


def _describe_data(dataset: PreparedDataset) -> str:
    sizes = ", ".join(f"{k} {len(v):,}" for k, v in dataset.splits.items())
    line = f"data: {dataset.name} ({sizes})"
    if source := dataset.meta.get("source"):
        line += f" from {source}"
    if dataset.meta.get("generated") is not None:
        line += " [generated data]"
    if names := dataset.meta.get("classes"):  # label i is names[i]
        shown = ", ".join(f"{i}={c}" for i, c in enumerate(names[:10]))
        line += f"; classes {shown}{', ...' if len(names) > 10 else ''}"
    return line


def _zero_shot(run: _Run) -> dict[str, float]:
    """Speech (§6.2): when val improves, the 8 kHz sets at step_rescale = 2."""
    if not run.config.data.zero_shot_8khz:
        return {}
    record = {}
    for split in ("val_8khz", "test_8khz"):
        if split in run.dataset.splits:
            record.update({f"{split}_{k}": v for k, v in run.evaluate(split, 2.0).items()})
    return record


def _hparams(config: ExperimentConfig) -> dict[str, Any]:
    """The config as HParams: every setting but the description and the paper's figure."""
    tree = to_dict(config)
    return flat_hparams({k: v for k, v in tree.items() if k not in ("description", "paper")})


def _final_metrics(run: _Run, history) -> dict[str, Any]:
    """The HParams tab's metrics: the run's best val and the test figure at it."""
    return {
        f"final/best_val_{run.metric}": history["best_val"],
        f"final/test_{run.metric}_at_best_val": history["test_at_best"],
        "final/best_epoch": history["best_epoch"],
    }


def constant_baseline(
    dataset: PreparedDataset, metric: str, per_step: bool
) -> dict[str, Any] | None:
    """The test figure of a prediction that ignores the inputs, as the run's metric computes
    it: for `"accuracy"`, always the training split's most frequent class; for `"mse"`, the
    training split's mean of each target. Per-step targets (`per_step`) count each example's
    valid steps only, as the metric does, then average the examples. None without a train
    and a test split.

    It puts a figure in context: 0.97 accuracy is no result when 97% of the labels are one
    class, nor an mse of 0.5 when the targets' variance is 0.5.

    **Returns:** `{"value": figure, "what": a phrase naming the constant}`, or None.
    """
    train, test = dataset.splits.get("train"), dataset.splits.get("test")
    if train is None or test is None or len(test) == 0 or len(train) == 0:
        return None

    def shaped(split) -> tuple[np.ndarray, np.ndarray]:
        """y as (N, L, K) per step or (N, 1, K) per example, and its (N, L) valid steps."""
        y = np.asarray(split.y)
        y = y.reshape(*y.shape[:2], -1) if per_step else y.reshape(len(y), 1, -1)
        valid = np.ones(y.shape[:2], bool)
        if per_step and split.lengths is not None:
            valid = np.arange(y.shape[1])[None, :] < np.asarray(split.lengths)[:, None]
        return y, valid

    def figure(values: np.ndarray, valid: np.ndarray) -> float:
        """The metric's mean of (N, L, K) values: over each example's valid steps and its
        targets, then over the examples."""
        steps = values.mean(axis=2)
        return float(((steps * valid).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)).mean())

    (y_train, valid_train), (y_test, valid_test) = shaped(train), shaped(test)
    if metric == "accuracy":
        top = int(np.argmax(np.bincount(y_train[valid_train].reshape(-1).astype(np.int64))))
        names = dataset.meta.get("classes")
        name = f"class {names[top]!r}" if names else f"class {top}"
        value = figure((y_test == top).astype(np.float64), valid_test)
        return {"value": value, "what": f"always {name}, the training split's most frequent"}
    if metric == "mse":
        mean = y_train[valid_train].astype(np.float64).mean(axis=0)  # (K,)
        value = figure((y_test.astype(np.float64) - mean) ** 2, valid_test)
        return {"value": value, "what": "the training split's mean of each target"}
    return None


def _finish(run: _Run, history, out) -> dict[str, Any]:
    paper = run.config.paper
    ours = history["test_at_best"]
    summary = {
        "experiment": run.config.name,
        "metric": f"test_{run.metric}",
        "best_epoch": history["best_epoch"],
        "best_val": history["best_val"],
        "test_at_best_val": ours,
        "select": run.config.train.select,
        "epochs_run": history["epoch"],
        "n_params": run.n_params,
        # Trained on data from one of our generators (ListOps, Pathfinder): the paper's
        # figure is not a like-for-like comparison.
        "generated_data": run.dataset.meta.get("generated") is not None,
        "paper": None
        if paper is None
        else {"value": paper.value, "unit": paper.unit, "metric": paper.metric},
        "baseline": constant_baseline(
            run.dataset, run.metric, per_step=run.config.model.pooling == "none"
        ),
    }
    print(results_text(summary), file=out)
    if not is_first_process():  # process 0 writes the run's files
        return summary
    write_json(run.workdir / "results.json", summary)
    if history["epochs"]:
        plot_curves(
            history["epochs"],
            run.workdir / "curves.png",
            metrics=("loss", run.metric),
            kind=None,
            title=run.config.name,
            reference=paper_reference(paper),
            best_epoch=history["best_epoch"],
        )
    return summary


def results_text(summary: dict[str, Any]) -> str:
    """The table of a run's reported test figure beside the paper's (and a note for generated
    data), from the summary `train_and_evaluate` returns."""
    from ._logging import summary_table

    paper = summary["paper"]
    ours = _in_paper_units(summary["test_at_best_val"], paper and PaperResult(**paper))
    select = " at best val" if summary["select"] == "best_val" else " at last epoch"
    name = summary["metric"].replace("_", " ", 1)
    rows = [(name + select, ours, paper and paper["value"])]
    if baseline := summary.get("baseline"):  # results.json of older runs has none
        value = _in_paper_units(baseline["value"], paper and PaperResult(**paper))
        rows.append((f"{name} of a constant (ignores the inputs)", value, None))
    lines = [summary_table(rows, headers=["metric", "ours", "paper"])]
    if baseline:
        lines.append(f"constant: {baseline['what']}")
    if summary["generated_data"]:
        lines.append(
            "note: trained and tested on generated data, not the published dataset; the "
            "paper's figure is not a like-for-like comparison"
        )
    return "\n".join(lines)


def _in_paper_units(value, paper):
    if value is None or paper is None:
        return value
    return value / paper.scale
