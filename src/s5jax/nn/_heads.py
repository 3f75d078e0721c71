"""Pooling, output heads, losses and metrics (reference semantics §4 and datasets.md §1.8).

Heads act on one example; the loss and metric functions act on a batch of head outputs.

Precision: under `"bf16"` a head's hidden layers compute bfloat16 activations, and its final
layer returns its float32 accumulator, so predictions, log-probabilities and losses are
float32 (see `Dense`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ._dense import Dense, check_precision

__all__ = [
    "POOLINGS",
    "ClassificationHead",
    "GaussianHead",
    "RegressionHead",
    "RetrievalHead",
    "Targets",
    "accuracy",
    "gaussian_nll",
    "gaussian_variance",
    "mse",
    "nll_loss",
    "pool",
]

POOLINGS = ("mean", "masked_mean", "last", "none")
VARIANCE_FLOOR = 1e-6


def pool(
    x: Float[Array, "L H"], method: str, length: Int[Array, ""] | int | None = None
) -> Float[Array, "..."]:
    """Pool one sequence over time.

    **Arguments:**
    - `x`: (L, H).
    - `method`: `"mean"` (all L steps), `"masked_mean"` (the first `length` steps: padding is
      ignored), `"last"` (step L − 1; an error when `length` is given, since padding would be
      pooled), or `"none"` (every step kept).
    - `length`: number of valid steps (masked_mean only).

    **Returns:** (H,), or (L, H) for `"none"`.
    """
    if method == "mean":
        return jnp.mean(x, axis=0)
    if method == "masked_mean":
        if length is None:
            raise ValueError("masked_mean pooling needs the sequence length")
        mask = jnp.arange(x.shape[0]) < length
        total = jnp.sum(jnp.where(mask[:, None], x, jnp.zeros_like(x)), axis=0)
        count = jnp.maximum(jnp.asarray(length, x.dtype), jnp.asarray(1, x.dtype))
        return total / count
    if method == "last":
        if length is not None:
            raise ValueError("'last' pooling cannot be used with padded sequences (lengths given)")
        return x[-1]
    if method == "none":
        return x
    raise ValueError(f"pooling must be one of {POOLINGS}, got {method!r}")


class ClassificationHead(eqx.Module):
    """Dense(H → classes) followed by log-softmax.

    **Arguments:** `H`, `n_classes`, `dtype`, `precision`, and a keyword-only `key`.
    """

    decoder: Dense

    def __init__(
        self, H: int, n_classes: int, *, dtype=jnp.float32, precision="fp32", key: PRNGKeyArray
    ):
        self.decoder = Dense(H, n_classes, dtype=dtype, precision=precision, key=key)

    def __call__(self, z: Float[Array, "*L H"]) -> Float[Array, "*L C"]:
        """**Arguments:** `z` (H,) pooled (or (L, H)). **Returns:** log-probabilities."""
        return jax.nn.log_softmax(self.decoder(z, fp32_output=True), axis=-1)


Targets = tuple[tuple[float, ...], tuple[float, ...]]
"""The targets' per-output (mean, std): a head's fixed output affine (`RegressionHead`)."""


def _check_targets(targets: Targets | None, n_outputs: int) -> tuple[tuple, tuple]:
    """`targets` as two tuples of floats of length `n_outputs` (empty: no affine)."""
    if targets is None:
        return (), ()
    mean, std = (tuple(float(v) for v in t) for t in targets)
    if len(mean) != n_outputs or len(std) != n_outputs:
        raise ValueError(
            f"targets: a mean and a std per output ({n_outputs}), got {len(mean)} and {len(std)}"
        )
    if not all(math.isfinite(m) for m in mean) or not all(math.isfinite(s) and s > 0 for s in std):
        raise ValueError(f"targets: finite means and positive stds, got {mean}, {std}")
    return mean, std


def _per_output(values: tuple[float, ...], like: Array) -> Array:
    """`values` (one per output) shaped to broadcast against `like` (…, outputs)."""
    return jnp.asarray(values, like.dtype).reshape((1,) * (like.ndim - 1) + (-1,))


class RegressionHead(eqx.Module):
    """Dense(H → outputs): a point prediction, trained with the MSE.

    With `targets = (mean, std)` (one each per output, `data.normalize_targets`) the
    decoder predicts standardised targets and the head returns `mean + std · decoder(z)`:
    a fixed affine (static, never trained), so that targets far from unit scale (300 ± 10)
    start at their scale and the outputs are in the targets' units.

    **Arguments:** `H`, `n_outputs`, `dtype`, `precision`, `targets`, and a keyword-only `key`.
    """

    decoder: Dense
    offset: tuple[float, ...] = eqx.field(static=True, default=())
    scale: tuple[float, ...] = eqx.field(static=True, default=())

    def __init__(
        self,
        H: int,
        n_outputs: int,
        *,
        dtype=jnp.float32,
        precision="fp32",
        targets: Targets | None = None,
        key: PRNGKeyArray,
    ):
        self.decoder = Dense(H, n_outputs, dtype=dtype, precision=precision, key=key)
        self.offset, self.scale = _check_targets(targets, n_outputs)

    def __call__(self, z: Float[Array, "*L H"]) -> Float[Array, "*L D"]:
        """**Arguments:** `z` (H,) or (L, H). **Returns:** predictions (…, n_outputs)."""
        out = self.decoder(z, fp32_output=True)
        if not self.scale:
            return out
        return _per_output(self.offset, out) + _per_output(self.scale, out) * out


def gaussian_variance(ell: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    """σ² = exp(ℓ) if ℓ < 0 else ℓ + 1 (CRU's "elu + 1": positive, smooth at 0)."""
    return jnp.where(ell < 0, jnp.exp(jnp.minimum(ell, jnp.zeros_like(ell))), ell + 1)


_HIDDEN = {"tanh": jnp.tanh, "relu": jax.nn.relu}


class GaussianHead(eqx.Module):
    """Per-step Gaussian prediction: two MLPs (H → 30 → tanh → D) for μ and ℓ; σ² from ℓ.
    `targets = (mean, std)`: μ and σ² of standardised targets, returned in the targets'
    units (mean + std · μ, std² · σ²), as `RegressionHead` does.

    **Arguments:** `H`, `n_outputs` (D), `hidden` (30), `activation` (`"tanh"`, as the
    authors' pendulum branch, whose `SimpleMLP` uses `nn.tanh`; or `"relu"`, what s5jax used
    before 0.x and what a run's `config.json` without `model.head_activation` gets), `dtype`,
    `precision`, and a keyword-only `key`.
    """

    mean_hidden: Dense
    mean_out: Dense
    var_hidden: Dense
    var_out: Dense
    activation: str = eqx.field(static=True, default="tanh")
    offset: tuple[float, ...] = eqx.field(static=True, default=())
    scale: tuple[float, ...] = eqx.field(static=True, default=())

    def __init__(
        self,
        H: int,
        n_outputs: int,
        *,
        hidden: int = 30,
        activation: str = "tanh",
        dtype=jnp.float32,
        precision="fp32",
        targets: Targets | None = None,
        key: PRNGKeyArray,
    ):
        if activation not in _HIDDEN:
            raise ValueError(f"activation must be one of {sorted(_HIDDEN)}, got {activation!r}")
        self.activation = activation
        k1, k2, k3, k4 = jax.random.split(key, 4)
        dense = dict(dtype=dtype, precision=check_precision(precision))
        self.mean_hidden = Dense(H, hidden, **dense, key=k1)
        self.mean_out = Dense(hidden, n_outputs, **dense, key=k2)
        self.var_hidden = Dense(H, hidden, **dense, key=k3)
        self.var_out = Dense(hidden, n_outputs, **dense, key=k4)
        self.offset, self.scale = _check_targets(targets, n_outputs)

    def __call__(self, z: Float[Array, "L H"]) -> tuple[Float[Array, "L D"], Float[Array, "L D"]]:
        """**Arguments:** `z` (L, H). **Returns:** `(mean, variance)`, each (L, D)."""
        act = _HIDDEN[self.activation]
        mean = self.mean_out(act(self.mean_hidden(z)), fp32_output=True)
        ell = self.var_out(act(self.var_hidden(z)), fp32_output=True)
        variance = gaussian_variance(ell)
        if not self.scale:
            return mean, variance
        scale = _per_output(self.scale, mean)  # in the targets' units (RegressionHead)
        return _per_output(self.offset, mean) + scale * mean, scale**2 * variance


class RetrievalHead(eqx.Module):
    """Dual-encoder matching: [o0, o1, o0 − o1, o0 ⊙ o1] → Dense(H) → GELU → Dense(2).

    **Arguments:** `H`, `n_classes` (2), `gelu_approximate`, `dtype`, `precision`, and a
    keyword-only `key`.
    """

    hidden: Dense
    decoder: Dense
    gelu_approximate: bool = eqx.field(static=True)

    def __init__(
        self,
        H: int,
        n_classes: int = 2,
        *,
        gelu_approximate: bool = True,
        dtype=jnp.float32,
        precision: str = "fp32",
        key: PRNGKeyArray,
    ):
        k1, k2 = jax.random.split(key)
        self.hidden = Dense(4 * H, H, dtype=dtype, precision=precision, key=k1)
        self.decoder = Dense(H, n_classes, dtype=dtype, precision=precision, key=k2)
        self.gelu_approximate = gelu_approximate

    @staticmethod
    def features(o0: Float[Array, " H"], o1: Float[Array, " H"]) -> Float[Array, " H4"]:
        """[o0, o1, o0 − o1, o0 ⊙ o1], (4H,)."""
        return jnp.concatenate([o0, o1, o0 - o1, o0 * o1])

    def __call__(self, o0: Float[Array, " H"], o1: Float[Array, " H"]) -> Float[Array, " C"]:
        """**Arguments:** the pooled documents o0, o1 (H,). **Returns:** log-probabilities."""
        h = jax.nn.gelu(self.hidden(self.features(o0, o1)), approximate=self.gelu_approximate)
        return jax.nn.log_softmax(self.decoder(h, fp32_output=True), axis=-1)


# --- losses and metrics on a batch -----------------------------------------------------------


def nll_loss(log_probs: Float[Array, "B C"], labels: Int[Array, " B"]) -> Float[Array, ""]:
    """Mean negative log-likelihood of integer labels under log-probabilities."""
    picked = jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=1)
    return -jnp.mean(picked)


