"""Test-wide settings: the CPU allocator tuning, strict dtype and rank promotion (as equinox
does), and a key fixture.

Shapes in `s5jax.core` and `s5jax.nn` signatures are checked at run time by jaxtyping with
beartype (see `addopts` in pyproject.toml).
"""

import jax
import pytest

from s5jax import configure_cpu_malloc

# As the `s5jax` command does, before JAX starts its backend: XLA's CPU step buffers are
# reused instead of mapped afresh at every call (s5jax/_malloc.py).
configure_cpu_malloc()

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def getkey():
    """A function returning a fresh PRNG key on each call, deterministic per test."""
    keys = iter(jax.random.split(jax.random.PRNGKey(1234), 1000))
    return lambda: next(keys)


@pytest.fixture
def x64():
    """Run the test body with 64-bit floats enabled."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def user_facing():
    """Switch off the test-time jaxtyping checks, to see the errors a user gets."""
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)
