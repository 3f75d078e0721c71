"""Settings chosen from the data when a user gives only `--data` (`s5jax train --data FILE`).

`inspect_data` measures the training split (task, sizes, lengths, padding, the spread of
scales across examples); `choose_defaults` turns those facts into settings, each with the
reason it was chosen. A key the user sets (`--set key=value`) is never chosen: the user's value
stands. The rules, in the order they are applied:

1. **Normalisation** (`data.normalize`, float inputs only). The spread is, per channel, the
   ratio of the 90th to the 10th percentile of the examples' own standard deviations (over their
   valid steps); its largest value over the channels decides. Above `SPREAD_EXAMPLE` (100: two
   orders of magnitude) the amplitudes say more about the recording than about the class, and
   a channel-standardised model sees most examples as flat lines: `"example"` (each sequence
   standardised on its own). Otherwise `"channel"` (train-split statistics), which keeps the
   amplitude as information. A causal model (per-step targets, or `model.causal = true`) gets
   `"channel"`: example statistics need the whole sequence. Regression targets get
   `data.normalize_targets = "standard"`: the head predicts them standardised with the
   train split's mean and std, mapped back by that fixed affine, so targets far from unit
   scale start at their scale, and trained on the standardised targets' mean square error,
   so that each target weighs the same; mse figures and predictions stay in the targets'
   units. (Targets 300 + 10·s, s of unit scale, 800 series of 100 steps, 10 epochs: test
   mse 22.3 without it, 126× the 100 × 0.00176 that s itself reached; with it 0.180, the
   same fit in the targets' units. Two targets of std 0.01 and 69: relative test mse
   0.0158 and 0.0103 with the affine and a loss in the targets' units, 0.0031 and 0.0130
   with the standardised loss.)
2. **Direction and norm.** Whole-sequence targets (classification, per-sequence regression):
   bidirectional layers with BatchNorm, the paper's LRA recipe. Per-step targets or
   `model.causal = true`: unidirectional (causal) layers with LayerNorm, which normalises each
   step on its own, so training and online use see the same computation. Whole-sequence
   models on padded examples (`lengths`) get `model.mask_padding = true`: the SSMs read zeros
   on the padding and BatchNorm's statistics count only valid steps. The paper's runs let the
   padding through (the authors' model does), and then a bidirectional model's backward scan
   starts at the end of the padding: the same example predicted from a file padded to 100
   steps instead of 60 got other log-probabilities (up to 0.56 apart, a 2-epoch run on 300
   series of 20–60 steps).
3. **Timescales** (`model.dt_min`, `model.dt_max`). A mode with step Δ remembers about 1/Δ
   steps (HiPPO-N real parts are −1/2), so the slowest initial timescale should reach the
   whole sequence: `dt_min = 1 / L` with L the longest valid length, kept within
   [`DT_MIN_FLOOR`, `DT_MIN_CEIL`] (= [1e-4, 1e-2]); `dt_max = 0.1` as in the paper, whose
   fastest timescale of ~10 steps already resolves short events. (The paper's fixed
   dt_min = 0.001 suits L ≈ 1,000; for L = 24 it puts most timescales far beyond the data.)
   With observation times (`t`, `model.timestep_mode = "irregular"`) step k's Δ is
   Δ·(t_k − t_{k−1}), in the times' own unit: both values are divided by the median time
   step of the training split, so that they count steps again (times in seconds sampled every
   0.25 s: dt_min = 0.04 / s for 100 steps of memory; the same rule on the pendulum's times,
   indices 0–99 with a median step of 2, gives dt_min 0.005 and dt_max 0.05 where the authors
   chose 0.01 and 0.1).
4. **Width** (`model.d_model` = H, `model.ssm_size` = P = H, 4 layers, J = 4 blocks): the power
   of two nearest 4·√N_train, within [`WIDTH_MIN`, `WIDTH_MAX`] = [32, 128]: small data gets a
   small model (fewer parameters to fit from few examples, and cheap).
5. **Batch** (`data.batch_size`): 32, or 16 below 256 training examples and 8 below 64, so
   that small datasets still take several steps per epoch; below 8 examples, all of them in one
   batch. Then halved until the training step's activations fit `MEMORY_BUDGET` (4 GiB):
   the step keeps about `STEP_BYTES` (96) bytes per sequence step, channel, layer and
   ensemble member (measured with `/usr/bin/time` on a bidirectional BatchNorm model of 4
   layers, H = 32, L = 20,000: 19.2 GB of resident memory at batch 16 with 5 members, 5.3 GB
   at batch 4; 94-216 MB per sequence above a 1.9 GB base). Long series are where this
   bites: without it, 64 series of 20,000 steps asked for 19 GB.
6. **Budget** (`train.epochs` from a step budget in optimiser steps): 100 epochs' worth of
   steps, kept within [`MIN_STEPS`, `MAX_STEPS`] = [1000, 4000], and, so that long sequences
   train in bounded time, at most `STEP_TOKENS` (10⁷) sequence steps processed in training
   (steps × batch × L; never below `MIN_CAPPED_STEPS` = 200 steps). The epochs are that budget
   divided by the steps per epoch (N_train // batch: the last partial batch is dropped),
   rounded up.
   Linear warm-up over the first 10% of the epochs, then cosine decay (the paper's schedule).
7. **Selection** (`train.select`, `train.best_ties`). Whole-sequence targets with fewer than
   `VAL_SELECT_MIN` (50) val examples: `train.select = "last"`, the model at the end of the
   budget is reported. Accuracy on N val examples has a standard error up to 0.5/√N (7 points
   at N = 50, 16 at N = 10) and moves in steps of 1/N, so the "best" epoch of such a split is
   mostly the epoch whose noise was luckiest, often an early, undertrained model; the cosine
   schedule's last epoch is the model the budget was set for. With 50 or more val examples,
   the paper's protocol (`"best_val"`), and for classification `train.best_ties =
   "lower_loss"`: val accuracy still moves in steps of 1/N_val and ties; a later epoch that
   ties in accuracy and has a lower val loss is taken. (Measured on UEA/UCR sets:
   `docs/results.md`.)
8. **Ensemble** (`model.members`). Whole-sequence targets with fewer than `ENSEMBLE_BELOW`
   (100) training examples: `ENSEMBLE_MEMBERS` (5) members, their probabilities (predictions
   for regression) averaged (`s5jax.nn.Ensemble`). At this size a single model's test accuracy
   moves by several points with the seed alone (ArrowHead, 33 examples: 0.743 to 0.789 over
   five seeds), and the average of the members is better than the members' mean on average
   (`docs/results.md`); the cost, five times the training compute, is minutes here. Causal
   models, and unidirectional ones the user asked for (`model.bidirectional = false`), keep
   one member: an ensemble runs whole sequences only, never online.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..data import PreparedDataset

__all__ = [
    "Choice",
    "DataFacts",
    "choose_defaults",
    "defaults_record",
    "format_choices",
    "inspect_data",
    "uncarved",
]

SPREAD_EXAMPLE = 100.0
DT_MIN_FLOOR, DT_MIN_CEIL, DT_MAX = 1e-4, 1e-2, 0.1
WIDTH_MIN, WIDTH_MAX = 32, 128
EPOCHS_WORTH, MIN_STEPS, MAX_STEPS = 100, 1000, 4000
STEP_TOKENS, MIN_CAPPED_STEPS = 10_000_000, 200
WARMUP_FRACTION = 0.1
VAL_SELECT_MIN = 50
ENSEMBLE_BELOW, ENSEMBLE_MEMBERS = 100, 5
#: Rule 5's memory model: bytes a training step keeps per sequence step, channel (H), layer
#: and ensemble member, and the activations' budget the batch is halved to fit.
STEP_BYTES, MEMORY_BUDGET = 96, 4 * 2**30
#: The layers of the model `s5jax train --data` builds (`user_data_defaults`).
N_LAYERS = 4


@dataclass(frozen=True)
class DataFacts:
    """What the rules look at, measured on the training split."""

    task: str
    per_step: bool
    tokens: bool
    n_train: int
    seq_len: int
    max_length: int
    min_length: int
    padded_fraction: float
    channels: int
    spread: float | None
    n_val: int | None = None  # None: no val split
    val_carved: bool = False  # the val split was carved from the training file by s5jax
    time_step: float | None = None  # median t_k - t_(k-1) over valid steps; None: no times
    vocab: int | None = None  # token inputs: the vocabulary size
    target_mean: float | None = None  # regression: mean and std of all training targets
    target_std: float | None = None
    lengths: bool = False  # the split gives lengths (padded examples)

    def describe(self) -> str:
        lengths = (
            f"length {self.seq_len}"
            if self.min_length == self.max_length == self.seq_len
            else f"lengths {self.min_length}-{self.max_length} (padded to {self.seq_len}, "
            f"{self.padded_fraction:.0%} padding)"
        )
        spread = "" if self.spread is None else f", scale spread {self.spread:.3g}"
        times = "" if self.time_step is None else f", times (median step {self.time_step:.3g})"
        what = "per-step " if self.per_step else ""
        inputs = (
            f"token ids (vocabulary {self.vocab:,})"
            if self.tokens and self.vocab is not None
            else f"{self.channels} channel{'' if self.channels == 1 else 's'}"
        )
        return (
            _examples(self.n_train)
            + ("" if self.n_val is None else f" (+{self.n_val} val)")
            + f", {lengths}, {inputs}{times}, {what}{self.task}{spread}"
        )


@dataclass(frozen=True)
class Choice:
    """One setting chosen from the data: the key path, the value and why."""

    key: str
    value: Any
    reason: str

    def line(self) -> str:
        return f"{self.key} = {self.value!r} ({self.reason})"


def _quantile_spread(std: np.ndarray) -> float:
    """max over channels of q90 / q10 of the examples' standard deviations."""
    q10, q90 = np.quantile(std, [0.1, 0.9], axis=0)
    ratio = q90 / np.maximum(q10, 1e-12)
    return float(np.max(np.where(q90 <= 1e-12, 1.0, ratio)))


