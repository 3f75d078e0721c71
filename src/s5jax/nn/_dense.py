"""`Dense`: a per-step affine map initialised as flax's `nn.Dense` (the authors' layers).

The authors' code is written with flax, whose `Dense` draws its kernel from LeCun normal
(truncated normal, variance 1/fan_in) and starts its bias at zero. Equinox's `Linear` draws
both uniformly; `Dense` keeps flax's initial distribution so that runs start where the
paper's started.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

__all__ = ["Dense", "lecun_normal"]


def lecun_normal(key: PRNGKeyArray, fan_in: int, fan_out: int, dtype=jnp.float32):
    """A (fan_in, fan_out) kernel from flax's default initialiser (LeCun truncated normal)."""
    return jax.nn.initializers.lecun_normal()(key, (fan_in, fan_out), dtype)


class Dense(eqx.Module):
    """y = x W + b on the last axis, applied to every leading position (e.g. every step).

    **Arguments:**
    - `in_features`, `out_features`: sizes of the last axis before and after.
    - `dtype`: real dtype of the parameters.
    - `key`: PRNG key (keyword-only).
    """

    weight: Float[Array, "in_features out_features"]
    bias: Float[Array, " out_features"]
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)

    def __init__(
        self, in_features: int, out_features: int, *, dtype=jnp.float32, key: PRNGKeyArray
    ):
        self.weight = lecun_normal(key, in_features, out_features, dtype)
        self.bias = jnp.zeros((out_features,), dtype)
        self.in_features, self.out_features = in_features, out_features

    def __call__(
        self, x: Float[Array, "*batch in_features"]
    ) -> Float[Array, "*batch out_features"]:
        """**Arguments:** `x` (..., in_features). **Returns:** (..., out_features)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Dense expects a last axis of size {self.in_features}, got shape {x.shape}"
            )
        y = x.astype(self.weight.dtype) @ self.weight
        return y + jnp.broadcast_to(self.bias, y.shape)
