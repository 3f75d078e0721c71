"""Hold Ctrl-C and SIGTERM back while a short write must not be cut in the middle.

A checkpoint save is a few hundred milliseconds of orbax calls, some on background threads.
An exception raised by a signal handler inside them is safe for the data (a step without its
manifest is skipped on restore) but leaves orbax's threads running into interpreter shutdown,
which prints their tracebacks after the command's one-line error. `deferred_signals()` records
SIGINT and SIGTERM during the block and delivers them, once each, to the handlers in place
before it, as soon as the block ends: the command still stops, at the next safe point.

Standard library only, so that every layer may import it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block take effect when it ends (in the order
    they came). Outside the main thread, where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum, frame):
        if signum not in received:
            received.append(signum)

    previous = {s: signal.signal(s, record) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in received:  # to the handler in place before the block (or the default action)
            signal.raise_signal(s)