def inspect_data(dataset: PreparedDataset) -> DataFacts:
    """The facts the rules use, from `dataset.splits["train"]` (of the val split, only its
    size is read; the test split is not looked at)."""
    train = dataset.splits["train"]
    x = np.asarray(train.x)
    tokens = dataset.vocab_size is not None
    n, L = x.shape[0], x.shape[1]
    lengths = np.full(n, L) if train.lengths is None else np.asarray(train.lengths)
    spread = None
    if not tokens and x.ndim == 3:
        mask = (np.arange(L)[None, :] < lengths[:, None])[..., None]
        count = lengths[:, None].astype(np.float64)
        xd = x.astype(np.float64)
        mean = (xd * mask).sum(axis=1) / count
        std = np.sqrt((((xd - mean[:, None]) * mask) ** 2).sum(axis=1) / count)
        spread = _quantile_spread(std)
    # a target per step: regression (N, L, K), or classification labels (N, L)
    per_step = np.asarray(train.y).ndim == (3 if dataset.task == "regression" else 2)
    time_step = None
    if train.t is not None:
        t = np.asarray(train.t, np.float64)
        valid = np.arange(1, L)[None, :] < lengths[:, None]  # the steps after each first one
        steps = np.diff(t, axis=1)[valid]
        steps = steps[steps > 0]
        time_step = float(np.median(steps)) if steps.size else None
    target_mean = target_std = None
    if dataset.task == "regression":
        y = np.asarray(train.y, np.float64)
        if y.ndim == 3:  # per step: the valid steps
            y = y[np.arange(L)[None, :] < lengths[:, None]]
        target_mean, target_std = float(np.mean(y)), float(np.std(y))
    return DataFacts(
        task=dataset.task,
        per_step=bool(per_step),
        tokens=tokens,
        n_train=int(n),
        seq_len=int(L),
        max_length=int(lengths.max()),
        min_length=int(lengths.min()),
        padded_fraction=float(1 - lengths.sum() / (n * L)),
        channels=1 if x.ndim == 2 else int(x.shape[2]),
        spread=spread,
        n_val=len(dataset.splits["val"]) if "val" in dataset.splits else None,
        val_carved=bool(dataset.meta.get("val_carved", False)),
        time_step=time_step,
        vocab=dataset.vocab_size,
        target_mean=target_mean,
        target_std=target_std,
        lengths=train.lengths is not None,
    )


