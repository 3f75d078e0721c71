"""Encoders: from one input sequence to (L, H) features for the S5 stack (reference §4).

- `DenseEncoder`: Dense(d_input → H) applied at every step.
- `EmbeddingEncoder`: token ids → the authors' Dense applied to one-hot vectors, computed as a
  lookup: row `t` of the (vocab, H) kernel plus the bias, without forming one-hot tensors.
  Same parameters (vocab·H + H) and the same initial distribution (LeCun normal with
  fan-in = vocab, zero bias) as that Dense.
- `PendulumCNN`: the per-frame image encoder of the pendulum regression task (§6.3, App. F.3).

Precision: under `"bf16"` the encoders return bfloat16 features (their Dense layers take
bfloat16 operands and accumulate in float32; the embedding rows are looked up in float32 and
cast). The pendulum CNN's convolutions run in float32 in both policies; only its Dense layers
follow the policy. The CNN's gradients are reverse-mode only (`jax.grad`, `jax.vjp`): its
convolutions' products carry a custom VJP, so forward-mode `jax.jvp` does not pass through it.
"""

from __future__ import annotations

import functools
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..core._products import matmul
from ._dense import Dense, check_precision, compute_dtype

__all__ = ["DenseEncoder", "EmbeddingEncoder", "PendulumCNN"]


class DenseEncoder(eqx.Module):
    """Dense(d_input → H) at every step.

    **Arguments:** `d_input`, `H`, `dtype`, `precision`, and a keyword-only `key`.
    """

    dense: Dense

    def __init__(
        self, d_input: int, H: int, *, dtype=jnp.float32, precision="fp32", key: PRNGKeyArray
    ):
        self.dense = Dense(d_input, H, dtype=dtype, precision=precision, key=key)

    def __call__(self, x: Float[Array, "L d_input"]) -> Float[Array, "L H"]:
        """**Arguments:** `x` (L, d_input). **Returns:** (L, H)."""
        return self.dense(x)


class EmbeddingEncoder(eqx.Module):
    """Token embedding equal to Dense(vocab → H) on one-hot vectors: W[t] + b.

    **Arguments:** `vocab` (the one-hot width), `H`, `dtype`, `precision`, and a keyword-only
    `key`.
    """

    weight: Float[Array, "vocab H"]
    bias: Float[Array, " H"]
    vocab: int = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self, vocab: int, H: int, *, dtype=jnp.float32, precision="fp32", key: PRNGKeyArray
    ):
        dense = Dense(vocab, H, dtype=dtype, key=key)
        self.weight, self.bias, self.vocab = dense.weight, dense.bias, vocab
        self.precision = check_precision(precision)

    def __call__(self, tokens: Int[Array, " L"]) -> Float[Array, "L H"]:
        """**Arguments:** `tokens` (L,) integer ids in [0, vocab). **Returns:** (L, H)."""
        rows = jnp.take(self.weight, tokens, axis=0, mode="clip")
        rows = rows + jnp.broadcast_to(self.bias[None, :], rows.shape)
        return rows.astype(compute_dtype(self.precision)) if self.precision != "fp32" else rows


