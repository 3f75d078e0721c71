"""The optimiser: parameter groups from the roles, one Adam/AdamW per group (reference §5).

Groups (labels of the array leaves of `eqx.filter(model, eqx.is_inexact_array)`):

- `"ssm"`: Adam at `ssm_lr`, no weight decay.
- `"ssm_decay"`: AdamW at `ssm_lr` with weight decay (B̃ in the `BandCdecay` partition).
- `"regular"`: AdamW at the global `lr = lr_factor·ssm_lr` with weight decay.

| partition | "ssm" | "ssm_decay" | "regular" |
|---|---|---|---|
| standard | B, Λ, log Δ | – | C, D, the rest |
| BandCdecay | Λ, log Δ | B | C, D, the rest |
| BfastandCdecay | Λ, log Δ | – | B, C, D, the rest |
| noBCdecay | B, C, D, Λ, log Δ | – | the rest |

`dt_global` moves log Δ to "regular"; norms (untagged) are always "regular".

Learning-rate schedules and reduce-on-plateau: every group's rate is `LRSchedule(step, scale)`.
The plateau `scale` is an optax hyperparameter of the whole optimiser
(`optax.inject_hyperparams`), so it lives in the optimiser state and is checkpointed with it.
The training loop keeps a `PlateauState`, updates it once per epoch with `plateau_update`, and
returns a new optimiser state with `set_lr_scale(opt_state, plateau.scale)`; nothing is
mutated.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..config import OptimConfig
from ..nn import parameter_roles
from ._schedule import LRSchedule

__all__ = [
    "GROUPS",
    "PARTITIONS",
    "build_optimizer",
    "describe_groups",
    "format_groups",
    "get_lr_scale",
    "group_of_role",
    "group_schedules",
    "optimizer_groups",
    "set_lr_scale",
]

#: The optimiser groups, in report order.
GROUPS = ("ssm", "ssm_decay", "regular")

#: Group of each role per partition (log_step is moved to "regular" by `dt_global`).
PARTITIONS = {
    "standard": {"Lambda": "ssm", "log_step": "ssm", "B": "ssm", "C": "regular", "D": "regular"},
    "BandCdecay": {
        "Lambda": "ssm",
        "log_step": "ssm",
        "B": "ssm_decay",
        "C": "regular",
        "D": "regular",
    },
    "BfastandCdecay": {
        "Lambda": "ssm",
        "log_step": "ssm",
        "B": "regular",
        "C": "regular",
        "D": "regular",
    },
    "noBCdecay": {"Lambda": "ssm", "log_step": "ssm", "B": "ssm", "C": "ssm", "D": "ssm"},
}


def group_of_role(role: str, partition: str, *, dt_global: bool) -> str:
    """The optimiser group of one parameter role.

    **Arguments:**
    - `role`: one of `s5jax.nn.ROLES`.
    - `partition`: one of `PARTITIONS`.
    - `dt_global`: put log Δ in "regular".

    **Returns:** one of `GROUPS`.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {sorted(PARTITIONS)}, got {partition!r}")
    if role == "log_step" and dt_global:
        return "regular"
    return PARTITIONS[partition].get(role, "regular")


def optimizer_groups(model, partition: str = "standard", *, dt_global: bool = False):
    """The group label of every array of `model`.

    **Arguments:**
    - `model`: an Equinox module whose S5 parameters carry roles (`s5jax.nn.param_field`).
    - `partition`: `"standard"`, `"BandCdecay"`, `"BfastandCdecay"` or `"noBCdecay"`.
    - `dt_global`: put log Δ in "regular" (reference §5).

    **Returns:** a pytree with the structure of `eqx.filter(model, eqx.is_inexact_array)`
    holding one of `GROUPS` per array.
    """
    roles = parameter_roles(model)
    return jax.tree.map(lambda r: group_of_role(r, partition, dt_global=dt_global), roles)


def group_schedules(
    optim_cfg: OptimConfig, *, steps_per_epoch: int, epochs: int
) -> dict[str, LRSchedule]:
    """The learning-rate schedule of each group (same shape, group's own base rate).

    **Arguments:**
    - `optim_cfg`: the optimiser settings.
    - `steps_per_epoch`: optimiser updates per epoch.
    - `epochs`: epochs of the run.

    **Returns:** `{group: LRSchedule}` for every group of `GROUPS`.
    """
    base = {"ssm": optim_cfg.ssm_lr, "ssm_decay": optim_cfg.ssm_lr, "regular": optim_cfg.lr}
    return {
        group: LRSchedule(
            base_lr=lr,
            lr_min=optim_cfg.lr_min,
            steps_per_epoch=steps_per_epoch,
            epochs=epochs,
            warmup_epochs=optim_cfg.warmup_epochs,
            kind=optim_cfg.schedule,
            faithful=optim_cfg.faithful_schedule,
        )
        for group, lr in base.items()
    }


def _group_transform(group: str, schedule, optim_cfg: OptimConfig):
    """Adam (group "ssm") or AdamW (the others) with `schedule` as its learning rate."""
    adam_args = dict(b1=optim_cfg.adam_b1, b2=optim_cfg.adam_b2, eps=optim_cfg.adam_eps)
    if group == "ssm":
        return optax.adam(learning_rate=schedule, **adam_args)
    return optax.adamw(learning_rate=schedule, weight_decay=optim_cfg.weight_decay, **adam_args)


