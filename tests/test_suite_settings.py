"""The test-wide settings of conftest.py are in force in every test."""

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
