"""Learning-rate schedules, reduce-on-plateau and early stopping (reference semantics §5).

The schedule is a plain function of the optimiser step (`LRSchedule.__call__`), evaluated inside
the optimiser by optax. Both groups follow the same shape with their own base rate: linear
warmup over `warmup_epochs` epochs, then a cosine from the base rate to `lr_min` over the
remaining epochs (or a constant rate).

Two forms:

- **clean** (default): update k (0-based) runs at `base·(k+1)/W` for k < W (W warmup steps),
  then at `lr_min + (base − lr_min)·½(1 + cos(π·min(k − W, T)/T))`, T = total − W steps.
- **faithful** (`faithful=True`): the authors' loop, which sets the rate *after* each update:
  update 0 runs at the full base rate, and update k ≥ 1 runs at the rate the clean form gives
  step s = k − 1, except that the cosine counter is the global step s (not reset after warmup),
  so the cosine reaches `lr_min` W steps before the end and stays there.

Reduce-on-plateau and early stopping are per-epoch host-side state machines: small frozen
dataclasses updated by pure functions (`plateau_update`, `early_stop_update`). The plateau
state's `scale` multiplies the base rates, floored at `lr_min` as in the authors' code:
`base′ = max(scale·base, lr_min)`. The training loop hands it to the optimiser with
`s5jax.train.set_lr_scale` once per epoch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

__all__ = [
    "EarlyStopState",
    "LRSchedule",
    "PlateauState",
    "early_stop_update",
    "plateau_update",
]

Mode = Literal["max", "min"]


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """The learning rate of one optimiser group as a function of the update index.

    **Arguments:**
    - `base_lr`: the peak rate (reached at the end of warmup).
    - `lr_min`: the final rate of the cosine; also the floor of a plateau-reduced base.
    - `steps_per_epoch`: optimiser updates per epoch.
    - `epochs`: number of epochs of the run.
    - `warmup_epochs`: epochs of linear warmup (0: none).
    - `kind`: `"cosine"` or `"constant"` after warmup.
    - `faithful`: reproduce the authors' two quirks (see the module docstring).
    """

    base_lr: float
    lr_min: float
    steps_per_epoch: int
    epochs: int
    warmup_epochs: int = 0
    kind: Literal["cosine", "constant"] = "cosine"
    faithful: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "constant"):
            raise ValueError(f"kind must be 'cosine' or 'constant', got {self.kind!r}")
        if self.steps_per_epoch < 1 or self.epochs < 1:
            raise ValueError(
                f"steps_per_epoch and epochs must be positive, got "
                f"{self.steps_per_epoch} and {self.epochs}"
            )
        if self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")

    @property
    def warmup_steps(self) -> int:
        """W: the number of warmup updates."""
        return self.warmup_epochs * self.steps_per_epoch

    @property
    def total_steps(self) -> int:
        """The number of updates of the whole run."""
        return self.epochs * self.steps_per_epoch

    @property
    def decay_steps(self) -> int:
        """T: the length of the cosine, total − W updates (at least 1)."""
        return max(self.total_steps - self.warmup_steps, 1)

    def __call__(self, step, scale=1.0) -> jax.Array:
        """The rate of update `step` (0-based).

        **Arguments:**
        - `step`: the update index (Python int or integer array, traceable).
        - `scale`: the reduce-on-plateau multiplier of the base rate.

        **Returns:** a float32 scalar.
        """
        k = jnp.asarray(step, jnp.int32)
        base = jnp.maximum(jnp.asarray(scale, jnp.float32) * self.base_lr, self.lr_min)
        if not self.faithful:
            return self._shape(k, k - self.warmup_steps, base)
        s = k - 1
        return jnp.where(k == 0, base, self._shape(s, s, base))

    def _shape(self, s: jax.Array, t: jax.Array, base: jax.Array) -> jax.Array:
        """Warmup at step `s`, else the post-warmup rate at cosine counter `t`."""
        if self.kind == "constant":
            after = base
        else:
            count = jnp.clip(t, 0, self.decay_steps).astype(jnp.float32)
            cosine = 0.5 * (1.0 + jnp.cos(math.pi * count / self.decay_steps))
            after = self.lr_min + (base - self.lr_min) * cosine
        if self.warmup_steps == 0:
            return after
        warm = base * (s + 1).astype(jnp.float32) / self.warmup_steps
        return jnp.where(s < self.warmup_steps, warm, after)


# --- per-epoch state machines ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlateauState:
    """Reduce-on-plateau state, updated once per epoch by `plateau_update`.

    **Fields:**
    - `best`: the best validation metric so far.
    - `count`: epochs since it last improved.
    - `scale`: the multiplier of every group's base learning rate (starts at 1).
    """

    best: float = -math.inf
    count: int = 0
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class EarlyStopState:
    """Early-stopping state, updated once per epoch by `early_stop_update`.

    **Fields:**
    - `best`: the best validation metric so far.
    - `count`: epochs since it last improved.
    - `stop`: whether training should stop now.
    """

    best: float = -math.inf
    count: int = 0
    stop: bool = False


def _improves(metric: float, best: float, mode: Mode) -> bool:
    """Whether `metric` strictly improves on `best` (higher for "max", lower for "min")."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    return metric > best if mode == "max" else -metric > best


def _signed(metric: float, mode: Mode) -> float:
    """The metric stored as `best`: itself for "max", negated for "min" (so larger is better)."""
    return float(metric) if mode == "max" else -float(metric)


def plateau_update(
    state: PlateauState,
    metric: float,
    *,
    patience: int,
    factor: float,
    mode: Mode = "max",
) -> PlateauState:
    """One epoch of reduce-on-plateau, as the authors' `reduce_lr_on_plateau`.

    After more than `patience` epochs without a strict improvement, `scale` is multiplied by
    `factor` and the counter restarts. (The `lr_min` floor is applied by the schedule.)

    **Arguments:**
    - `state`: the state after the previous epoch (`PlateauState()` at the start).
    - `metric`: this epoch's validation metric (accuracy: `mode="max"`).
    - `patience`: epochs without improvement tolerated before a reduction.
    - `factor`: multiplier of the scale at a reduction, in (0, 1].
    - `mode`: `"max"` (higher is better) or `"min"`. `best` is stored negated for `"min"`.

    **Returns:** the new `PlateauState`.
    """
    if _improves(metric, state.best, mode):
        return PlateauState(best=_signed(metric, mode), count=0, scale=state.scale)
    count = state.count + 1
    if count > patience:
        return PlateauState(best=state.best, count=0, scale=state.scale * factor)
    return PlateauState(best=state.best, count=count, scale=state.scale)


def early_stop_update(
    state: EarlyStopState,
    metric: float,
    *,
    patience: int | None,
    mode: Mode = "max",
) -> EarlyStopState:
    """One epoch of early stopping: stop after more than `patience` epochs without improvement.

    **Arguments:**
    - `state`: the state after the previous epoch (`EarlyStopState()` at the start).
    - `metric`: this epoch's validation metric.
    - `patience`: epochs without a strict improvement tolerated; `None` never stops.
    - `mode`: `"max"` (higher is better) or `"min"`. `best` is stored negated for `"min"`.

    **Returns:** the new `EarlyStopState`; stop training when its `stop` is true.
    """
    if _improves(metric, state.best, mode):
        return EarlyStopState(best=_signed(metric, mode), count=0, stop=False)
    count = state.count + 1
    return EarlyStopState(
        best=state.best, count=count, stop=patience is not None and count > patience
    )
