"""Training: optimiser groups, learning-rate schedules, reduce-on-plateau and early stopping.

See `_optim` for the parameter groups and how the plateau scale reaches the optimiser, and
`_schedule` for the schedule shapes (including the authors' quirks under `faithful_schedule`).
"""

from ._optim import (
    GROUPS,
    PARTITIONS,
    build_optimizer,
    describe_groups,
    format_groups,
    get_lr_scale,
    group_of_role,
    group_schedules,
    optimizer_groups,
    set_lr_scale,
)
from ._schedule import (
    EarlyStopState,
    LRSchedule,
    PlateauState,
    early_stop_update,
    plateau_update,
)

__all__ = [
    "GROUPS",
    "PARTITIONS",
    "EarlyStopState",
    "LRSchedule",
    "PlateauState",
    "build_optimizer",
    "describe_groups",
    "early_stop_update",
    "format_groups",
    "get_lr_scale",
    "group_of_role",
    "group_schedules",
    "optimizer_groups",
    "plateau_update",
    "set_lr_scale",
]
