"""Progress bars: tqdm on a terminal, a plain line per ~10% in logs.

On a terminal (TTY) `Progress` is a `tqdm` bar redrawn in place, as wide as the terminal
(`dynamic_ncols`), with the values of `update(**postfix)` after the rate. Its rate is tqdm's
exponential moving average (`smoothing`), so the first step of a run, which includes the
compilation, stops weighing on the rate and ETA after a few redraws instead of for the whole
epoch. Elsewhere (CI, log files) a line formatted by `tqdm.format_meter` is printed when
another ~10% is done and `plain_interval` seconds (30) have passed since the bar began or
its last line, and once at the end with the whole count, elapsed time and rate (with an
unknown total: at most every `plain_interval` seconds). A log file gets one line per
short epoch and about one per 30 s of a long one:

    epoch 3:  45%|####5     | 450/1000 [00:12<00:14, 37.50step/s, loss=0.1230]
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["Progress"]

# tqdm's default: the weight of the newest rate sample in the moving average.
SMOOTHING = 0.3


def _format_value(value: Any) -> str:
    """A postfix value: floats with 4 significant digits, anything else with `str`."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_tty(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # closed or detached stream
        return False


class Progress:
    """A progress bar with percentage, count, elapsed time, ETA, rate and postfix values.

    **Arguments:**
    - `total`: the number of units to do (`None` if unknown: no percentage nor ETA).
    - `desc`: a label printed before the bar.
    - `stream`: where to write (default `sys.stderr`, looked up at construction).
    - `unit`: the unit of the rate, e.g. `"it"` or `"samples"`.
    - `tty`: a tqdm bar (`True`) or plain lines (`False`); default: whether the stream is a
      terminal.
    - `clock`: the monotonic clock of the plain lines (injectable for tests).
    - `min_interval`: on a terminal, the minimal time between two redraws.
    - `plain_interval`: without a terminal, the minimal time between two lines, or between
      the start and the first line (`close` prints the last line, with the count reached).

    Use as a context manager or call `close()`.
    """

    def __init__(
        self,
        total: int | None,
        desc: str = "",
        stream: TextIO | None = None,
        *,
        unit: str = "it",
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = 0.1,
        plain_interval: float = 30.0,
    ):
        self.total = total
        self.desc = desc
        self.stream = sys.stderr if stream is None else stream
        self.unit = unit
        self.tty = _is_tty(self.stream) if tty is None else tty
        self._clock = clock
        self.plain_interval = plain_interval
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self._start = clock()
        self._last_line = -math.inf
        self._last_decile = 0
        self._closed = False
        self.bar: tqdm | None = None
        if self.tty:
            self.bar = tqdm(
                total=total,
                desc=desc or None,
                file=self.stream,
                unit=unit,
                dynamic_ncols=True,
                mininterval=min_interval,
                smoothing=SMOOTHING,
            )

    def _postfix_text(self) -> str:
        return ", ".join(f"{k}={_format_value(v)}" for k, v in self.postfix.items())

    def format(self) -> str:
        """The current plain line (no `\\r` nor newline)."""
        return tqdm.format_meter(
            self.n,
            self.total,
            self._clock() - self._start,
            prefix=self.desc,
            ascii=True,
            unit=self.unit,
            postfix=self._postfix_text() or None,
        )

    def _print_line(self) -> None:
        """Print a plain line (no terminal)."""
        self.stream.write(self.format() + "\n")
        self.stream.flush()
        self._last_line = self._clock()

    def _decile(self) -> int:
        """Completed tenths of the total."""
        return min(int(10 * self.n / self.total), 10) if self.total else 0

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by `n` units and set postfix values.

        **Arguments:**
        - `n`: units done since the last call (e.g. a batch size with `unit="samples"`).
        - `**postfix`: values shown after the rate, e.g. `loss=0.31` (kept until replaced).
        """
        self.n += n
        self.postfix.update(postfix)
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(self._postfix_text(), refresh=False)
            self.bar.update(n)
        elif self.total:
            decile = self._decile()
            since = self._clock() - max(self._start, self._last_line)
            if decile > self._last_decile and since >= self.plain_interval:
                self._last_decile = decile
                self._print_line()
        elif self._clock() - self._last_line >= self.plain_interval:
            self._print_line()

    def write(self, message: str) -> None:
        """Print a message on its own line without breaking the bar.

        **Arguments:**
        - `message`: the text (no trailing newline needed).
        """
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.total is None or self._last_decile < 10:
            self._print_line()  # the end: the count, elapsed time and rate reached

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
