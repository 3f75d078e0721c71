"""Training: optimiser groups, learning-rate schedules, reduce-on-plateau and early stopping.

See `_optim` for the parameter groups and how the plateau scale reaches the optimiser, and
`_schedule` for the schedule shapes (including the authors' quirks under `faithful_schedule`).
"""

from ._engine import TrainingDiverged, train_and_evaluate
from ._logging import METRICS_FILE, MetricsLogger, read_metrics, summary_table
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
from ._plots import plot_curves, plot_runs
from ._predict import export_run, predict_run
from ._progress import Progress
from ._runs import DATA_SOURCES, data_status, evaluate_run, load_run, user_data_config
from ._schedule import (
    EarlyStopState,
    LRSchedule,
    PlateauState,
    early_stop_update,
    plateau_update,
)
from ._sharding import DataParallel, initialize_multihost
from ._tensorboard import EventWriter

__all__ = [
    "DATA_SOURCES",
    "GROUPS",
    "METRICS_FILE",
    "PARTITIONS",
    "DataParallel",
    "EarlyStopState",
    "EventWriter",
    "LRSchedule",
    "MetricsLogger",
    "PlateauState",
    "Progress",
    "TrainingDiverged",
    "build_optimizer",
    "data_status",
    "describe_groups",
    "early_stop_update",
    "evaluate_run",
    "export_run",
    "format_groups",
    "get_lr_scale",
    "group_of_role",
    "group_schedules",
    "initialize_multihost",
    "load_run",
    "optimizer_groups",
    "plateau_update",
    "plot_curves",
    "plot_runs",
    "predict_run",
    "read_metrics",
    "set_lr_scale",
    "summary_table",
    "train_and_evaluate",
    "user_data_config",
]