def _text(value: Any) -> str:
    """A setting's value as override text, as the user writes it (`true`, `example`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _examples(n: int) -> str:
    return f"{n} training example" + ("" if n == 1 else "s")


def _pow2(value: float) -> int:
    return 2 ** round(math.log2(max(value, 1.0)))


def choose_defaults(facts: DataFacts, user: dict[str, Any]) -> list[Choice]:
    """The settings the rules choose for `facts`, skipping every key in `user` (set by the
    user, key path → value). The user's values are read where a rule depends on them
    (`model.causal`, `data.batch_size`, `data.normalize`)."""
    chosen: list[Choice] = []

    def choose(key: str, value: Any, reason: str) -> None:
        if key not in user:
            chosen.append(Choice(key, value, reason))

    def get(key: str, default: Any) -> Any:
        if key in user:
            return user[key]
        for c in chosen:
            if c.key == key:
                return c.value
        return default

    user_causal = bool(user.get("model.causal", False))
    # Per-step targets make a causal model unless the user's settings read whole sequences:
    # model.causal = false, model.bidirectional = true, or example statistics.
    whole = {
        "model.causal": False,
        "model.bidirectional": True,
        "data.normalize": "example",
    }
    reads_whole = [f"{k} = {_text(v)}" for k, v in whole.items() if k in user and user[k] == v]
    causal = user_causal or (facts.per_step and not reads_whole)
    if facts.per_step:
        choose(
            "model.causal",
            causal,
            "per-step targets: each output from the steps up to it, as online use needs; "
            "--set model.bidirectional=true reads whole sequences (offline use)"
            if causal
            else f"per-step targets, but {reads_whole[0]}: each output reads the whole sequence",
        )

    # 1. normalisation
    if facts.tokens:
        choose("data.normalize", "none", "token inputs are ids, not measurements")
    elif causal:
        choose(
            "data.normalize",
            "channel",
            "causal model: per-channel train-split statistics (example statistics need the "
            "whole sequence)",
        )
    elif facts.spread is not None and facts.spread > SPREAD_EXAMPLE:
        choose(
            "data.normalize",
            "example",
            f"the examples' scales differ by {facts.spread:.3g}x (90th/10th percentile of "
            f"per-example std) > {SPREAD_EXAMPLE:g}: each series standardised on its own",
        )
    else:
        spread = "" if facts.spread is None else f"{facts.spread:.3g}x "
        choose(
            "data.normalize",
            "channel",
            f"the examples' scales differ by {spread}(90th/10th percentile of per-example "
            f"std) <= {SPREAD_EXAMPLE:g}: per-channel train-split statistics keep the "
            "amplitude as information",
        )

    if facts.task == "regression":
        spread = (
            ""
            if facts.target_mean is None
            else f" (mean {facts.target_mean:.3g}, std {facts.target_std:.3g} over the train split)"
        )
        choose(
            "data.normalize_targets",
            "standard",
            f"regression targets{spread}: the model predicts them standardised, trained on "
            "their mean square error (each target weighs the same), and a fixed affine maps "
            "its outputs back: mse figures and predictions are in your units",
        )

    # 2. direction and norm
    if causal:
        why = "per-step targets" if facts.per_step and not user_causal else "model.causal = true"
        choose("model.bidirectional", False, f"{why}: causal layers read no future steps")
        choose("model.norm", "layer", f"{why}: LayerNorm normalises each step on its own")
    else:
        why = (
            f"{reads_whole[0]}: whole sequences, the paper's LRA recipe"
            if facts.per_step
            else "whole-sequence target: the paper's LRA recipe"
        )
        choose("model.bidirectional", True, why)
        choose("model.norm", "batch", why)
        # (it changes nothing in unidirectional LayerNorm layers, which the user may have set)
        if facts.lengths and (get("model.bidirectional", True) or get("model.norm", "") == "batch"):
            choose(
                "model.mask_padding",
                True,
                "padded examples: the SSMs read zeros on the padding and BatchNorm counts only "
                "valid steps, so a backward scan starts at each example's last valid step and "
                "predictions do not depend on how far an example is padded",
            )

    # 3. timescales
    if "model.dt_min" not in user and "model.dt_max" not in user:
        dt_min = float(min(max(1.0 / facts.max_length, DT_MIN_FLOOR), DT_MIN_CEIL))
        dt_max, unit = DT_MAX, ""
        step = facts.time_step
        if step is not None and user.get("model.timestep_mode", "irregular") == "irregular":
            if not math.isclose(step, 1.0, rel_tol=1e-6):
                # Δ multiplies t_k - t_(k-1): in time units, so that both count steps again
                dt_min, dt_max = dt_min / step, dt_max / step
                unit = f"; / the median time step {step:.3g}, as Δ multiplies the times' steps"
        choose(
            "model.dt_min",
            float(f"{dt_min:.3g}"),
            f"1 / longest length {facts.max_length}, within [{DT_MIN_FLOOR:g}, "
            f"{DT_MIN_CEIL:g}]{unit}: the slowest initial timescale spans the sequence",
        )
        choose(
            "model.dt_max",
            float(f"{dt_max:.3g}"),
            f"the paper's value 0.1{unit}: the fastest timescale ~10 steps"
            if unit
            else "the paper's value: the fastest timescale ~10 steps",
        )

    # 4. width
    width = min(max(_pow2(4 * math.sqrt(facts.n_train)), WIDTH_MIN), WIDTH_MAX)
    why = (
        f"nearest power of two to 4*sqrt({_examples(facts.n_train)}), within "
        f"[{WIDTH_MIN}, {WIDTH_MAX}]"
    )
    choose("model.d_model", width, why)
    if "model.ssm_size" not in user and "model.blocks" not in user:
        choose("model.ssm_size", get("model.d_model", width), "P = H")
        choose("model.blocks", 4, "J = 4 HiPPO-N blocks")

    # 5. batch
    batch = 32 if facts.n_train >= 256 else 16 if facts.n_train >= 64 else 8
    if facts.n_train < batch:  # fewer than 8 examples: one full-batch step per epoch
        batch = facts.n_train
        why = f"{_examples(facts.n_train)}, all in one batch"
    else:
        why = f"{facts.n_train} training examples: several steps per epoch"
    one_way = user.get("model.bidirectional") is False  # asked for: it can run online
    ensemble = not causal and not one_way and facts.n_train < ENSEMBLE_BELOW
    if "data.batch_size" not in user:
        batch, why = _fit_memory(batch, why, facts.seq_len, int(get("model.d_model", width)),
                                 int(user.get("model.n_layers", N_LAYERS)),
                                 int(user.get("model.members", ENSEMBLE_MEMBERS if ensemble
                                              else 1)))  # fmt: skip
    choose("data.batch_size", batch, why)
    batch = int(get("data.batch_size", batch))

    # 6. budget
    per_epoch = max(1, facts.n_train // batch)  # training drops the last partial batch
    steps = min(max(EPOCHS_WORTH * per_epoch, MIN_STEPS), MAX_STEPS)
    cap = max(MIN_CAPPED_STEPS, STEP_TOKENS // (batch * facts.seq_len))
    capped = steps > cap
    steps = min(steps, cap)
    epochs = max(1, math.ceil(steps / per_epoch))
    choose(
        "train.epochs",
        epochs,
        f"a budget of {epochs * per_epoch} optimiser steps ("
        + (
            f"capped at {STEP_TOKENS:.0e} sequence steps / (batch {batch} x L {facts.seq_len})"
            if capped
            else f"{EPOCHS_WORTH} epochs' worth within [{MIN_STEPS}, {MAX_STEPS}]"
        )
        + f"): {facts.n_train} examples // batch {batch} = {per_epoch} steps per epoch",
    )
    epochs = int(get("train.epochs", epochs))
    warmup = max(1, round(WARMUP_FRACTION * epochs)) if epochs > 1 else 0
    choose(
        "optim.warmup_epochs",
        warmup,
        f"linear warm-up over {WARMUP_FRACTION:.0%} of {epochs} epochs, then cosine decay",
    )

    # 7. selection
    if not facts.per_step and facts.n_val is None:
        choose(
            "train.select",
            "last",
            "no val split to select an epoch with: the model at the end of the budget is reported",
        )
    elif not facts.per_step and facts.n_val < VAL_SELECT_MIN:
        choose(
            "train.select",
            "last",
            f"{facts.n_val} val examples < {VAL_SELECT_MIN}: the val metric's noise (standard "
            f"error up to {0.5 / math.sqrt(max(facts.n_val, 1)):.0%} for accuracy) exceeds the "
            "differences between late epochs; the model at the end of the budget is reported",
        )
    if facts.task == "classification" and get("train.select", "best_val") == "best_val":
        choose(
            "train.best_ties",
            "lower_loss",
            "val accuracy moves in steps of 1/N_val and ties often: of two epochs with the "
            "same val accuracy the one with the lower val loss is best",
        )

    # 8. ensemble
    if ensemble:
        choose(
            "model.members",
            ENSEMBLE_MEMBERS,
            f"{_examples(facts.n_train)} < {ENSEMBLE_BELOW}: a single model's accuracy "
            f"moves by points with the seed at this size; {ENSEMBLE_MEMBERS} members' averaged "
            f"probabilities move less ({ENSEMBLE_MEMBERS}x the training compute)",
        )
    return chosen


def _fit_memory(batch: int, why: str, L: int, H: int, layers: int, members: int):
    """Rule 5's second half: `batch` halved until batch x L x H x layers x members x
    `STEP_BYTES` fits `MEMORY_BUDGET` (not below 1), with the reason extended to say so."""
    per_example = STEP_BYTES * L * H * layers * members
    if batch * per_example <= MEMORY_BUDGET:
        return batch, why
    fitted = batch
    while fitted > 1 and fitted * per_example > MEMORY_BUDGET:
        fitted //= 2
    gib = fitted * per_example / 2**30
    budget = f"{MEMORY_BUDGET / 2**30:g} GiB"
    ensemble = f" x {members} members" if members > 1 else ""
    why = (
        f"{why}; halved from {batch} to {fitted} so that the training step's activations "
        f"fit about {budget} (~{STEP_BYTES} bytes per step, channel, layer"
        f"{' and member' if members > 1 else ''}: {fitted} x L {L} x H {H} x {layers} layers"
        f"{ensemble} ~ {gib:.2g} GiB"
        + (")" if fitted * per_example <= MEMORY_BUDGET else
           f", over {budget} even at batch 1: lower model.d_model or model.members if memory "
           "runs out)")
    )  # fmt: skip
    return fitted, why


def uncarved(facts: DataFacts, user: dict[str, Any]) -> Choice | None:
    """Rule 7's first half: `data.val_fraction = 0` when s5jax carved the val split from the
    training file (a `.ts` file) and the carve is too small to select with (fewer than
    `VAL_SELECT_MIN` examples, whole-sequence targets); None when the carve stays. The caller
    reloads the data without the carve and chooses the other settings from it."""
    if (
        not facts.val_carved
        or facts.per_step
        or facts.n_val is None
        or facts.n_val >= VAL_SELECT_MIN
        or "data.val_fraction" in user
        or user.get("train.select", "last") != "last"  # the user's settings that need val
        or user.get("train.early_stop_patience")
        or user.get("optim.reduce_on_plateau")
    ):
        return None
    total = facts.n_train + facts.n_val
    return Choice(
        "data.val_fraction",
        0.0,
        f"the carve would hold {facts.n_val} val examples < {VAL_SELECT_MIN}, too few to "
        f"select with: all {total} examples of the training file train, and the model at the "
        "end of the budget is reported",
    )


def format_choices(facts: DataFacts, chosen: list[Choice]) -> list[str]:
    """The lines a run prints first: the data's facts, then one line per chosen setting."""
    lines = [f"defaults chosen from the data ({facts.describe()}); --set KEY=VALUE overrides:"]
    return lines + [f"  {c.line()}" for c in chosen]


def defaults_record(facts: DataFacts, chosen: list[Choice]) -> dict[str, Any]:
    """What a run records under run_info.json's `"defaults"` (and prints from `"lines"`)."""
    return {
        "facts": asdict(facts),
        "chosen": {c.key: {"value": c.value, "reason": c.reason} for c in chosen},
        "lines": format_choices(facts, chosen),
    }
