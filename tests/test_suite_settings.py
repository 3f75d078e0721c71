"""The test-wide settings of conftest.py are in force in every test."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def test_a_jitted_function_closing_over_a_large_array_fails():
    # 2 MiB captured as a constant: JAX's warning, an error in this suite; the same array
    # passed as an argument compiles without it.
    big = jnp.asarray(np.ones((512, 1024), np.float32))
    with pytest.warns(UserWarning, match="large amount of constants were captured"):
        jax.jit(lambda x: jnp.sum(big * x))(jnp.float32(2))
    assert float(jax.jit(lambda x, big: jnp.sum(big * x))(jnp.float32(2), big)) == 2 * big.size


def test_dtype_and_rank_promotion_are_strict():
    with pytest.raises(jax.dtypes.TypePromotionError):
        jnp.ones(3, jnp.float32) + jnp.ones(3, jnp.bfloat16)
    with pytest.raises(ValueError):
        jnp.ones((2, 3)) + jnp.ones(3)


def _quick_compile_requested() -> bool:
    # `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs everything fully optimised
    return os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "1").lower() not in ("0", "false")


def test_the_suite_compiles_quickly_here_and_in_the_processes_it_starts():
    quick = _quick_compile_requested()
    assert jax.config.read("jax_disable_most_optimizations") is quick
    code = "import jax; print(jax.config.read('jax_disable_most_optimizations'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(quick)


@pytest.mark.full_optimisation
def test_marked_tests_compile_fully_optimised_here_and_in_the_processes_they_start():
    assert jax.config.read("jax_disable_most_optimizations") is False
    code = "import jax; print(jax.config.read('jax_disable_most_optimizations'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
