"""Training curves as PNG files, drawn with matplotlib's object API on the Agg canvas.

No pyplot: each figure is a `matplotlib.figure.Figure` of its own, so plotting from the trainer
never touches global state or needs a display. Two kinds of figure:

- `curves_figure` / `plot_curves`: one run, one panel per metric (e.g. `loss`, `accuracy`), each
  with the train, validation and test curves per epoch that the records hold (for metric `m`,
  the keys `m` or `train_m`, `val_m` and `test_m`).
- `comparison_figure` / `plot_runs`: one metric across several runs (`s5jax plot`).

Losses and errors are drawn on a log axis when all their values are positive (a Gaussian NLL
can be negative: then the axis is linear; accuracies always are). The paper's figure, where
the config gives one, is a dashed horizontal line on its metric's panel; the best-validation
epoch is a dotted vertical line with a star on the validation curve.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from .._atomic import atomic_open
from ..config import PaperResult, load_experiment
from ._logging import METRICS_FILE, read_metrics
from ._rundir import run_order

__all__ = [
    "PANEL_SIZE",
    "SPLIT_COLORS",
    "comparison_figure",
    "curves_figure",
    "paper_reference",
    "plot_curves",
    "plot_runs",
]

DPI = 100
PANEL_SIZE = (560, 380)  # pixels of one panel
COMPARISON_SIZE = (800, 500)  # pixels of the comparison figure
SPLIT_COLORS = {"train": "tab:blue", "val": "tab:orange", "test": "tab:green"}
_PREFIXES = tuple(f"{split}_" for split in SPLIT_COLORS)

Reference = tuple[str, float]  # (metric, value), e.g. ("test_accuracy", 0.8815)


def _base_metric(name: str) -> str:
    """`val_loss` → `loss`: the metric name without its split prefix."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _number(value: Any) -> float:
    """A finite float, or NaN (a gap in the curve) for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value) if math.isfinite(value) else math.nan


def _series(records: Sequence[Mapping[str, Any]], key: str, x: str) -> tuple[np.ndarray, ...]:
    """The x and y values of `key` in the records that hold both (y NaN where not finite)."""
    rows = [(float(r[x]), _number(r[key])) for r in records if key in r and x in r]
    xs = np.array([p[0] for p in rows], float)
    return xs, np.array([p[1] for p in rows], float)


def _panel_series(
    records: Sequence[Mapping[str, Any]], metric: str, x: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Split → (x, y) for one metric, only the splits with a finite value."""
    out = {}
    for split in SPLIT_COLORS:
        keys = [metric, f"train_{metric}"] if split == "train" else [f"{split}_{metric}"]
        for key in keys:
            xs, ys = _series(records, key, x)
            if np.isfinite(ys).any():
                out[split] = (xs, ys)
                break
    return out


def log_scale_for(metric: str, values: Sequence[float]) -> bool:
    """Whether a metric's axis is logarithmic: a loss or error whose values are all positive.

    **Arguments:**
    - `metric`: the metric name (with or without split prefix).
    - `values`: the values to draw (NaN ignored), including any reference line.

    **Returns:** `False` for accuracies, for no finite value and when any value is ≤ 0.
    """
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite)]
    return "accuracy" not in metric and finite.size > 0 and bool(np.all(finite > 0))


def plain_log_ticks(axis: Axis, values: Sequence[float]) -> None:
    """Ticks of a log `axis` that stay readable over any span of `values`, labelled plainly
    (0.002, 1e-05): matplotlib's own leave a span of under a decade with one or no label
    (a pendulum's val mse from 3.1e-3 to 3.8e-3) and label every minor tick of a span of
    two, overlapping. Under a decade: about six evenly spaced values; up to three decades:
    1, 2 and 5 of each; beyond: one per decade."""
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    span = finite.max() / finite.min() if finite.size else np.inf
    if span < 10:
        axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    else:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if span <= 1e3 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _best_marker(ax: Axes, best_epoch: int | None, xs: np.ndarray, ys: np.ndarray) -> None:
    """The best-validation epoch: a dotted vertical line and a star on the curve."""
    if best_epoch is None:
        return
    ax.axvline(
        best_epoch,
        color="0.45",
        linestyle=":",
        linewidth=1.2,
        label=f"best val (epoch {best_epoch})",
    )
    at = np.flatnonzero((xs == best_epoch) & np.isfinite(ys))
    if at.size:
        ax.plot(xs[at[0]], ys[at[0]], marker="*", markersize=12, color="tab:red", zorder=5)


