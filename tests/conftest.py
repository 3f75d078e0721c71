"""Test-wide settings: the CPU allocator tuning, strict dtype and rank promotion (as equinox
does), a limit on the constants a jitted function may capture, one compilation cache for the
whole run, and a key fixture.

Shapes in `s5jax.core` and `s5jax.nn` signatures are checked at run time by jaxtyping with
beartype (see `addopts` in pyproject.toml).
"""

import os
import shutil
import tempfile

import jax
import pytest

from s5jax import _cache, configure_cpu_malloc

# As the `s5jax` command does, before JAX starts its backend: XLA's CPU step buffers are
# reused instead of mapped afresh at every call (s5jax/_malloc.py).
configure_cpu_malloc()

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# A jitted function that closes over a large array compiles it into its program as a constant,
# and XLA then compiles for seconds what takes a tenth of one with the array as an argument
# (tests/test_scan_native.py's planar gradients, a 50 MiB cotangent: 2.7 s native and 5.6 s
# reference against 0.14 and 0.47 s). JAX warns above this many captured bytes, and the suite's
# warnings are errors (`filterwarnings` in pyproject.toml): pass large arrays as arguments.
jax.config.update("jax_captured_constants_warn_bytes", 1 << 20)
jax.config.update("jax_captured_constants_report_frames", 3)

# One JAX compilation cache for the whole run, as the `s5jax` command keeps one per host
# (s5jax/_cache.py): the suite compiles the same small models in many tests and processes, and
# loading them instead cut test_cli, test_predict and test_engine from 3 min 4 s to 2 min 2 s
# on the 2-core AVX2 EPYC host, starting empty. The folder is new for each run (no program
# compiled by another version of the code is ever loaded) and shared by the xdist workers and
# the `s5jax` processes the tests start, through the environment; capped, so JAX's file lock
# keeps a process from reading an entry that another is writing.
_CACHE_OWNER = "S5JAX_TEST_COMPILATION_CACHE_OWNER"


def pytest_configure(config):
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the controller, or a run without xdist
        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="s5jax-test-xla-")
        os.environ[_CACHE_OWNER] = str(os.getpid())
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(_cache.MAX_BYTES))
    seconds = str(_cache.MIN_COMPILE_SECONDS)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", seconds)
    # this process imported JAX above, before the environment named the folder
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_compilation_cache_max_size", _cache.MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _cache.MIN_COMPILE_SECONDS)


def pytest_unconfigure(config):
    if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


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