class PendulumCNN(eqx.Module):
    """The per-frame CNN of the pendulum task, applied to every step.

    conv 5×5/12/pad 2 → ReLU → maxpool 2 → conv 3×3/12/stride 2/pad 1 → ReLU → maxpool 2 →
    flatten (108) → Dense 30 → ReLU → [append Δt] → Dense H. Frames arrive flattened,
    576 = 24·24·1 values per step in row-major (24, 24, 1) order. With `append_dt`
    (S5-append) the per-step interval is concatenated to the 30 features before the last
    Dense, as in the authors' `CRN_CNN(append_timestep=True)`.

    **Arguments:** `H`, `append_dt`, `dtype`, `precision` (the Dense layers' policy), and a
    keyword-only `key`.
    """

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    hidden: Dense
    out: Dense
    side: int = eqx.field(static=True)
    append_dt: bool = eqx.field(static=True)

    def __init__(
        self,
        H: int,
        *,
        append_dt: bool = False,
        dtype=jnp.float32,
        precision: str = "fp32",
        key: PRNGKeyArray,
    ):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv1 = _conv(1, 12, 5, 1, 2, dtype, k1)
        self.conv2 = _conv(12, 12, 3, 2, 1, dtype, k2)
        self.hidden = Dense(108, 30, dtype=dtype, precision=precision, key=k3)
        self.out = Dense(30 + int(append_dt), H, dtype=dtype, precision=precision, key=k4)
        self.side, self.append_dt = 24, append_dt

    def features(self, frames: Float[Array, "L 576"]) -> Float[Array, "L 30"]:
        """The 30 features of every frame, before the output Dense (all frames at once)."""
        x = frames.astype(self.hidden.weight.dtype).reshape(-1, self.side, self.side, 1)
        x = _conv_pool_relu(x, self.conv1)
        x = _conv_pool_relu(x, self.conv2)
        # NHWC flattens in flax's (height, width, channel) order.
        return jax.nn.relu(self.hidden(x.reshape(x.shape[0], -1)))

    def __call__(
        self, frames: Float[Array, "L 576"], dt: Float[Array, " L"] | None = None
    ) -> Float[Array, "L H"]:
        """**Arguments:** `frames` (L, 576); `dt` (L,) the per-step intervals
        [1, τ_1, …] (required with `append_dt`, ignored otherwise).

        **Returns:** (L, H).
        """
        features = self.features(frames)
        if self.append_dt:
            if dt is None:
                raise ValueError("PendulumCNN(append_dt=True) needs dt, the per-step intervals")
            features = jnp.concatenate([features, dt.astype(features.dtype)[:, None]], axis=1)
        return self.out(features)


def _conv_pool_relu(x: Float[Array, "N Hi Wi C"], conv: eqx.nn.Conv2d) -> Float[Array, "N Ho Wo O"]:
    """relu(conv(x) + bias) followed by a 2×2 max-pool (NHWC, all frames at once).

    Computed in a form that is exactly equal to the definition but much cheaper on CPU, where
    the pendulum step is dominated by these two small convolutions and their gradients:
    - max-pooling commutes with adding a per-channel constant and with the monotone ReLU, so
      both act after pooling, on a 4× smaller tensor;
    - the pool's maximum over its four window positions ("phases") is three elementwise
      `jnp.maximum`s: XLA's CPU gradient of a max *reduction* over a window axis is several
      times slower;
    - every convolution is one 2-D matrix product (M, K) @ (K, O) over gathered input slices
      (im2col), which XLA's CPU backend runs far faster than its small strided convolutions,
      with a vmap-friendly gradient (`s5jax.core._products.matmul`);
    - one input channel (conv1): the input is first rearranged space-to-depth in blocks of
      2·stride, so that the four phases are four column groups of *one* product over a
      window of reach² cells × 4·stride² channels (`_phase_kernel`), instead of four
      convolutions with one input channel each.
    Measured with `benchmarks/pendulum.py` on a 2-core Intel Xeon, this form against the
    previous one (four strided phase convolutions, im2col with 4-D products and a max
    reduction), two alternating runs each: CNN forward + gradient on 1,600 frames 150–175 →
    98–108 ms, the pendulum's whole training step 185–228 → 136–151 ms. Tests compare values
    and gradients with the plain conv → ReLU → pool definition in float64.
    """
    (pad, _), _ = conv.padding
    stride, k = conv.stride[0], conv.weight.shape[-1]
    n, c_out = x.shape[0], conv.weight.shape[0]
    out = (x.shape[1] + 2 * pad - k) // stride + 1
    pooled = out // 2
    if conv.weight.shape[1] == 1:
        block, reach = 2 * stride, (stride + k - 1) // (2 * stride) + 1
        side = block * (pooled + reach - 1)  # rows the pooled outputs can read, in whole blocks
        below, right = max(0, side - x.shape[1] - pad), max(0, side - x.shape[2] - pad)
        x = jnp.pad(x[..., 0], ((0, 0), (pad, below), (pad, right)))[:, :side, :side]
        x = x.reshape(n, side // block, block, side // block, block).transpose(0, 1, 3, 2, 4)
        x = x.reshape(n, side // block, side // block, block * block)
        cols = [x[:, r : r + pooled, s : s + pooled, :] for r in range(reach) for s in range(reach)]
        kernel = _phase_kernel(conv.weight[:, 0], stride, reach)
        y = jnp.concatenate(cols, axis=-1).reshape(-1, kernel.shape[0])
        y = matmul(y, kernel).reshape(-1, 4, c_out)
        y = _max4(y[:, 0], y[:, 1], y[:, 2], y[:, 3])
    else:
        kernel = jnp.transpose(conv.weight, (2, 3, 1, 0))  # OIHW → HWIO
        x = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        span = stride * (out - 1) + 1
        cols = [x[:, i : i + span : stride, j : j + span : stride, :]
                for i in range(k) for j in range(k)]  # fmt: skip
        y = jnp.concatenate(cols, axis=-1)
        y = matmul(y.reshape(-1, y.shape[-1]), kernel.reshape(-1, c_out))
        y = y.reshape(n, out, out, c_out)
        y = y[:, : 2 * pooled, : 2 * pooled].reshape(n, pooled, 2, pooled, 2, c_out)
        y = _max4(y[:, :, 0, :, 0], y[:, :, 0, :, 1], y[:, :, 1, :, 0], y[:, :, 1, :, 1])
    y = y.reshape(n, pooled, pooled, c_out)
    return jax.nn.relu(y + conv.bias.reshape(1, 1, 1, -1))


def _max4(a: Array, b: Array, c: Array, d: Array) -> Array:
    return jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))


