"""Metrics of a run: `run_dir/metrics.jsonl` (one JSON object per line) and TensorBoard events.

Each record is `{"kind": "step" | "epoch", "step": int, "epoch": int, "time": float, ...}` with
`time` the wall-clock time (seconds since the Unix epoch) and the remaining keys the metrics.
Every line is flushed when written, so a killed run keeps its complete lines. Non-finite
floats are written as `NaN` / `Infinity` (Python's `json` reads them back). The JSONL file
stays hand-written: it is a few lines of the standard library, and `read_metrics`, the plots
and the tests read it without any logging framework.

On reopening a run directory (a resumed run), a truncated last line is dropped and, given
`resume_step`, so are the records with `step > resume_step` (the resumed run writes them
again); the file is then rewritten atomically (temporary file + rename).

The numeric metrics also go to TensorBoard event files under `run_dir/tensorboard/`, tagged
`<kind>/<name>` (e.g. `step/loss`, `epoch/val_accuracy`), with the global step as x-axis;
see `_tensorboard` for the histograms, text and hparams written beside them.

`summary_table` is the one plain-text table printer of the package (the trainer's summary
and `s5jax list`).
"""

from __future__ import annotations

import json
import numbers
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .._atomic import atomic_write_text
from ._tensorboard import EventWriter

__all__ = ["METRICS_FILE", "MetricsLogger", "read_metrics", "summary_table"]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_RESERVED = ("kind", "step", "epoch", "time")


def _to_json_value(value: Any) -> Any:
    """Plain Python value of a metric (numpy / JAX scalars become int, float or bool)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "tolist"):  # numpy / JAX arrays and scalars
        return value.tolist()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _parse_lines(text: str, where: str = METRICS_FILE) -> tuple[list[dict], bool]:
    """Parse the records of a metrics file.

    **Arguments:**
    - `text`: the file contents.
    - `where`: the file's name in an error message.

    **Returns:** the records and whether a truncated last line was dropped. A line that does
    not parse, other than the last one, raises `ValueError`.
    """
    lines = text.split("\n")
    # A complete file ends with "\n", so the last piece is "" (or a truncated line).
    complete, tail = lines[:-1], lines[-1]
    records = []
    for i, line in enumerate(complete):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(complete) - 1 and not tail:
                return records, True
            raise ValueError(f"{where}: line {i + 1} is not valid JSON") from None
    return records, bool(tail)


def _read_records(path: Path) -> tuple[list[dict], bool]:
    """`_parse_lines` of the file at `path`; a damaged file is a `ValueError` naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{path} is not a metrics file (not UTF-8 text; another program may have written "
            "over it)"
        ) from None
    return _parse_lines(text, where=str(path))


def read_metrics(run_dir: str | os.PathLike, kind: str | None = None) -> list[dict]:
    """Read the records of `run_dir/metrics.jsonl`.

    **Arguments:**
    - `run_dir`: the run directory.
    - `kind`: keep only the records of this kind (`"step"` or `"epoch"`); all if `None`.

    **Returns:** the records in file order; a truncated last line (a run killed mid-write, or
    one still writing) is skipped; an empty list if the file does not exist.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records, _ = _read_records(path)
    if kind is not None:
        records = [r for r in records if r.get("kind") == kind]
    return records


def _dumps(record: Mapping[str, Any]) -> str:
    """One JSON line (no embedded newlines)."""
    return json.dumps(record, separators=(", ", ": "), default=str)


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` through a temporary file and a rename."""
    atomic_write_text(path, text)


def _prepare_existing(path: Path, resume_step: int | None) -> None:
    """Drop a truncated last line and, given `resume_step`, the records after it."""
    if not path.exists():
        return
    records, truncated = _read_records(path)
    kept = records
    if resume_step is not None:
        kept = [r for r in records if int(r.get("step", 0)) <= resume_step]
    if truncated or len(kept) != len(records):
        _write_atomic(path, "".join(_dumps(r) + "\n" for r in kept))


