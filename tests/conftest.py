"""Test-wide settings: the CPU allocator tuning, strict dtype and rank promotion (as equinox
does), a limit on the constants a jitted function may capture, no compilation cache in the
`s5jax` processes tests start, XLA's quick compilation (with the `full_optimisation` marker
for the tests that run real work), and a key fixture.

Shapes in `s5jax.core` and `s5jax.nn` signatures are checked at run time by jaxtyping with
beartype (see `addopts` in pyproject.toml).
"""

import os

import jax
import pytest

from s5jax import configure_cpu_malloc

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

# The `s5jax` processes that tests start keep no compiled programs (s5jax/_cache.py): nothing
# is written into the user's cache folder, and no test depends on what an earlier test or run
# compiled. tests/test_compile_cache.py turns the cache on where it tests it. (One cache shared
# by the whole suite, tried on 2026-12-07: 28 min 17 s against 29 min 6 s, one run each on the
# 2-core AVX2 EPYC, not worth a cache that the killed processes of the fault tests write to.)
os.environ["S5JAX_COMPILATION_CACHE"] = "0"

# Most of the suite's time is XLA compiling small programs that then run for milliseconds, and
# most of a compilation is LLVM optimising the machine code. JAX's
# `jax_disable_most_optimizations` turns LLVM's expensive passes off (backend optimisation level
# 0); XLA's graph passes (fusion, layout, buffer assignment, the native kernels' custom calls) are
# unchanged, and so is what every test computes. The suite took 21 min 7 s with it against 31 min
# 2 s without, one run each on the 2-core AVX2 EPYC (2026-12-08, docs/design.md). The `s5jax`
# processes that tests start inherit it. Tests marked `full_optimisation` (the paper's models,
# trained as a user trains them: there running the step costs more than compiling it) compile as
# the `s5jax` command does. `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs the whole suite
# fully optimised.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
_QUICK_COMPILE = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() not in ("0", "false")
jax.config.update("jax_disable_most_optimizations", _QUICK_COMPILE)


@pytest.fixture(autouse=True)
def _full_optimisation(request, monkeypatch):
    """Under the `full_optimisation` marker, XLA optimises fully, in this process and in the
    processes the test starts; the suite's quick compilation is restored afterwards."""
    if request.node.get_closest_marker("full_optimisation") is None or not _QUICK_COMPILE:
        yield
        return
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", True)


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
