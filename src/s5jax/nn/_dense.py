"""`Dense`: a per-step affine map initialised as flax's `nn.Dense` (the authors' layers).

The authors' code is written with flax, whose `Dense` draws its kernel from LeCun normal
(truncated normal, variance 1/fan_in) and starts its bias at zero. Equinox's `Linear` draws
both uniformly; `Dense` keeps flax's initial distribution so that runs start where the
paper's started.

Precision (`PRECISIONS`, the model's `precision` option): `"fp32"` computes in the parameters'
dtype; `"bf16"` is mixed precision. Parameters stay float32 (master weights); the product
takes bfloat16 operands and accumulates in float32; the output is bfloat16 (an activation), or
float32 for a head's final layer (`fp32_output=True`). The weight's gradient is the float32
accumulator of its bfloat16 gradient product, summed over the batch in float32 (never rounded
to bfloat16). `compute_dtype` names the activations' dtype of each policy.

The product is `s5jax.core._products.matmul` (same value and gradient as `x @ W`; its gradient
is cheaper when the model is vmapped over a batch, as in training).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ..core._products import matmul

__all__ = ["PRECISIONS", "Dense", "check_precision", "compute_dtype", "lecun_normal"]

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str, name: str = "precision") -> str:
    """Validate a precision policy name (`"fp32"` or `"bf16"`); returns it."""
    if precision not in PRECISIONS:
        raise ValueError(f"{name} must be one of {PRECISIONS}, got {precision!r}")
    return precision


def compute_dtype(precision: str, param_dtype=jnp.float32):
    """The dtype of activations under a precision policy: bfloat16 for `"bf16"`, else the
    parameters' dtype."""
    return jnp.bfloat16 if precision == "bf16" else jnp.dtype(param_dtype)


def lecun_normal(key: PRNGKeyArray, fan_in: int, fan_out: int, dtype=jnp.float32):
    """A (fan_in, fan_out) kernel from flax's default initialiser (LeCun truncated normal)."""
    return jax.nn.initializers.lecun_normal()(key, (fan_in, fan_out), dtype)


class Dense(eqx.Module):
    """y = x W + b on the last axis, applied to every leading position (e.g. every step).

    **Arguments:**
    - `in_features`, `out_features`: sizes of the last axis before and after.
    - `dtype`: real dtype of the parameters.
    - `precision`: `"fp32"` or `"bf16"` (bfloat16 operands, float32 accumulation and bias,
      bfloat16 output; see the module docstring).
    - `key`: PRNG key (keyword-only).
    """

    weight: Float[Array, "in_features out_features"]
    bias: Float[Array, " out_features"]
    in_features: int = eqx.field(static=True)
    out_features: int = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        dtype=jnp.float32,
        precision: str = "fp32",
        key: PRNGKeyArray,
    ):
        self.weight = lecun_normal(key, in_features, out_features, dtype)
        self.bias = jnp.zeros((out_features,), dtype)
        self.in_features, self.out_features = in_features, out_features
        self.precision = check_precision(precision)

    def __call__(
        self, x: Float[Array, "*batch in_features"], *, fp32_output: bool = False
    ) -> Float[Array, "*batch out_features"]:
        """**Arguments:** `x` (..., in_features); `fp32_output`: under `"bf16"`, return the
        float32 accumulator instead of a bfloat16 activation (a head's final layer).

        **Returns:** (..., out_features).
        """
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Dense expects a last axis of size {self.in_features}, got shape {x.shape}"
            )
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        if self.precision == "bf16":
            y = matmul(  # the cast inside: the weight's gradient stays float32
                x, self.weight, self.weight.dtype, operand_dtype=jnp.bfloat16
            ).reshape(*lead, self.out_features)
            y = y + jnp.broadcast_to(self.bias, y.shape)
            return y if fp32_output else y.astype(jnp.bfloat16)
        y = matmul(x.astype(self.weight.dtype), self.weight).reshape(*lead, self.out_features)
        return y + jnp.broadcast_to(self.bias, y.shape)