def _draw_panel(
    ax: Axes,
    metric: str,
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    x: str,
    reference: Reference | None,
    best_epoch: int | None,
) -> None:
    """One metric's curves, its reference line and the best epoch."""
    ref = reference if reference and _base_metric(reference[0]) == metric else None
    values = [y for _, ys in series.values() for y in ys] + ([ref[1]] if ref else [])
    for split, (xs, ys) in series.items():
        markers = "o" if len(xs) <= 50 else None
        ax.plot(xs, ys, color=SPLIT_COLORS[split], marker=markers, markersize=3, label=split)
    if ref is not None:
        ax.axhline(ref[1], color="black", linestyle="--", linewidth=1.2, label="paper")
    if "val" in series:
        _best_marker(ax, best_epoch, *series["val"])
    if log_scale_for(metric, values):
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis, values)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
    ax.set_title(metric, loc="left")
    ax.set_xlabel(x)
    ax.grid(True, which="major", color="0.9")
    ax.legend(fontsize="small")


def curves_figure(
    records: Sequence[Mapping[str, Any]],
    *,
    metrics: Sequence[str] = ("loss", "accuracy"),
    kind: str | None = "epoch",
    x: str = "epoch",
    title: str | None = None,
    columns: int = 2,
    reference: Reference | None = None,
    best_epoch: int | None = None,
) -> Figure:
    """One run's training curves as a matplotlib `Figure` (Agg canvas).

    **Arguments:**
    - `records`: metric records, e.g. from `read_metrics`.
    - `metrics`: the metrics, one panel each; split prefixes are ignored, so
      `("loss", "val_loss", "val_accuracy")` gives the panels `loss` and `accuracy`, each with
      the train (`m` or `train_m`), val (`val_m`) and test (`test_m`) curves found. Metrics
      without data get no panel.
    - `kind`: use only the records of this kind (`None`: all records).
    - `x`: the record key of the horizontal axis.
    - `title`: the figure's title.
    - `columns`: panels per row.
    - `reference`: `(metric, value)` of the paper's figure (e.g. `("test_accuracy", 0.88)`),
      a dashed line on that metric's panel.
    - `best_epoch`: the best-validation epoch, marked on every panel with a val curve.

    **Returns:** the figure, `columns' × PANEL_SIZE[0]` by `rows × PANEL_SIZE[1]` pixels
    (`columns'` the columns actually used); with no data, one panel saying so.
    """
    if kind is not None:
        records = [r for r in records if r.get("kind") == kind]
    bases = list(dict.fromkeys(_base_metric(m) for m in metrics))
    panels = [(m, s) for m in bases if (s := _panel_series(records, m, x))]
    ncols = max(1, min(columns, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    figure = Figure(
        figsize=(ncols * PANEL_SIZE[0] / DPI, nrows * PANEL_SIZE[1] / DPI),
        dpi=DPI,
        layout="constrained",
    )
    FigureCanvasAgg(figure)
    axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (metric, series) in zip(axes, panels, strict=False):
        _draw_panel(ax, metric, series, x, reference, best_epoch)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    if not panels:
        axes[0].text(0.5, 0.5, "no data", ha="center", va="center")
    if title:
        figure.suptitle(title)
    return figure


#: The PNG `Software` text chunk of every plot s5jax writes: `s5jax plot --out` replaces an
#: existing PNG only when it carries this mark (an earlier plot), never a user's image.
PNG_SOFTWARE = "s5jax"


def _save_atomic(figure: Figure, path: Path) -> Path:
    """Write a PNG through a temporary file and a rename, marked as written by s5jax."""
    with atomic_open(path) as f:
        figure.savefig(f, format="png", dpi=DPI, metadata={"Software": PNG_SOFTWARE})
    return path


def written_by_s5jax(path: Path) -> bool:
    """Whether `path` is a PNG whose `Software` text chunk is s5jax's mark (read with Pillow)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.format == "PNG" and image.info.get("Software") == PNG_SOFTWARE
    except (OSError, UnidentifiedImageError):
        return False


def plot_curves(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike, **options: Any
) -> Path:
    """Draw one run's training curves to a PNG file (written atomically).

    **Arguments:**
    - `records`: metric records, e.g. from `read_metrics`.
    - `path`: the PNG file to write.
    - `**options`: those of `curves_figure` (`metrics`, `kind`, `x`, `title`, `columns`,
      `reference`, `best_epoch`).

    **Returns:** the path written.
    """
    return _save_atomic(curves_figure(records, **options), Path(path))


def comparison_figure(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    metric: str,
    *,
    x: str = "epoch",
    reference: Reference | None = None,
    best_epochs: Mapping[str, int | None] | None = None,
) -> Figure:
    """One metric of several runs in one panel, as a matplotlib `Figure` (Agg canvas).

    **Arguments:**
    - `runs`: label → the run's epoch records.
    - `metric`: the record key to draw, e.g. `val_accuracy` or `train_loss`.
    - `x`: the record key of the horizontal axis.
    - `reference`: `(metric, value)` of the paper's figure, a dashed line when its metric
      (without split prefix) is `metric`'s.
    - `best_epochs`: label → the run's best-validation epoch, starred on its curve.

    **Returns:** the figure, `COMPARISON_SIZE` pixels.
    """
    figure = Figure(
        figsize=(COMPARISON_SIZE[0] / DPI, COMPARISON_SIZE[1] / DPI), dpi=DPI, layout="constrained"
    )
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    values = []
    for label, records in runs.items():
        xs, ys = _series(records, metric, x)
        (line,) = ax.plot(xs, ys, marker="o" if len(xs) <= 50 else None, markersize=3, label=label)
        best = (best_epochs or {}).get(label)
        at = np.flatnonzero((xs == best) & np.isfinite(ys)) if best is not None else []
        if len(at):
            ax.plot(xs[at[0]], ys[at[0]], marker="*", markersize=12, color=line.get_color())
        values.extend(ys)
    ref = reference if reference and _base_metric(reference[0]) == _base_metric(metric) else None
    if ref is not None:
        ax.axhline(ref[1], color="black", linestyle="--", linewidth=1.2, label="paper")
        values.append(ref[1])
    if log_scale_for(metric, values):
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis, values)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} (stars: best val epochs)" if best_epochs else metric, loc="left")
    ax.grid(True, which="major", color="0.9")
    ax.legend(fontsize="small")
    return figure


_DEFAULT_METRICS = ("val_accuracy", "val_mse", "val_loss", "train_loss")


def _check_out(out: Path, run_dirs: Sequence[Path]) -> None:
    """Refuse, before reading anything, an `out` that is not a `.png` name, that lies in one
    of the run directories (it would replace a file of the run, e.g. its metrics), or that
    exists and is not a plot s5jax wrote (a user's image or a folder)."""
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out {out}: give a file name ending in .png (the plot is a PNG)")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the PNG's name, e.g. {out / 'plot.png'}")
    if out.exists() and not written_by_s5jax(out):
        raise ValueError(
            f"--out {out} exists and is not a plot written by s5jax; give another name or "
            "move it away"
        )
    for d in run_dirs:
        if d.is_dir() and out.parent.resolve() == d.resolve():
            raise ValueError(
                f"--out {out} is inside the run directory {d}; write the comparison elsewhere"
            )


def _runs_in(folder: Path) -> list[Path]:
    """`folder` itself when it is a run directory (or not one at all: `_read_run` says why),
    else its runs when it is a seeds or sweep directory (`seed-*/`, `trial-*/` holding
    metrics.jsonl), in their numeric order."""
    if (folder / METRICS_FILE).is_file() or not folder.is_dir():
        return [folder]
    runs = [d for d in folder.iterdir() if d.is_dir() and (d / METRICS_FILE).is_file()]
    runs = [d for d in runs if d.name.startswith(("seed-", "trial-"))]
    return sorted(runs, key=run_order) or [folder]


def _read_run(run_dir: Path) -> tuple[list[dict], dict]:
    """The epoch records and results.json (or `{}`) of a run directory."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if not (run_dir / METRICS_FILE).is_file():
        raise FileNotFoundError(
            f"{run_dir / METRICS_FILE} not found: not a run directory written by `s5jax train`"
        )
    results_path = run_dir / "results.json"
    try:
        results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(
            f"{results_path} is not valid JSON; move it away to plot the run"
        ) from None
    return read_metrics(run_dir, kind="epoch"), results


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """Run directory names, or whole paths when two names are the same."""
    names = [d.name or str(d) for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def paper_reference(paper: PaperResult | None) -> Reference | None:
    """`(metric, value)` of the paper's figure in the metric's own units, or `None`."""
    if paper is None or paper.raw_value is None:
        return None
    return paper.metric, paper.raw_value


def _reference(run_dirs: Sequence[Path]) -> Reference | None:
    """The paper's figure when every run's config records the same one."""
    refs = set()
    for run_dir in run_dirs:
        config = run_dir / "config.json"
        refs.add(paper_reference(load_experiment(config).paper) if config.is_file() else None)
    return refs.pop() if len(refs) == 1 else None


def plot_runs(
    run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *, metric: str | None = None
) -> Path:
    """Compare runs: one metric of each run per epoch, in one PNG (written atomically).

    **Arguments:**
    - `run_dirs`: run directories written by `s5jax train`; a seeds or sweep directory
      stands for its runs (`seed-N/`, `trial-NNN/`).
    - `out`: the PNG file to write.
    - `metric`: an epoch-record key (e.g. `val_accuracy`, `train_loss`); default the first of
      `val_accuracy`, `val_mse`, `val_loss`, `train_loss` that every run (with records) has.

    **Returns:** the path written. Raises `FileNotFoundError` for a missing run directory or
    metrics file, `ValueError` when a run with epoch records lacks the metric (naming the
    metrics they all have).
    """
    dirs = [run for d in run_dirs for run in _runs_in(Path(d))]
    seen: set[Path] = set()  # a run given twice (`plot sw sw/trial-000`) is drawn once
    dirs = [d for d in dirs if not (d.resolve() in seen or seen.add(d.resolve()))]
    _check_out(Path(out), [Path(d) for d in run_dirs] + dirs)
    runs = [_read_run(d) for d in dirs]
    if metric is None:  # the first default that every run with records has
        recorded = [{k for r in records for k in r} for records, _ in runs if records]
        metric = next((m for m in _DEFAULT_METRICS if recorded and all(m in k for k in recorded)),
                      None)  # fmt: skip
        if metric is None:
            raise ValueError(
                f"{dirs[0]} has no epoch records yet" if len(dirs) == 1 else
                f"none of {', '.join(_DEFAULT_METRICS)} is in every run; give --metric"
            )  # fmt: skip
    if not any(metric in r for records, _ in runs for r in records):
        keys = sorted({k for records, _ in runs for r in records for k in r} - {"kind", "time"})
        raise ValueError(f"no run has the metric {metric!r}; the runs have {', '.join(keys)}")
    labels = _labels(dirs)
    # A run with records but none of this metric (a regression run beside classifiers)
    # would be a legend entry without a curve: name it and the metrics all runs share.
    lacking = [label for label, (records, _) in zip(labels, runs, strict=True)
               if records and not any(metric in r for r in records)]  # fmt: skip
    if lacking:
        shared = set.intersection(*(
            {k for r in records for k in r} for records, _ in runs if records
        )) - {"kind", "time", "epoch"}  # fmt: skip
        hint = (f"give --metric with one they all have: {', '.join(sorted(shared))}"
                if shared else "plot them separately")  # fmt: skip
        raise ValueError(
            f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no {metric!r}; {hint}"
        )
    figure = comparison_figure(
        {label: records for label, (records, _) in zip(labels, runs, strict=True)},
        metric,
        reference=_reference(dirs),
        best_epochs={
            label: results.get("best_epoch")
            for label, (_, results) in zip(labels, runs, strict=True)
        },
    )
    return _save_atomic(figure, Path(out))