def build_optimizer(
    optim_cfg: OptimConfig, model, *, steps_per_epoch: int, epochs: int
) -> tuple[optax.GradientTransformationExtraArgs, object]:
    """The optimiser of the paper's runs: one Adam/AdamW per group, scheduled, optionally clipped.

    The result is `inject_hyperparams` over a hyperparameter `lr_scale` (initially 1), the
    reduce-on-plateau multiplier of every base rate (see `set_lr_scale`). Inside: global-norm
    clipping when `optim_cfg.grad_clip` is set, then `optax.multi_transform` over the groups.
    Call `update(grads, opt_state, params)` with `params` (AdamW needs them). The optimiser
    traces under standard dtype promotion (optax's Adam is not strict-promotion clean).

    **Arguments:**
    - `optim_cfg`: the optimiser settings (`s5jax.config.OptimConfig`).
    - `model`: the model (only its structure and parameter roles are read).
    - `steps_per_epoch`: optimiser updates per epoch.
    - `epochs`: epochs of the run.

    **Returns:** `(optimizer, labels)`; `labels` is `optimizer_groups(model, ...)`. Initialise
    with `optimizer.init(eqx.filter(model, eqx.is_inexact_array))`.
    """
    labels = optimizer_groups(model, optim_cfg.partition, dt_global=optim_cfg.dt_global)
    schedules = group_schedules(optim_cfg, steps_per_epoch=steps_per_epoch, epochs=epochs)

    def make(lr_scale):
        transforms = {
            group: _group_transform(group, _scaled(schedules[group], lr_scale), optim_cfg)
            for group in GROUPS
        }
        # A function, not the tree itself: a labels tree shaped like an Equinox model is
        # callable, and optax would call it.
        inner = optax.multi_transform(transforms, lambda _: labels)
        if optim_cfg.grad_clip is None:
            return inner
        return optax.chain(optax.clip_by_global_norm(optim_cfg.grad_clip), inner)

    optimizer = optax.inject_hyperparams(make, hyperparam_dtype=jnp.float32)(lr_scale=1.0)
    return _standard_promotion(optimizer), labels


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` traced under standard dtype promotion, whatever the caller's setting.

    optax's Adam bias correction computes `b1 ** count` (Python float ** int32), which
    `jax_numpy_dtype_promotion = "strict"` rejects; the rest of the model may run strict.
    """

    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None, **extra_args):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)


def _scaled(schedule: LRSchedule, lr_scale):
    """`schedule` as an optax schedule of the step count, with the plateau scale bound."""
    return lambda count: schedule(count, lr_scale)


def set_lr_scale(opt_state, scale: float):
    """A copy of `opt_state` (from `build_optimizer`) whose plateau scale is `scale`.

    **Arguments:**
    - `opt_state`: the optimiser state.
    - `scale`: the new multiplier of every group's base rate (e.g. `PlateauState.scale`).

    **Returns:** the new optimiser state; `opt_state` is unchanged.
    """
    return optax.tree_utils.tree_set(opt_state, lr_scale=jnp.asarray(scale, jnp.float32))


def get_lr_scale(opt_state) -> float:
    """The plateau scale held by `opt_state` (from `build_optimizer`).

    **Arguments:**
    - `opt_state`: the optimiser state.

    **Returns:** the scale as a Python float.
    """
    return float(optax.tree_utils.tree_get(opt_state, "lr_scale"))


def describe_groups(model, labels) -> list[tuple[str, int, int, list[str]]]:
    """Which arrays are in which group, for printing at the start of a run.

    **Arguments:**
    - `model`: the model.
    - `labels`: its group labels (`optimizer_groups` or `build_optimizer`'s second output).

    **Returns:** one `(group, n_arrays, n_params, paths)` per group of `GROUPS` that holds an
    array, in that order; `paths` lists every array's path (e.g. `".ssm.B_re"`).
    """
    params = eqx.filter(model, eqx.is_inexact_array)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    groups = jax.tree.leaves(labels)
    if len(groups) != len(leaves):
        raise ValueError(f"labels has {len(groups)} leaves but the model has {len(leaves)} arrays")
    rows = []
    for group in GROUPS:
        members = [(p, x) for (p, x), g in zip(leaves, groups, strict=True) if g == group]
        if members:
            paths = [jax.tree_util.keystr(p) for p, _ in members]
            n_params = sum(int(np.prod(x.shape)) for _, x in members)
            rows.append((group, len(members), n_params, paths))
    return rows


def format_groups(rows, *, max_paths: int = 6) -> str:
    """A printable table of `describe_groups` rows.

    **Arguments:**
    - `rows`: the output of `describe_groups`.
    - `max_paths`: how many example paths to show per group.

    **Returns:** one line per group: name, number of arrays, of parameters, example paths.
    """
    lines = []
    for group, n_arrays, n_params, paths in rows:
        shown = ", ".join(paths[:max_paths]) + (", ..." if len(paths) > max_paths else "")
        lines.append(f"{group:<10} {n_arrays:>4} arrays {n_params:>12,} params  {shown}")
    return "\n".join(lines)
