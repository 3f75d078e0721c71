"""Encoders: from one input sequence to (L, H) features for the S5 stack (reference §4).

- `DenseEncoder`: Dense(d_input → H) applied at every step.
- `EmbeddingEncoder`: token ids → the authors' Dense applied to one-hot vectors, computed as a
  lookup: row `t` of the (vocab, H) kernel plus the bias, without forming one-hot tensors.
  Same parameters (vocab·H + H) and the same initial distribution (LeCun normal with
  fan-in = vocab, zero bias) as that Dense.
- `PendulumCNN`: the per-frame image encoder of the pendulum regression task (§6.3, App. F.3).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ._dense import Dense

__all__ = ["DenseEncoder", "EmbeddingEncoder", "PendulumCNN"]


class DenseEncoder(eqx.Module):
    """Dense(d_input → H) at every step.

    **Arguments:** `d_input`, `H`, `dtype`, and a keyword-only `key`.
    """

    dense: Dense

    def __init__(self, d_input: int, H: int, *, dtype=jnp.float32, key: PRNGKeyArray):
        self.dense = Dense(d_input, H, dtype=dtype, key=key)

    def __call__(self, x: Float[Array, "L d_input"]) -> Float[Array, "L H"]:
        """**Arguments:** `x` (L, d_input). **Returns:** (L, H)."""
        return self.dense(x)


class EmbeddingEncoder(eqx.Module):
    """Token embedding equal to Dense(vocab → H) on one-hot vectors: W[t] + b.

    **Arguments:** `vocab` (the one-hot width), `H`, `dtype`, and a keyword-only `key`.
    """

    weight: Float[Array, "vocab H"]
    bias: Float[Array, " H"]
    vocab: int = eqx.field(static=True)

    def __init__(self, vocab: int, H: int, *, dtype=jnp.float32, key: PRNGKeyArray):
        dense = Dense(vocab, H, dtype=dtype, key=key)
        self.weight, self.bias, self.vocab = dense.weight, dense.bias, vocab

    def __call__(self, tokens: Int[Array, " L"]) -> Float[Array, "L H"]:
        """**Arguments:** `tokens` (L,) integer ids in [0, vocab). **Returns:** (L, H)."""
        rows = jnp.take(self.weight, tokens, axis=0, mode="clip")
        return rows + jnp.broadcast_to(self.bias[None, :], rows.shape)


class PendulumCNN(eqx.Module):
    """The per-frame CNN of the pendulum task, applied to every step.

    conv 5×5/12/pad 2 → ReLU → maxpool 2 → conv 3×3/12/stride 2/pad 1 → ReLU → maxpool 2 →
    flatten (108) → Dense 30 → ReLU → [append Δt] → Dense H. Frames arrive flattened,
    576 = 24·24·1 values per step in row-major (24, 24, 1) order. With `append_dt`
    (S5-append) the per-step interval is concatenated to the 30 features before the last
    Dense, as in the authors' `CRN_CNN(append_timestep=True)`.

    **Arguments:** `H`, `append_dt`, `dtype`, and a keyword-only `key`.
    """

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    hidden: Dense
    out: Dense
    side: int = eqx.field(static=True)
    append_dt: bool = eqx.field(static=True)

    def __init__(self, H: int, *, append_dt: bool = False, dtype=jnp.float32, key: PRNGKeyArray):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv1 = _conv(1, 12, 5, 1, 2, dtype, k1)
        self.conv2 = _conv(12, 12, 3, 2, 1, dtype, k2)
        self.hidden = Dense(108, 30, dtype=dtype, key=k3)
        self.out = Dense(30 + int(append_dt), H, dtype=dtype, key=k4)
        self.side, self.append_dt = 24, append_dt

    def frame(self, pixels: Float[Array, " 576"]) -> Float[Array, " 30"]:
        """The 30 features of one frame, before the output Dense."""
        pool = eqx.nn.MaxPool2d(2, stride=2)
        x = pixels.astype(self.hidden.weight.dtype).reshape(1, self.side, self.side)
        x = pool(jax.nn.relu(self.conv1(x)))
        x = pool(jax.nn.relu(self.conv2(x)))
        # Flatten in flax's (height, width, channel) order.
        x = jnp.transpose(x, (1, 2, 0)).reshape(-1)
        return jax.nn.relu(self.hidden(x))

    def __call__(
        self, frames: Float[Array, "L 576"], dt: Float[Array, " L"] | None = None
    ) -> Float[Array, "L H"]:
        """**Arguments:** `frames` (L, 576); `dt` (L,) the per-step intervals
        [1, τ_1, …] (required with `append_dt`, ignored otherwise).

        **Returns:** (L, H).
        """
        features = jax.vmap(self.frame)(frames)
        if self.append_dt:
            if dt is None:
                raise ValueError("PendulumCNN(append_dt=True) needs dt, the per-step intervals")
            features = jnp.concatenate([features, dt.astype(features.dtype)[:, None]], axis=1)
        return self.out(features)


def _conv(c_in, c_out, k, stride, pad, dtype, key) -> eqx.nn.Conv2d:
    """A Conv2d initialised as flax's `nn.Conv` (LeCun normal kernel, zero bias)."""
    conv = eqx.nn.Conv2d(c_in, c_out, k, stride=stride, padding=pad, dtype=dtype, key=key)
    init = jax.nn.initializers.lecun_normal(in_axis=1, out_axis=0)
    weight = init(key, conv.weight.shape, dtype)
    return eqx.tree_at(lambda c: (c.weight, c.bias), conv, (weight, jnp.zeros_like(conv.bias)))
