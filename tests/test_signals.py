"""s5jax._signals.deferred_signals: Ctrl-C and SIGTERM inside the block take effect when it
ends, through the handlers in place before it; outside the main thread it does nothing."""

import signal
import threading

import pytest

from s5jax._signals import deferred_signals


@pytest.fixture
def sigterm_calls():
    """A SIGTERM handler that records its calls; the previous one is put back after."""
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_inside_reaches_the_previous_handler_once_after_the_block(sigterm_calls):
    sigint = signal.getsignal(signal.SIGINT)
    with deferred_signals():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert sigterm_calls == []  # held back while the block runs
    assert sigterm_calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is sigint  # handlers restored
    signal.raise_signal(signal.SIGTERM)  # and the previous one active again
    assert sigterm_calls == [signal.SIGTERM, signal.SIGTERM]


def test_ctrl_c_inside_raises_keyboard_interrupt_after_the_whole_block():
    # Python's own SIGINT handler, whatever the process inherited: a suite started in the
    # background by a non-interactive shell (`make test &`) starts with SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler to defer.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with deferred_signals():
                signal.raise_signal(signal.SIGINT)
                done.append("the rest of the block")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done == ["the rest of the block"]


def test_no_signal_no_effect(sigterm_calls):
    with deferred_signals():
        pass
    assert sigterm_calls == []


def test_outside_the_main_thread_it_does_nothing(sigterm_calls):
    errors = []

    def body():
        try:
            with deferred_signals():
                errors.append(signal.getsignal(signal.SIGTERM))
        except Exception as e:  # signal.signal() would raise ValueError here
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert len(errors) == 1 and not isinstance(errors[0], Exception)
    assert errors[0] is not None and errors[0] != signal.SIG_DFL  # the test's handler, untouched
