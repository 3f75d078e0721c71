"""Linear-recurrence scans: parallel = sequential = a plain NumPy loop, in float64."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s5jax import core
from s5jax.core import _scan


def _loop(a, b, reverse=False, x0=None, resets=None):
    """x_k = a_k x_{k∓1} + b_k by a Python loop (the definition)."""
    L, P = b.shape
    a = np.broadcast_to(a, (L, P))
    x = np.zeros(P, complex) if x0 is None else np.asarray(x0)
    xs = np.zeros((L, P), complex)
    for k in reversed(range(L)) if reverse else range(L):
        if resets is not None and resets[k]:
            x = np.zeros(P, complex)
        x = a[k] * x + b[k]
        xs[k] = x
    return xs


def _random(rng, L, P, varying):
    shape = (L, P) if varying else (P,)
    a = rng.uniform(0.5, 1.0, shape) * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))
    b = rng.normal(size=(L, P)) + 1j * rng.normal(size=(L, P))
    return a, b


@contextlib.contextmanager
def scan_setting(name: str, value):
    """`s5jax.core._scan.<name>` (a chunk size, read when tracing) set to `value` in the block."""
    old = getattr(_scan, name)
    setattr(_scan, name, value)
    try:
        yield
    finally:
        setattr(_scan, name, old)


def run_recurrence(method, a, b, reverse, x0, resets):
    """`core.linear_recurrence` compiled as one program, from a new function on each call: JAX
    caches a trace by function, and the chunk sizes (`scan_setting`) are read when tracing."""

    def run(a, b, x0, resets):
        return core.linear_recurrence(
            a, b, reverse=reverse, initial_state=x0, resets=resets, method=method
        )

    return jax.jit(run)(a, b, x0, resets)


def check_equals_sequential_and_parallel(
    method, seed, L, P, varying, reverse, with_x0, with_resets
):
    """`method`'s states and final state equal the sequential and parallel scans' (float64,
    1e-10) on random a, b, initial state and resets (call under the chunk size to test)."""
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, varying)
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P) if with_x0 else None
    resets = rng.random(L) < 0.2 if with_resets else None
    with jax.enable_x64(True):
        args = (
            jnp.asarray(a),
            jnp.asarray(b),
            reverse,
            None if x0 is None else jnp.asarray(x0),
            None if resets is None else jnp.asarray(resets),
        )
        xs, final = run_recurrence(method, *args)
        for reference in ("sequential", "parallel"):
            xs_ref, final_ref = run_recurrence(reference, *args)
            np.testing.assert_allclose(np.asarray(xs), np.asarray(xs_ref), rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(
                np.asarray(final), np.asarray(final_ref), rtol=1e-10, atol=1e-10
            )


def check_gradients_equal_sequential(
    method, seed, L, varying, reverse, with_x0, with_resets, P=3, tol=1e-9
):
    """The gradients of a loss of `method`'s states and final state with respect to a, b and
    the initial state equal the sequential scan's (float64, to `tol`)."""
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, varying)
    w = rng.normal(size=(L, P)) + 1j * rng.normal(size=(L, P))
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P)
    resets = rng.random(L) < 0.2 if with_resets else None
    with jax.enable_x64(True):
        w = jnp.asarray(w)

        def loss(a, b, x0, method):
            xs, final = core.linear_recurrence(
                a,
                b,
                reverse=reverse,
                initial_state=x0 if with_x0 else None,
                resets=None if resets is None else jnp.asarray(resets),
                method=method,
            )
            return jnp.sum(jnp.real(w * xs)) + jnp.sum(jnp.abs(final) ** 2)

        args = (jnp.asarray(a), jnp.asarray(b), jnp.asarray(x0))
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
        grads = grad(*args, method)
        expected = grad(*args, "sequential")
        for g, e in zip(grads, expected):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=tol, atol=tol)


_jit_recurrence = jax.jit(core.linear_recurrence, static_argnames=("reverse", "method"))
"""`core.linear_recurrence` compiled as one program: the hypothesis tests below draw a new shape
per example, and op-by-op execution compiles each of the scans' many small operations anew."""


