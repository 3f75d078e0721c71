"""The experiment config schema: frozen dataclasses, one per section, validated on creation.

An `ExperimentConfig` holds five sections plus the paper's published figure:

- `ModelConfig`: the network (S5 SSM options, layer options, encoder, pooling, head);
- `OptimConfig`: the two optimiser groups (SSM parameters vs the rest) and the schedule;
- `DataConfig`: which dataset, batch sizes and dataset-specific options;
- `TrainConfig`: epochs, seed, evaluation, checkpointing and logging cadence;
- `PaperResult`: the figure the paper published for this configuration, and where from.

Sizes follow the paper's Table 11: `ssm_size` is P as the table gives it (P_full: the number of
complex states *before* conjugate-symmetric halving); the stored number of states is
`ModelConfig.state_size`. The global learning rate is `lr_factor * ssm_lr` as in the authors'
run scripts (`OptimConfig.lr`).

Every field is type-checked in `__post_init__`; a bad value raises `ConfigError` naming the key
path (e.g. `model.activation`) and the valid values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from ._types import ConfigError, FloatTable, check_fields

__all__ = [
    "DataConfig",
    "ExperimentConfig",
    "ModelConfig",
    "OptimConfig",
    "PaperResult",
    "TrainConfig",
]

Discretization = Literal["zoh", "bilinear"]
CInit = Literal["trunc_standard_normal", "lecun_normal", "complex_normal"]
LambdaInit = Literal["hippo", "s4d_inv", "s4d_lin", "gaussian", "antisymmetric"]
Parameterization = Literal["continuous", "discrete"]
Norm = Literal["batch", "layer"]
Activation = Literal["gelu", "full_glu", "half_glu1", "half_glu2"]
Encoder = Literal["dense", "embedding", "pendulum_cnn"]
Pooling = Literal["mean", "masked_mean", "last", "none"]
Head = Literal["classification", "regression", "gaussian", "retrieval"]
HeadActivation = Literal["tanh", "relu"]
TimestepMode = Literal["irregular", "drop", "append"]
Remat = Literal["none", "layers", "ssm"]
ScanMethod = Literal["auto", "fused", "sequential", "parallel", "chunked", "pallas", "native"]
Precision = Literal["fp32", "bf16"]
Partition = Literal["standard", "BandCdecay", "BfastandCdecay", "noBCdecay"]
Schedule = Literal["cosine", "constant"]
Missing = Literal["error", "zero", "ffill", "interpolate"]
Unit = Literal["%", "1e-3", "1"]
Normalize = Literal["none", "channel", "example"]
NormalizeTargets = Literal["none", "standard"]
BestTies = Literal["earliest", "lower_loss"]
Select = Literal["best_val", "last"]

_UNIT_SCALE = {"%": 0.01, "1e-3": 1e-3, "1": 1.0}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive(obj: object, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            _require(value > 0, f"{section}.{name} = {value!r}: must be > 0")


def _nonnegative(obj: object, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(value >= 0, f"{section}.{name} = {value!r}: must be >= 0")


def _unit_interval(obj: object, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(0 <= value < 1, f"{section}.{name} = {value!r}: must be in [0, 1)")


@dataclass(frozen=True)
class ModelConfig:
    """The network: a stack of S5 sequence layers between an encoder and a head.

    Sizes: `n_layers` layers of width `d_model` (H); each S5 SSM has `ssm_size` (P_full) complex
    states initialised from `blocks` (J) HiPPO-N blocks of size `ssm_size // blocks`. Under
    `conj_sym` only half the states are stored (`state_size`) and that block size must be even.

    `scan_method` picks how the SSM recurrence is computed (same results): `"auto"`
    (on CPU native where its kernel builds and there is one device, else chunked; fused
    there for sequences of more than 2²¹ states L × P × directions; parallel elsewhere),
    `"fused"` (B̃u, recurrences and C̃x blockwise in real planes with its own backward
    pass), `"sequential"`, `"parallel"` (`associative_scan`), `"chunked"` (in-place chunked
    loop with its own backward pass), `"pallas"` (fused GPU kernel; interpret mode
    elsewhere, slow) or `"native"` (C++ CPU kernel, compiled on first use; needs a C++
    compiler): see `s5jax.core`.

    `remat` trades compute for memory in training (results are unchanged): `"layers"`
    recomputes each sequence layer in the backward pass (only layer inputs are kept), `"ssm"`
    recomputes only the SSM of each layer (its input and output are kept), `"none"` keeps every
    intermediate. (On CPU the saving needs
    `XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false` before JAX starts,
    which `s5jax train` sets itself; see benchmarks/README.md.)

    `precision`: `"fp32"`, or `"bf16"` mixed precision (float32 parameters; bfloat16 matrix
    products with float32 accumulation and bfloat16 activations; norm statistics, Λ, Δ, the
    discretisation, the SSM state, the head's output and the loss in float32). See `S5Model`.

    `head_activation`: the hidden activation of the Gaussian head's two MLPs (`"tanh"`, the
    authors' pendulum code; `"relu"` is what runs from before this setting used).

    `mask_padding = true`: on data with `lengths`, each layer's SSM reads zeros at the padding
    steps and BatchNorm's training statistics count only the valid steps, so outputs at the
    valid steps do not depend on the padding (a bidirectional layer's backward scan starts at
    the last valid step). Off (the default, and the paper's runs), padding passes through the
    SSMs as in the authors' model, and a bidirectional model's predictions change with how far
    a sequence is padded. `s5jax train --data` turns it on for bidirectional models.

    `causal = true` marks a model meant for online use (each output from the steps so far):
    it rules out `bidirectional` and example normalisation (`data.normalize = "example"`).

    `members = K` (K ≥ 2) trains a deep ensemble: K models of this config from different
    initial parameters, each on its own loss, whose probabilities (classification, retrieval)
    or predictions (regression) are averaged (`s5jax.nn.Ensemble`). K times the compute and
    parameters; whole sequences only (no online use).

    `max_vocab_size` and `max_classes` bound the embedding table and the classification head
    the data may ask for (a stray token id of 2·10⁹ would otherwise allocate hundreds of GB);
    raise them for a genuinely larger vocabulary or label set.
    """

    n_layers: int = 6
    d_model: int = 128
    ssm_size: int = 256
    blocks: int = 8
    conj_sym: bool = True
    bidirectional: bool = False
    causal: bool = False
    mask_padding: bool = False
    discretization: Discretization = "zoh"
    c_init: CInit = "trunc_standard_normal"
    lambda_init: LambdaInit = "hippo"
    parameterization: Parameterization = "continuous"
    dt_min: float = 0.001
    dt_max: float = 0.1
    scalar_dt: bool = False
    clip_eigs: bool = False
    norm: Norm = "batch"
    prenorm: bool = True
    activation: Activation = "half_glu1"
    gelu_approximate: bool = True
    dropout: float = 0.0
    bn_momentum: float = 0.95
    encoder: Encoder = "dense"
    pooling: Pooling = "mean"
    head: Head = "classification"
    head_activation: HeadActivation = "tanh"
    members: int = 1
    timestep_mode: TimestepMode = "irregular"
    remat: Remat = "none"
    scan_method: ScanMethod = "auto"
    precision: Precision = "fp32"
    max_vocab_size: int = 10_000_000
    max_classes: int = 10_000_000

    def __post_init__(self) -> None:
        check_fields(self, "model")
        _positive(self, "model", "n_layers", "d_model", "ssm_size", "blocks", "dt_min")
        _positive(self, "model", "max_vocab_size", "max_classes", "members")
        _require(
            self.members == 1 or self.head in ("classification", "retrieval", "regression"),
            f"model.members = {self.members}: an ensemble averages classification, retrieval "
            f"or regression outputs, not the {self.head!r} head's; set model.members = 1",
        )
        _require(
            self.members == 1 or not self.causal,
            f"model.members = {self.members} and model.causal = true: an ensemble runs whole "
            "sequences only; set model.members = 1 for an online model",
        )
        _require(
            self.ssm_size % self.blocks == 0,
            f"model.ssm_size = {self.ssm_size} must be divisible by model.blocks = {self.blocks}",
        )
        _require(
            not self.conj_sym or self.block_size % 2 == 0,
            f"model.ssm_size / model.blocks = {self.ssm_size} / {self.blocks} = "
            f"{self.block_size}: the block size must be even under model.conj_sym = true "
            "(each block keeps half of its conjugate eigenvalue pairs)",
        )
        _require(
            self.dt_min <= self.dt_max,
            f"model.dt_min = {self.dt_min} must be <= model.dt_max = {self.dt_max}",
        )
        _unit_interval(self, "model", "dropout", "bn_momentum")
        _require(
            not (self.causal and self.bidirectional),
            "model.causal = true and model.bidirectional = true: a bidirectional layer reads "
            "the future steps; set model.bidirectional = false for a causal (online) model",
        )
        if self.head == "gaussian":
            _require(
                self.pooling == "none",
                f"model.pooling = {self.pooling!r}: the 'gaussian' head predicts every step and "
                "needs model.pooling = 'none'",
            )
        if self.head == "retrieval":
            _require(
                self.pooling != "none",
                "model.pooling = 'none': the 'retrieval' head compares one vector per document; "
                "use 'mean', 'masked_mean' or 'last'",
            )

    @property
    def block_size(self) -> int:
        """R = P_full / J: the size of one HiPPO-N initialisation block."""
        return self.ssm_size // self.blocks

    @property
    def state_size(self) -> int:
        """The number of stored complex states: P_full / 2 under conjugate symmetry, else P_full."""
        return self.ssm_size // 2 if self.conj_sym else self.ssm_size


@dataclass(frozen=True)
class OptimConfig:
    """Two optimiser groups and one learning-rate schedule shape.

    The "ssm" group (Λ, B̃, Δ in the `standard` partition; see the reference semantics §5 for the
    others) uses Adam at `ssm_lr` without weight decay; the rest uses AdamW at
    `lr = lr_factor * ssm_lr` with `weight_decay`. `warmup_epochs` of linear warmup precede the
    cosine decay to `lr_min` (or a constant rate). `faithful_schedule` reproduces the authors'
    schedule quirks (first update at the full rate; cosine counter not reset after warmup).
    """

    ssm_lr: float = 0.001
    lr_factor: float = 1.0
    weight_decay: float = 0.05
    partition: Partition = "standard"
    dt_global: bool = False
    schedule: Schedule = "cosine"
    warmup_epochs: int = 1
    lr_min: float = 0.0
    reduce_on_plateau: bool = False
    plateau_patience: int = 10
    plateau_factor: float = 0.5
    grad_clip: float | None = None
    faithful_schedule: bool = False
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        check_fields(self, "optim")
        _positive(self, "optim", "ssm_lr", "lr_factor", "plateau_patience", "grad_clip", "adam_eps")
        _nonnegative(self, "optim", "weight_decay", "warmup_epochs", "lr_min")
        _unit_interval(self, "optim", "adam_b1", "adam_b2")
        _require(
            0 < self.plateau_factor <= 1,
            f"optim.plateau_factor = {self.plateau_factor!r}: must be in (0, 1]",
        )
        _require(
            self.lr_min <= min(self.ssm_lr, self.lr),
            f"optim.lr_min = {self.lr_min!r} must not exceed optim.ssm_lr = {self.ssm_lr!r} "
            f"or the global lr = optim.lr_factor * optim.ssm_lr = {self.lr!r}",
        )

    @property
    def lr(self) -> float:
        """The global learning rate of the "regular" group: `lr_factor * ssm_lr`."""
        return self.lr_factor * self.ssm_lr


@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how it is batched, and the dataset-specific options.

    `dataset` names a dataset of `s5jax.data` (or the user's own prepared data under `root`).
    For a UEA/UCR `NAME_TRAIN.ts` file: `missing` says what to do with missing values
    (`"error"`, `"zero"`, `"ffill"`, `"interpolate"`; see `s5jax.data._uea`). For a `.ts`
    file, and an own `.npz` without val keys, the val split is `val_fraction` of the training
    split, stratified by class, drawn with `val_seed`; `val_fraction = 0` carves none (the
    whole training split trains; the run then reports the model at the end of training,
    `train.select = "last"`).
    `eval_batch_size = None` means `batch_size`; `seq_len = None` means the dataset's own length
    (when given, it documents and checks the expected length). `n_train`/`n_eval` limit the
    number of examples (generated datasets make that many; read ones are truncated): for smoke
    tests. `zero_shot_8khz` (speech) also evaluates on every-other-sample 8 kHz val/test sets
    with Δ doubled. `normalize` standardises float inputs: `"none"`, `"channel"` (per
    feature, statistics of the train split) or `"example"` (each sequence on its own valid
    steps; not causal); see `s5jax.data._normalize`. `normalize_targets = "standard"`
    (regression only) has the head predict the targets standardised with the train split's
    per-target mean and std, and map its outputs back to the targets' units with that fixed
    affine: the training loss is the standardised targets' mean square error (each target
    weighs the same), while metrics (mse) and predictions are in the targets' units.
    """

    dataset: str = "synthetic"
    batch_size: int = 32
    eval_batch_size: int | None = None
    seq_len: int | None = None
    root: str | None = None
    n_train: int | None = None
    n_eval: int | None = None
    zero_shot_8khz: bool = False
    missing: Missing = "error"
    val_fraction: float = 0.1
    val_seed: int = 0
    normalize: Normalize = "none"
    normalize_targets: NormalizeTargets = "none"

    def __post_init__(self) -> None:
        check_fields(self, "data")
        _require(bool(self.dataset.strip()), "data.dataset must not be empty")
        _positive(self, "data", "batch_size", "eval_batch_size", "seq_len", "n_train", "n_eval")
        _nonnegative(self, "data", "val_seed")
        _require(
            0 <= self.val_fraction < 1,
            f"data.val_fraction must be in [0, 1) (0: no val split), got {self.val_fraction!r}",
        )

    @property
    def resolved_eval_batch_size(self) -> int:
        """The evaluation batch size: `eval_batch_size`, or `batch_size` when that is None."""
        return self.batch_size if self.eval_batch_size is None else self.eval_batch_size


@dataclass(frozen=True)
class TrainConfig:
    """The epoch loop: length, seed, evaluation, early stopping, checkpoints and logging.

    `early_stop_patience` is in epochs without a val improvement (None: never stop early);
    `log_every` in optimiser steps. Val is evaluated after every epoch; the test split when
    val improves (the reported figure is the test metric at the best-val epoch, so nothing
    else is needed); `test_every_epoch = true` evaluates it after every epoch as well, for
    curves, at the cost of one more pass over the test split per epoch.

    `best_ties` says which epoch is best when val metrics tie: `"earliest"` (the paper's rule:
    a later epoch must beat the best val metric) or `"lower_loss"` (a later epoch that equals
    it with a lower val loss is better). Accuracy on a small val split moves in steps of 1/N
    and often reaches its maximum in the first epochs; `"lower_loss"` then keeps following the
    model as it improves. The defaults chosen from a user's data set it for classification.

    `select` says which epoch's model the run reports (its test figure, the `best`
    checkpoint): `"best_val"` (the paper's protocol: the epoch with the best val metric,
    `best_ties` deciding ties) or `"last"` (the model at the end of training, or where early
    stopping ends it; val is still evaluated and logged every epoch but chooses nothing). A val
    split of a few dozen examples measures accuracy to within several points, so choosing an
    epoch by it picks noise; the defaults chosen from a user's data take `"last"` then.
    """

    epochs: int = 100
    seed: int = 0
    early_stop_patience: int | None = None
    save_best: bool = True
    save_last: bool = True
    log_every: int = 100
    test_every_epoch: bool = False
    best_ties: BestTies = "earliest"
    select: Select = "best_val"

    def __post_init__(self) -> None:
        check_fields(self, "train")
        _positive(self, "train", "epochs", "early_stop_patience", "log_every")
        _nonnegative(self, "train", "seed")


@dataclass(frozen=True)
class PaperResult:
    """The figure the paper published for this configuration.

    `value` and `std` are in `unit`: `"%"` for accuracies, `"1e-3"` for MSE ×10⁻³, `"1"` for
    plain numbers; `value = None` records a run that did not beat chance (the paper's ✗).
    `source` names the table (number and LaTeX label). `extra` holds other published numbers
    for the same run (e.g. the 8 kHz zero-shot accuracy). `table11` holds the Table 11 cells
    that differ from the active values (the authors' run scripts), keyed by column name.
    """

    metric: str = "test_accuracy"
    value: float | None = None
    std: float | None = None
    unit: Unit = "%"
    higher_is_better: bool = True
    seeds: int | None = None
    source: str = ""
    notes: str = ""
    extra: FloatTable = ()
    table11: FloatTable = ()

    def __post_init__(self) -> None:
        check_fields(self, "paper")
        _require(bool(self.metric.strip()), "paper.metric must not be empty")
        if self.std is not None:
            _nonnegative(self, "paper", "std")
        _positive(self, "paper", "seeds")

    @property
    def scale(self) -> float:
        """The factor turning `value` into the raw metric (0.01 for %, 1e-3 for ×10⁻³)."""
        return _UNIT_SCALE[self.unit]

    @property
    def raw_value(self) -> float | None:
        """`value` in the metric's own units (a fraction for accuracies), or None."""
        return None if self.value is None else self.value * self.scale


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: a name, a description, the five sections and the paper's figure.

    Cross-section rule: the warmup must not be longer than training.
    """

    name: str
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    paper: PaperResult | None = None

    def __post_init__(self) -> None:
        check_fields(self, "")
        _require(
            bool(_NAME.match(self.name)),
            f"name = {self.name!r}: use letters, digits, '-', '_' and '.', starting with a "
            "letter or digit",
        )
        _require(
            self.optim.warmup_epochs <= self.train.epochs,
            f"optim.warmup_epochs = {self.optim.warmup_epochs} must not exceed "
            f"train.epochs = {self.train.epochs}",
        )
        _require(
            not (self.model.causal and self.data.normalize == "example"),
            "data.normalize = 'example' with model.causal = true: example normalisation uses "
            "the whole sequence (its mean and std), so a causal model cannot use it online; "
            "use data.normalize = 'channel'",
        )