def accuracy(log_probs: Float[Array, "B C"], labels: Int[Array, " B"]) -> Float[Array, ""]:
    """Fraction of examples whose arg-max class is the label."""
    hits = jnp.argmax(log_probs, axis=-1) == labels.astype(jnp.int32)
    return jnp.mean(hits.astype(log_probs.dtype))


def mse(prediction: Float[Array, "*shape"], target: Float[Array, "*shape"]) -> Float[Array, ""]:
    """Mean squared error over every entry (the loss of regression, the pendulum metric)."""
    return jnp.mean(jnp.square(prediction - target.astype(prediction.dtype)))


def gaussian_nll(
    mean: Float[Array, "B L D"], variance: Float[Array, "B L D"], target: Float[Array, "B L D"]
) -> Float[Array, ""]:
    """Gaussian negative log-likelihood, σ² floored at 1e-6, summed over D, averaged over
    time then batch: mean_b mean_t 0.5·Σ_d [log σ² + (μ − y)²/σ² + log 2π].
    """
    var = jnp.maximum(variance, jnp.asarray(VARIANCE_FLOOR, variance.dtype))
    err = jnp.square(mean - target.astype(mean.dtype))
    log2pi = jnp.asarray(math.log(2 * math.pi), var.dtype)
    per_step = 0.5 * jnp.sum(jnp.log(var) + err / var + log2pi, axis=-1)
    return jnp.mean(jnp.mean(per_step, axis=-1))