@settings(max_examples=25, deadline=None)
@given(
    L=st.integers(1, 40),
    P=st.integers(1, 5),
    varying=st.booleans(),
    reverse=st.booleans(),
    with_x0=st.booleans(),
    with_resets=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_parallel_equals_sequential_equals_loop(L, P, varying, reverse, with_x0, with_resets, seed):
    rng = np.random.default_rng(seed)
    a, b = _random(rng, L, P, varying)
    x0 = rng.normal(size=P) + 1j * rng.normal(size=P) if with_x0 else None
    resets = rng.random(L) < 0.2 if with_resets else None
    expected = _loop(a, b, reverse, x0, resets)
    with jax.enable_x64(True):
        for method in ("sequential", "parallel"):
            xs, final = _jit_recurrence(
                jnp.asarray(a),
                jnp.asarray(b),
                reverse=reverse,
                initial_state=None if x0 is None else jnp.asarray(x0),
                resets=None if resets is None else jnp.asarray(resets),
                method=method,
            )
            np.testing.assert_allclose(np.asarray(xs), expected, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(
                np.asarray(final), expected[0 if reverse else -1], rtol=1e-10, atol=1e-10
            )


def test_reset_restarts_even_with_an_initial_state(x64):
    a = jnp.asarray([0.5 + 0j])
    b = jnp.ones((3, 1), jnp.complex128)
    xs, _ = core.linear_recurrence(
        a, b, initial_state=jnp.asarray([10 + 0j]), resets=jnp.asarray([True, False, False])
    )
    np.testing.assert_allclose(np.asarray(xs[:, 0]), [1, 1.5, 1.75])


def test_final_state_continues_a_split_sequence(x64):
    # Scanning [first half] then [second half] from the first's final state = one scan.
    rng = np.random.default_rng(3)
    a, b = _random(rng, 30, 4, varying=False)
    a, b = jnp.asarray(a), jnp.asarray(b)
    whole, _ = core.linear_recurrence(a, b)
    _, mid = core.linear_recurrence(a, b[:17])
    rest, _ = core.linear_recurrence(a, b[17:], initial_state=mid)
    np.testing.assert_allclose(np.asarray(rest), np.asarray(whole[17:]), rtol=1e-12)


def test_auto_picks_the_scan_of_the_backend_it_runs_on():
    # Sequential on CPU (5-12x faster there, ARCHITECTURE.md), parallel on accelerators.
    expected = "sequential" if jax.default_backend() == "cpu" else "parallel"
    assert core.resolve_scan_method("auto") == expected
    a, b = _random(np.random.default_rng(5), 20, 3, varying=True)
    a, b = jnp.asarray(a, jnp.complex64), jnp.asarray(b, jnp.complex64)
    auto, _ = core.linear_recurrence(a, b)
    chosen, _ = core.linear_recurrence(a, b, method=expected)
    np.testing.assert_array_equal(np.asarray(auto), np.asarray(chosen))
    with pytest.raises(ValueError, match="scan method must be"):
        core.resolve_scan_method("chunky")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(a=jnp.ones(3, jnp.complex64), b=jnp.ones((5, 4), jnp.complex64)), "a must have"),
        (dict(a=jnp.ones(4, jnp.complex64), b=jnp.ones(4, jnp.complex64)), "b must have"),
        (
            dict(
                a=jnp.ones(4, jnp.complex64),
                b=jnp.ones((5, 4), jnp.complex64),
                initial_state=jnp.ones(3, jnp.complex64),
            ),
            "initial_state",
        ),
        (
            dict(
                a=jnp.ones(4, jnp.complex64),
                b=jnp.ones((5, 4), jnp.complex64),
                resets=jnp.ones(4, bool),
            ),
            "resets must have shape",
        ),
        (
            dict(
                a=jnp.ones(4, jnp.complex64),
                b=jnp.ones((5, 4), jnp.complex64),
                resets=jnp.ones(5, jnp.int32),
            ),
            "resets must be boolean",
        ),
        (dict(a=jnp.ones(4, jnp.float32), b=jnp.ones((5, 4), jnp.complex64)), "share a dtype"),
    ],
)
def test_bad_input_names_the_argument(user_facing, kwargs, match):
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda kw: core.linear_recurrence(**kw))(kwargs)