def _scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a record: its numeric, non-reserved entries."""
    kind = record["kind"]
    return {
        f"{kind}/{name}": float(value)
        for name, value in record.items()
        if name not in _RESERVED and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class MetricsLogger:
    """Appends metric records to `run_dir/metrics.jsonl` and to TensorBoard event files.

    **Arguments:**
    - `run_dir`: the run directory (created if missing).
    - `resume_step`: when resuming from a checkpoint at this step, drop the records with a
      larger step (and tell TensorBoard to drop its events after it; from a run that had
      no checkpoint yet, `resume_step = 0`, all of them).
    - `tensorboard`: also write TensorBoard events under `run_dir/tensorboard/`.
    - `clock`: wall-clock function for the `time` field.

    Use as a context manager or call `close()`.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        resume_step: int | None = None,
        tensorboard: bool = True,
        clock: Callable[[], float] = time.time,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._clock = clock
        _prepare_existing(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._events = None
        if tensorboard:
            # Step 0 holds only what a run writes when it starts (the config text); a resume
            # from step 0 starts over, so it purges that too.
            purge = None if resume_step is None else (resume_step + 1 if resume_step else 0)
            self._events = EventWriter(self.run_dir / TENSORBOARD_DIR, purge_step=purge)

    def log(self, kind: str, step: int, epoch: int, **metrics: Any) -> dict:
        """Write one record.

        **Arguments:**
        - `kind`: `"step"` or `"epoch"`.
        - `step`: the global optimiser step.
        - `epoch`: the epoch.
        - `**metrics`: the metric values (numbers, numpy/JAX scalars, strings, ...).

        **Returns:** the record as written.
        """
        clash = [k for k in metrics if k in _RESERVED]
        if clash:
            raise ValueError(f"metric names {clash} are reserved")
        record = {"kind": kind, "step": int(step), "epoch": int(epoch), "time": self._clock()}
        record.update({k: _to_json_value(v) for k, v in metrics.items()})
        self._file.write(_dumps(record) + "\n")
        self._file.flush()
        if self._events is not None:
            self._events.add_scalars(_scalars(record), record["step"], record["time"])
        return record

    def log_step(self, step: int, epoch: int, **metrics: Any) -> dict:
        """Write a `"step"` record; see `log`."""
        return self.log("step", step, epoch, **metrics)

    def log_epoch(self, step: int, epoch: int, **metrics: Any) -> dict:
        """Write an `"epoch"` record; see `log`."""
        return self.log("epoch", step, epoch, **metrics)

    def log_histograms(
        self, step: int, histograms: dict[str, np.ndarray], scalars: dict[str, float]
    ) -> None:
        """TensorBoard only: histograms and scalars of the model (see `ssm_statistics`).

        **Arguments:**
        - `step`: the global step.
        - `histograms`: tag → values.
        - `scalars`: tag → value.
        """
        if self._events is not None:
            self._events.add_histograms(histograms, step)
            self._events.add_scalars(scalars, step)

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        """TensorBoard only: a Markdown text, e.g. the resolved config.

        **Arguments:**
        - `tag`: the tag.
        - `text`: the Markdown text.
        - `step`: the global step.
        """
        if self._events is not None:
            self._events.add_text(tag, text, step)

    def log_hparams(self, step: int, hparams: dict[str, Any], metrics: dict[str, Any]) -> None:
        """TensorBoard only: the run's hyperparameters and final metrics (HParams tab).

        **Arguments:**
        - `step`: the step of the final metrics.
        - `hparams`: name → bool, number or string.
        - `metrics`: tag → final value (`None` skipped).
        """
        if self._events is not None:
            self._events.add_hparams(hparams, metrics, step)

    def close(self) -> None:
        """Close the files (idempotent)."""
        if not self._file.closed:
            self._file.close()
        if self._events is not None:
            self._events.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _format_cell(value: Any, float_format: str) -> str:
    """A table cell: `–` for None, floats with `float_format`, anything else with `str`."""
    value = _to_json_value(value)
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, float_format)
    return str(value)


def _is_number(value: Any) -> bool:
    """Whether a cell is right-aligned (a number, not bool)."""
    value = _to_json_value(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table_columns(
    rows: list[Mapping[str, Any]] | list[list[Any]], headers: list[str] | None
) -> tuple[list[str], list[list[Any]]]:
    """Headers and row values of a table given as mappings or as sequences."""
    if rows and all(isinstance(r, Mapping) for r in rows):
        if headers is None:
            headers = list(dict.fromkeys(k for r in rows for k in r))
        return list(headers), [[r.get(h) for h in headers] for r in rows]
    values = [list(r) for r in rows]
    width = max((len(r) for r in values), default=0)
    if headers is None:
        headers = [""] * width
    width = max(width, len(headers))
    headers = list(headers) + [""] * (width - len(headers))
    return headers, [r + [None] * (width - len(r)) for r in values]


def summary_table(
    rows: list[Mapping[str, Any]] | list[list[Any]],
    headers: list[str] | None = None,
    *,
    float_format: str = ".4g",
) -> str:
    """A plain-text table with aligned columns, e.g. metric | ours | paper | difference.

    **Arguments:**
    - `rows`: mappings (column name → value; the columns are the keys in first-seen order)
      or sequences of values.
    - `headers`: the column names (and, for mappings, their selection and order).
    - `float_format`: the format spec of floats.

    **Returns:** the table, lines joined by newlines (no trailing newline). `None` is shown
    as "–"; numbers are right-aligned, the rest left-aligned.
    """
    headers, values = _table_columns(list(rows), headers)
    cells = [[_format_cell(v, float_format) for v in row] for row in values]
    numeric = [
        bool(values) and all(_is_number(r[j]) or r[j] is None for r in values)
        for j in range(len(headers))
    ]
    widths = [max([len(h)] + [len(r[j]) for r in cells]) for j, h in enumerate(headers)]

    def line(items: list[str]) -> str:
        parts = [
            s.rjust(w) if num else s.ljust(w)
            for s, w, num in zip(items, widths, numeric, strict=True)
        ]
        return " | ".join(parts).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(r) for r in cells])