@functools.cache
def _phase_selector(k: int, stride: int, reach: int) -> np.ndarray:
    """0/1 array (reach, reach, block, block, 2, 2, k, k), block = 2·stride: entry
    [r, s, e, f, di, dj, a, b] is 1 where kernel tap (a, b) of pool phase (di, dj) reads
    channel (e, f) of space-to-depth cell (p + r, q + s) for pooled output (p, q), i.e.
    block·r + e = stride·di + a and block·s + f = stride·dj + b."""
    block = 2 * stride
    sel = np.zeros((reach, reach, block, block, 2, 2, k, k), np.float32)
    for r, e, di in itertools.product(range(reach), range(block), range(2)):
        a = block * r + e - stride * di
        if not 0 <= a < k:
            continue
        for s, f, dj in itertools.product(range(reach), range(block), range(2)):
            b = block * s + f - stride * dj
            if 0 <= b < k:
                sel[r, s, e, f, di, dj, a, b] = 1.0
    return sel


def _phase_kernel(weight: Float[Array, "O k k"], stride: int, reach: int) -> Array:
    """The one-channel k×k kernel as a (reach²·block², 4·O) matrix over space-to-depth
    windows: columns grouped by pool phase (di, dj), then output channel."""
    k = weight.shape[-1]
    sel = jnp.asarray(_phase_selector(k, stride, reach), weight.dtype)
    kernel = jnp.einsum("rsefdgab,oab->rsefdgo", sel, weight)
    return kernel.reshape(reach * reach * 4 * stride * stride, 4 * weight.shape[0])


def _conv(c_in, c_out, k, stride, pad, dtype, key) -> eqx.nn.Conv2d:
    """A Conv2d initialised as flax's `nn.Conv` (LeCun normal kernel, zero bias)."""
    conv = eqx.nn.Conv2d(c_in, c_out, k, stride=stride, padding=pad, dtype=dtype, key=key)
    init = jax.nn.initializers.lecun_normal(in_axis=1, out_axis=0)
    weight = init(key, conv.weight.shape, dtype)
    return eqx.tree_at(lambda c: (c.weight, c.bias), conv, (weight, jnp.zeros_like(conv.bias)))
