"""TensorBoard logging through tensorboardX (no PyTorch or TensorFlow needed).

`EventWriter` writes one run's event files under `run_dir/tensorboard/`: the metric scalars,
per epoch the SSM parameters of every layer (`ssm_statistics`), the resolved config as text
and, at the end of a run, its hyperparameters and final metrics for the HParams tab.

A resumed run opens its writer with `purge_step` = the first step it will write again: the
new event file starts with a `SessionLog.START` at that step and TensorBoard drops the events
at steps ≥ it that the killed run had written, so every step is shown once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import jax
import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summaries

from ..nn import S5SSM

__all__ = ["EventWriter", "flat_hparams", "ssm_statistics"]


def _ssm_layers(model: Any) -> list[S5SSM]:
    """The S5SSM modules of `model`, in tree order."""
    leaves = jax.tree_util.tree_leaves(model, is_leaf=lambda x: isinstance(x, S5SSM))
    return [leaf for leaf in leaves if isinstance(leaf, S5SSM)]


def ssm_statistics(model: Any) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """What TensorBoard shows of each SSM layer: its timescales, eigenvalues and matrix sizes.

    **Arguments:**
    - `model`: a model (any pytree) holding `S5SSM` layers.

    **Returns:** `(histograms, scalars)`. Per layer `i` (tree order) the histograms
    `ssm/layer{i}/Lambda_re`, `.../Lambda_im` (the stored eigenvalues Λ, one entry per state)
    and `.../Delta` (Δ = exp(log_step)); the scalars `ssm/layer{i}/B_norm` and
    `.../C_norm`, the Frobenius norms ‖B̃‖ and ‖C̃‖ of the complex matrices.
    """
    histograms, scalars = {}, {}
    for i, layer in enumerate(_ssm_layers(model)):
        names = ("Lambda_re", "Lambda_im", "log_step", "B_re", "B_im", "C_re", "C_im")
        p = jax.device_get({k: getattr(layer, k) for k in names})
        p = {k: np.asarray(v, np.float64) for k, v in p.items()}
        name = f"ssm/layer{i}"
        histograms[f"{name}/Lambda_re"] = p["Lambda_re"]
        histograms[f"{name}/Lambda_im"] = p["Lambda_im"]
        histograms[f"{name}/Delta"] = np.exp(p["log_step"])
        for m in ("B", "C"):
            squares = p[f"{m}_re"] ** 2 + p[f"{m}_im"] ** 2
            scalars[f"{name}/{m}_norm"] = float(np.sqrt(np.sum(squares)))
    return histograms, scalars


def flat_hparams(tree: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config dict as `section.key → value`, the values HParams can show.

    **Arguments:**
    - `tree`: nested dicts (e.g. `s5jax.config.to_dict(config)`).
    - `prefix`: prepended to every key.

    **Returns:** booleans, numbers and strings as they are; lists and tuples as their `str`;
    `None` dropped (HParams has no missing value).
    """
    out: dict[str, bool | int | float | str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = str(value)
    return out


class EventWriter:
    """TensorBoard event files of one run, written with tensorboardX's `SummaryWriter`.

    **Arguments:**
    - `log_dir`: directory of the event files (created if missing).
    - `purge_step`: for a resumed run, the first step it writes: TensorBoard drops the events
      an earlier run wrote at this step and after.

    Every call flushes, so a killed run keeps what it logged. Use as a context manager or call
    `close()`.
    """

    def __init__(self, log_dir: str | os.PathLike, *, purge_step: int | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # tensorboardX names files by the second and truncates an existing one; a nanosecond
        # suffix keeps two writers of the same second apart, in the order they were opened.
        self._writer = SummaryWriter(
            str(self.log_dir), purge_step=purge_step, filename_suffix=f".{time.time_ns()}"
        )

    def add_scalars(
        self, scalars: Mapping[str, float], step: int, wall_time: float | None = None
    ) -> None:
        """One scalar event per tag.

        **Arguments:**
        - `scalars`: tag → value (converted with `float`).
        - `step`: the global step.
        - `wall_time`: event time; defaults to now.
        """
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, float(value), step, walltime=wall_time)
        self._writer.flush()

    def add_histograms(self, histograms: Mapping[str, np.ndarray], step: int) -> None:
        """One histogram per tag (e.g. the output of `ssm_statistics`).

        **Arguments:**
        - `histograms`: tag → values (any shape; flattened).
        - `step`: the global step.
        """
        for tag, values in histograms.items():
            self._writer.add_histogram(tag, np.asarray(values, np.float64).ravel(), step)
        self._writer.flush()

    def add_text(self, tag: str, text: str, step: int = 0) -> None:
        """A text summary (Markdown), e.g. the resolved config in a code block.

        **Arguments:**
        - `tag`: the tag (tensorboardX appends `/text_summary`).
        - `text`: Markdown text.
        - `step`: the global step.
        """
        self._writer.add_text(tag, text, step)
        self._writer.flush()

    def add_hparams(
        self, hparams: Mapping[str, Any], metrics: Mapping[str, float | None], step: int
    ) -> None:
        """This run's hyperparameters and final metrics, for TensorBoard's HParams tab.

        Unlike `SummaryWriter.add_hparams` (which opens a sub-run), the summaries go into this
        run's own event file, so the HParams tab links each session to its curves.

        **Arguments:**
        - `hparams`: name → bool, number or string (see `flat_hparams`).
        - `metrics`: tag → final value (also written as scalars at `step`; `None` skipped).
        - `step`: the step of the final metric values.
        """
        metrics = {k: float(v) for k, v in metrics.items() if v is not None}
        experiment, start, end = hparams_summaries(dict(hparams), metrics)
        file_writer = self._writer.file_writer
        for summary in (experiment, start, end):
            file_writer.add_summary(summary, step)
        self.add_scalars(metrics, step)

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        self._writer.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
