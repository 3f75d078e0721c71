"""A dependency-free terminal progress bar.

On a terminal (TTY) the bar is redrawn in place with `\\r`, at most every `min_interval`
seconds (and always at completion). Elsewhere (CI, log files) a plain line is printed each time
another ~10% is done (or, with an unknown total, at most every `plain_interval` seconds), so
logs stay short. A line looks like

    train:  45%|#########           | 450/1000 [00:12<00:15, 37.5 it/s, loss=0.123]
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "format_duration"]

_BAR_WIDTH = 20


def format_duration(seconds: float) -> str:
    """`mm:ss`, or `h:mm:ss` from one hour on; `?` if not finite.

    **Arguments:**
    - `seconds`: a non-negative duration.

    **Returns:** the formatted duration.
    """
    if not math.isfinite(seconds):
        return "?"
    total = round(max(seconds, 0.0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes:02d}:{secs:02d}"


def _format_value(value: Any) -> str:
    """A postfix value: floats with 4 significant digits, anything else with `str`."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _format_rate(rate: float, unit: str) -> str:
    """`12.3 it/s` with 3 significant digits; `? it/s` before any progress."""
    if rate <= 0 or not math.isfinite(rate):
        return f"? {unit}/s"
    return f"{rate:.3g} {unit}/s"


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
    - `tty`: redraw in place (`True`) or print plain lines (`False`); default: whether the
      stream is a terminal.
    - `clock`: a monotonic clock in seconds (injectable for tests).
    - `min_interval`: the minimal time between two redraws on a terminal.
    - `plain_interval`: with an unknown total and no terminal, the minimal time between lines.

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
        self.min_interval = min_interval
        self.plain_interval = plain_interval
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self._start = clock()
        self._last_draw = -math.inf
        self._last_decile = 0
        self._last_width = 0
        self._closed = False

    # ------------------------------------------------------------------ formatting
    def elapsed(self) -> float:
        """Seconds since the bar was created."""
        return self._clock() - self._start

    def format(self) -> str:
        """The current line, without `\\r` or newline."""
        elapsed = self.elapsed()
        rate = self.n / elapsed if elapsed > 0 else 0.0
        prefix = f"{self.desc}: " if self.desc else ""
        if self.total:
            frac = min(self.n / self.total, 1.0)
            filled = int(frac * _BAR_WIDTH)
            bar = "#" * filled + " " * (_BAR_WIDTH - filled)
            eta = (self.total - self.n) / rate if rate > 0 else math.inf
            head = f"{prefix}{frac * 100:3.0f}%|{bar}| {self.n}/{self.total}"
            times = f"{format_duration(elapsed)}<{format_duration(eta)}"
        else:
            head = f"{prefix}{self.n}"
            times = format_duration(elapsed)
        fields = [times, _format_rate(rate, self.unit)]
        fields += [f"{k}={_format_value(v)}" for k, v in self.postfix.items()]
        return f"{head} [{', '.join(fields)}]"

    # ------------------------------------------------------------------ output
    def _draw(self) -> None:
        """Redraw the line in place (terminal)."""
        line = self.format()
        pad = " " * max(self._last_width - len(line), 0)
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._last_width = len(line)
        self._last_draw = self._clock()

    def _print_line(self) -> None:
        """Print a plain line (no terminal)."""
        self.stream.write(self.format() + "\n")
        self.stream.flush()
        self._last_draw = self._clock()

    def _decile(self) -> int:
        """Completed tenths of the total."""
        return min(int(10 * self.n / self.total), 10) if self.total else 0

    def _refresh(self) -> None:
        """Draw or print if due."""
        now = self._clock()
        done = self.total is not None and self.n >= self.total
        if self.tty:
            if done or now - self._last_draw >= self.min_interval:
                self._draw()
        elif self.total:
            decile = self._decile()
            if decile > self._last_decile:
                self._last_decile = decile
                self._print_line()
        elif now - self._last_draw >= self.plain_interval:
            self._print_line()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by `n` units and set postfix values.

        **Arguments:**
        - `n`: units done since the last call (e.g. a batch size with `unit="samples"`).
        - `**postfix`: values shown after the rate, e.g. `loss=0.31` (kept until replaced).
        """
        self.n += n
        self.postfix.update(postfix)
        self._refresh()

    def write(self, message: str) -> None:
        """Print a message on its own line without breaking the bar.

        **Arguments:**
        - `message`: the text (no trailing newline needed).
        """
        if self.tty and self._last_width:
            self.stream.write("\r" + " " * self._last_width + "\r")
        self.stream.write(message + "\n")
        if self.tty and self._last_width and not self._closed:
            self._draw()
        else:
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.tty:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
        elif self.total is None or self._last_decile < 10:
            self._print_line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
