"""Normalisation layers of the S5 sequence layer (reference semantics §4).

`BatchNorm` computes its statistics over batch × time for each feature, as the authors' flax
model does: a module sees one (L, H) sequence, reduces over time itself and over the batch with
`jax.lax.pmean(..., axis_name)`, so the model must be called under
`jax.vmap(..., axis_name="batch")`. Its running statistics live in an `equinox.nn.State`.
`LayerNorm` normalises each step over its H features. Both share one calling convention,
`norm(x, state, *, inference) -> (y, state)`, so a layer can hold either.

Both compute their statistics and the normalisation in the parameters' dtype (float32) whatever
the input's dtype; under the `"bf16"` precision policy they return bfloat16 activations.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ..core import _native, _products
from ._dense import check_precision, compute_dtype

__all__ = ["BatchNorm", "LayerNorm"]


def _row(v: Float[Array, " H"], like: Float[Array, "L H"]) -> Float[Array, "L H"]:
    return jnp.broadcast_to(v[None, :], like.shape)


# BatchNorm's training-mode normalisation with fewer passes over the (L, H) activations in the
# backward pass. As JAX derives it, the gradient of (x − m)·s + b with m and the variance
# computed from x takes four reductions over batch × time and three elementwise passes (in
# sMNIST's float32 step 10.7 ms a layer, 2-core Intel Xeon, 2026-11-29); the closed form needs
# Σ g and Σ g·(x − m) and one pass for dx. The collectives (`pmean`) stay outside the custom
# VJPs, whose backward passes JAX runs outside the `vmap` that names the batch axis; JAX's
# own rules carry the cotangents of m, s and the variance through them. Same values and
# gradients (tests/test_models.py checks them against the plain formula in float64). On one CPU
# device with the native library, Σ g·(x − m) is `s5jax.core._native.native_column_dot` on x and
# m: XLA's product over time needs x − m in memory, which XLA wrote in the forward pass and
# kept for the backward one (an (L, H) float32 array a layer; `s5jax.core._products`
# `NATIVE_COLUMN_DOT` has the memory it saves).
def _plain_shift_scale(x, m, s, b):
    """(x − m) · s + b over one sequence x (L, H), per feature."""
    return (x - _row(m, x)) * _row(s, x) + _row(b, x)


@jax.custom_vjp
def _shift_scale(x, m, s, b):
    """`_plain_shift_scale` with the closed-form backward pass."""
    return _plain_shift_scale(x, m, s, b)


def _shift_scale_fwd(x, m, s, b):
    return _shift_scale(x, m, s, b), (x, m, s)


def _shift_scale_bwd(residuals, g):
    x, m, s = residuals
    sum_g = jnp.sum(g, axis=0)
    if _products._native_column_dot(x, g) and m.dtype == jnp.float32:
        # Σ_t g·(x − m) read from x itself: XLA's product needs x − m in memory, and XLA then
        # wrote it in the forward pass (where the variance reads it too) and kept it until here.
        sum_gx = _native.native_column_dot(x, g, m)
    else:
        # As a contraction over time with the features as a batch dimension: under the model's
        # vmap with a batch of one, XLA's CPU backend ran the product-and-sum form over the
        # middle axis of (1, L, H) 10-14× slower (f32 (1, 4,096, 128): 4.1 ms against 0.36 ms;
        # (50, 784, 96): 3.07 against 3.12 ms; 2-core Intel Xeon, 2026-11-29, a `/tmp` script).
        sum_gx = jax.lax.dot_general(g, x - _row(m, x), (((0,), (0,)), ((1,), (1,))))
    return g * _row(s, x), -s * sum_g, sum_gx, sum_g


_shift_scale.defvjp(_shift_scale_fwd, _shift_scale_bwd)


def _plain_square_mean(x, m):
    return jnp.mean(jnp.square(x - _row(m, x)), axis=0)


@jax.custom_vjp
def _centred_square_mean(x, m):
    """mean over time of (x − m)² for one sequence x (L, H), where m is the mean of x over the
    whole batch: the cotangent of m, −2 g Σ_t (x_t − m) / L per example, sums to zero over the
    batch, so the backward pass returns zero for it (a pass over x saved)."""
    return _plain_square_mean(x, m)


def _centred_square_mean_fwd(x, m):
    return _centred_square_mean(x, m), (x, m)


def _centred_square_mean_bwd(residuals, g):
    x, m = residuals
    return (x - _row(m, x)) * _row(2 * g / x.shape[0], x), jnp.zeros_like(m)


_centred_square_mean.defvjp(_centred_square_mean_fwd, _centred_square_mean_bwd)


def _output(y, precision):
    return y.astype(compute_dtype(precision)) if precision != "fp32" else y


class BatchNorm(eqx.Module):
    """Batch normalisation over batch × time per feature, with flax's running statistics.

    Training (`inference=False`): normalise with the batch mean and the biased batch variance
    over all B·L positions (padding included, as the authors' model does), or over the valid
    steps only when the call gives them (`valid`: `model.mask_padding`), and update the
    running statistics as
    `running = momentum · running + (1 − momentum) · batch_statistic`. Inference: normalise
    with the running statistics; the state is returned unchanged. y = scale · x̂ + bias.

    **Arguments:**
    - `H`: number of features.
    - `momentum`: weight of the old running statistic (flax convention; 0.9 or 0.95 in the paper).
    - `eps`: added to the variance (1e-5 as flax).
    - `axis_name`: the `jax.vmap` axis name of the batch.
    - `dtype`: real dtype of the parameters and statistics.
    - `precision`: `"fp32"`, or `"bf16"` (float32 statistics, bfloat16 output).
    """

    weight: Float[Array, " H"]
    bias: Float[Array, " H"]
    state_index: eqx.nn.StateIndex
    H: int = eqx.field(static=True)
    momentum: float = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    axis_name: str = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        H: int,
        *,
        momentum: float = 0.9,
        eps: float = 1e-5,
        axis_name: str = "batch",
        dtype=jnp.float32,
        precision: str = "fp32",
    ):
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.weight = jnp.ones((H,), dtype)
        self.bias = jnp.zeros((H,), dtype)
        self.state_index = eqx.nn.StateIndex((jnp.zeros((H,), dtype), jnp.ones((H,), dtype)))
        self.H, self.momentum, self.eps, self.axis_name = H, momentum, eps, axis_name
        self.precision = check_precision(precision)

    def __call__(
        self,
        x: Float[Array, "L H"],
        state: eqx.nn.State,
        *,
        inference: bool = False,
        valid: Bool[Array, " L"] | None = None,
    ) -> tuple[Float[Array, "L H"], eqx.nn.State]:
        """Normalise one sequence of a batch (call under `jax.vmap(..., axis_name=...)`).

        **Arguments:**
        - `x`: one sequence (L, H).
        - `state`: the model state holding the running (mean, var).
        - `inference`: use the running statistics instead of the batch's.
        - `valid`: the steps the training statistics count (the rest, padding, are normalised
          with them but not counted); None counts all L steps. Unused at inference.

        **Returns:** `(y, state)`, y (L, H); in training, the state has the updated statistics.
        """
        if x.ndim != 2 or x.shape[1] != self.H:
            raise ValueError(f"BatchNorm expects (L, {self.H}), got {x.shape}")
        x = x.astype(self.weight.dtype)
        running_mean, running_var = state.get(self.state_index)
        closed_form = not inference and _products.VMAP_FRIENDLY_GRADIENT  # custom VJPs: no jvp
        if inference:
            mean, var = running_mean, running_var
        else:
            statistics = self._all_statistics if valid is None else self._valid_statistics
            mean, var = statistics(x, valid, closed_form)
            m = jnp.asarray(self.momentum, x.dtype)
            new = (m * running_mean + (1 - m) * mean, m * running_var + (1 - m) * var)
            state = state.set(self.state_index, new)
        inv = jax.lax.rsqrt(var + jnp.asarray(self.eps, x.dtype)) * self.weight
        y = (_shift_scale if closed_form else _plain_shift_scale)(x, mean, inv, self.bias)
        return _output(y, self.precision), state

    def _reduce(self, reduce, value):
        """`reduce(value, axis_name)` over the batch, with an error that says how to call."""
        try:
            return reduce(value, self.axis_name)
        except NameError as error:
            raise ValueError(
                f"BatchNorm in training mode reduces over the batch: call the model under "
                f"jax.vmap(..., axis_name={self.axis_name!r}) (or pass inference=True)"
            ) from error

    def _all_statistics(self, x, valid, closed_form):
        """The batch mean and biased variance over all B·L steps."""
        del valid
        # Every example has the same L, so the mean of per-example means is the mean over
        # batch × time.
        mean = self._reduce(jax.lax.pmean, jnp.mean(x, axis=0))
        square_mean = _centred_square_mean if closed_form else _plain_square_mean
        return mean, jax.lax.pmean(square_mean(x, mean), self.axis_name)

    def _valid_statistics(self, x, valid, closed_form):
        """The batch mean and biased variance over the valid steps of every sequence (the
        plain formulas: JAX derives their gradients)."""
        del closed_form
        w = valid.astype(x.dtype)[:, None]
        # a batch of empty sequences: statistics of nothing, 0
        count = jnp.maximum(self._reduce(jax.lax.psum, jnp.sum(w)), 1)
        mean = jax.lax.psum(jnp.sum(w * x, axis=0), self.axis_name) / count
        centred = w * (x - _row(mean, x))
        var = jax.lax.psum(jnp.sum(centred * centred, axis=0), self.axis_name) / count
        return mean, var


class LayerNorm(eqx.Module):
    """Layer normalisation over the H features of each step, with scale and bias (flax's).

    **Arguments:**
    - `H`: number of features.
    - `eps`: added to the variance (1e-6 as flax).
    - `dtype`: real dtype of the parameters.
    - `precision`: `"fp32"`, or `"bf16"` (float32 statistics, bfloat16 output).
    """

    weight: Float[Array, " H"]
    bias: Float[Array, " H"]
    H: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(self, H: int, *, eps: float = 1e-6, dtype=jnp.float32, precision: str = "fp32"):
        self.weight = jnp.ones((H,), dtype)
        self.bias = jnp.zeros((H,), dtype)
        self.H, self.eps = H, eps
        self.precision = check_precision(precision)

    def __call__(
        self,
        x: Float[Array, "L H"],
        state: eqx.nn.State,
        *,
        inference: bool = False,
        valid: Bool[Array, " L"] | None = None,
    ) -> tuple[Float[Array, "L H"], eqx.nn.State]:
        """**Arguments:** `x` (L, H); `state`, `inference` and `valid` are passed through
        unused (each step is normalised on its own, so padding changes no other step).

        **Returns:** `(y, state)` with y (L, H).
        """
        del inference, valid
        x = x.astype(self.weight.dtype)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + jnp.asarray(self.eps, x.dtype))
        return _output(y * _row(self.weight, x) + _row(self.bias, x), self.precision), state
