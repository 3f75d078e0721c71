"""The jitted train and eval steps: per-example losses and metrics, masked for padded batches.

The model is split once into its parameters (the inexact arrays) and the static rest; the steps
are plain `jax.jit` functions of (params, model state, optimiser state, batch, key) with the
static part closed over, so they compile once per batch shape. Every batch has the same shape
(the last one is padded, with `mask` False on the padding rows), so nothing recompiles.

A model handles one example; the batch comes from `jax.vmap(..., axis_name="batch")`, so
BatchNorm statistics span batch × time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..core import _native
from ..nn import combine_members

__all__ = ["Steps", "make_steps", "per_example_loss"]

# Floor of the Gaussian head's variance in the NLL (reference semantics §4, pendulum).
VARIANCE_FLOOR = 1e-6


def _step_mean(values, length):
    """The mean of per-step `values` (L,) over the valid steps `0 .. length − 1` (all steps
    when `length` is None): a padded sequence's padding is not a target."""
    if length is None:
        return jnp.mean(values)
    valid = (jnp.arange(values.shape[0]) < length).astype(values.dtype)
    return jnp.sum(values * valid) / jnp.maximum(jnp.sum(valid), 1)


def per_example_loss(kind: str, output, y, length=None, target_scale=None):
    """Loss and metric of one example for the model's head `kind`.

    Per-step outputs (a time axis first) are averaged over the example's valid steps when
    its `length` is given (a padded sequence: the padding steps' targets are not read), else
    over all steps.

    `target_scale` (regression; the head's per-target std, `data.normalize_targets`): the
    loss is the squared error of the standardised targets, (output − y)² / std², so that
    each target weighs the same whatever its units; the metric stays the squared error in
    the targets' units.

    **Returns:** `(loss, metric)`: NLL and correctness (classification, retrieval); squared
    error and squared error (regression); Gaussian NLL averaged over time and the MSE of the
    mean (gaussian).
    """
    if kind in ("classification", "retrieval"):
        if output.ndim == 2:  # per-step classification: average over time
            nll = -jnp.take_along_axis(output, y[:, None], axis=-1)[:, 0]
            correct = (jnp.argmax(output, -1) == y).astype(output.dtype)
            return _step_mean(nll, length), _step_mean(correct, length)
        return -output[y], (jnp.argmax(output) == y).astype(output.dtype)
    if kind == "regression":
        sq = (output - y) ** 2
        std_sq = sq
        if target_scale is not None:  # the per-target std along the last axis
            scale = jnp.asarray(target_scale, sq.dtype).reshape((1,) * (sq.ndim - 1) + (-1,))
            std_sq = sq / jnp.square(scale)

        def reduce(v):  # per step (L, K): over the valid steps
            return _step_mean(jnp.mean(v, axis=-1), length) if output.ndim == 2 else jnp.mean(v)

        return reduce(std_sq), reduce(sq)
    if kind == "gaussian":
        mean, var = output
        var = jnp.maximum(var, VARIANCE_FLOOR)
        nll = jnp.sum(0.5 * (jnp.log(2 * jnp.pi * var) + (y - mean) ** 2 / var), axis=-1)
        sq = jnp.mean((mean - y) ** 2, axis=-1)
        if mean.ndim == 2:  # per step: (L, K)
            return _step_mean(nll, length), _step_mean(sq, length)
        return nll, sq
    raise ValueError(f"unknown head kind {kind!r}")


class _EachMember(eqx.Module):
    """An `Ensemble` called for its members' stacked outputs (`Ensemble.each`)."""

    ensemble: eqx.Module

    def __call__(self, x, state, **kwargs):
        return self.ensemble.each(x, state, **kwargs)


@dataclass(frozen=True)
class Steps:
    """The compiled steps of one run."""

    train: Callable  # (params, state, opt_state, batch, key) -> (params, state, opt_state, stats)
    evaluate: Callable  # (params, state, batch, step_rescale) -> stats (sums over real rows)


STORE_GRADIENTS = True
"""Whether the train step writes each parameter's gradient (of at least `STORED_GRADIENT_SIZE`
elements) to memory once, through the native kernel's no-op custom call, before the optimiser
reads it (CPU, one device, the C++ library built; read when tracing). Without it XLA's CPU
backend fuses the gradient's whole producer into each of its consumers and recomputes it there:
the SSM's B̃ gradient (the batch's pairwise sum of the per-example weight gradients, the planar
rows' transpose back to complex B and the product with the discretisation factor) was
recomputed in 7 fusions per layer (Adam's two moments, the update, the gradient norm), 0.2 ms
each, in Pathfinder's bfloat16 step (2-core AMD EPYC, 2026-11-29, `jax.profiler` trace)."""

STORED_GRADIENT_SIZE = 4096


def _stored(grads):
    """`grads` with every leaf of at least `STORED_GRADIENT_SIZE` elements written to memory
    once (see `STORE_GRADIENTS`); the same values."""
    if not (
        STORE_GRADIENTS
        and jax.default_backend() == "cpu"
        and jax.device_count() == 1
        and _native.native_available()
    ):
        return grads

    def store(g):
        if isinstance(g, jax.Array) and g.size >= STORED_GRADIENT_SIZE:
            return _native.native_materialise(g)
        return g

    return jax.tree_util.tree_map(store, grads)


def _masked(values, mask):
    weights = mask.astype(values.dtype)
    return jnp.sum(values * weights)


def _class_counts(log_probs, y, mask, lengths=None):
    """Per class (C,): the items of that class (`class_count`) and those predicted right
    (`class_hits`), over the real rows and, per step, the valid steps: the sums behind
    balanced accuracy (`balanced_accuracy_of`)."""
    C = log_probs.shape[-1]
    weight = mask.astype(log_probs.dtype)
    if y.ndim == 2:  # per step: the valid steps of each real row
        steps = jnp.arange(y.shape[1])[None, :]
        valid = jnp.ones_like(y, dtype=bool) if lengths is None else steps < lengths[:, None]
        weight = weight[:, None] * valid.astype(log_probs.dtype)
    of_class = jax.nn.one_hot(y, C, dtype=log_probs.dtype) * weight[..., None]
    right = (jnp.argmax(log_probs, axis=-1) == y).astype(log_probs.dtype)
    axes = tuple(range(y.ndim))
    return {
        "class_count": jnp.sum(of_class, axis=axes),
        "class_hits": jnp.sum(of_class * right[..., None], axis=axes),
    }


def balanced_accuracy_of(hits, count) -> float:
    """The mean over the classes with items (`count` > 0) of hits / count (each class's
    recall); NaN when no class has items."""
    hits, count = np.asarray(hits, np.float64), np.asarray(count, np.float64)
    present = count > 0
    if not present.any():
        return float("nan")
    return float(np.mean(hits[present] / count[present]))


def make_steps(static, optimizer, head_kind: str, members: int = 1, target_scale=None) -> Steps:
    """Build the jitted steps for a model whose static part is `static`.

    Batches are dicts with `x`, `y`, `mask` and optionally `lengths` and `t` (observation times
    turned into per-step Δ multipliers here). Statistics are sums over the real rows together
    with their count, so that epoch averages weigh every example once.

    With `members` K ≥ 2 (an `s5jax.nn.Ensemble`) the training loss is the mean of the members'
    own losses, so each member follows its own gradient (scaled by 1/K, which Adam undoes);
    the metric, and everything in evaluation, is the averaged output's.

    `target_scale`: a regression head's per-target std (`data.normalize_targets`), whose
    loss is then that of the standardised targets (`per_example_loss`).
    """

    def forward(params, state, batch, key, inference, step_rescale, with_outputs=False):
        model = eqx.combine(params, static)
        if members > 1 and not inference:
            model = _EachMember(model)
        n = batch["mask"].shape[0]
        keys = jax.random.split(key, n)
        dt = batch.get("dt")
        lengths = batch.get("lengths")

        def one(x, k, length, dt_k):
            return model(
                x,
                state,
                key=k,
                inference=inference,
                lengths=length,
                dt=dt_k,
                step_rescale=step_rescale,
            )

        outputs, new_state = jax.vmap(
            one,
            axis_name="batch",
            in_axes=(0, 0, None if lengths is None else 0, None if dt is None else 0),
            out_axes=(0, None),
        )(batch["x"], keys, lengths, dt)
        # Per-step losses average over each example's valid steps (`per_example_loss`).
        len_axis = None if lengths is None else 0

        def loss(o, y, n):
            return per_example_loss(head_kind, o, y, n, target_scale)

        def losses_of(outputs):
            return jax.vmap(loss, in_axes=(0, 0, len_axis))(outputs, batch["y"], lengths)

        if members > 1 and not inference:  # outputs (B, K, ...): each member's own loss
            member_losses = jax.vmap(
                jax.vmap(lambda o, y, n: loss(o, y, n)[0], in_axes=(0, None, None)),
                in_axes=(0, 0, len_axis),
            )(outputs, batch["y"], lengths)
            outputs = jax.vmap(lambda o: combine_members(head_kind, o))(outputs)
            _, metrics = losses_of(outputs)
            return (jnp.mean(member_losses, axis=1), metrics, new_state) + (
                (outputs,) if with_outputs else ()
            )
        losses, metrics = losses_of(outputs)
        return (losses, metrics, new_state) + ((outputs,) if with_outputs else ())

    def loss_fn(params, state, batch, key):
        losses, metrics, new_state = forward(params, state, batch, key, False, 1.0)
        count = jnp.maximum(jnp.sum(batch["mask"].astype(losses.dtype)), 1.0)
        loss = _masked(losses, batch["mask"]) / count
        return loss, (new_state, _masked(metrics, batch["mask"]) / count)

    def train_step(params, state, opt_state, batch, key):
        (loss, (state, metric)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, state, batch, key
        )
        grads = _stored(grads)
        with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = eqx.apply_updates(params, updates)
        # Summed from the last leaf (the first gradients the backward pass produces): with
        # remat on CPU this lets XLA free activations early (benchmarks/README.md, remat).
        leaves = jax.tree_util.tree_leaves(grads)
        grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in reversed(leaves)))
        return params, state, opt_state, {"loss": loss, "metric": metric, "grad_norm": grad_norm}

    def eval_step(params, state, batch, step_rescale):
        losses, metrics, _, outputs = forward(
            params, state, batch, jax.random.PRNGKey(0), True, step_rescale, with_outputs=True
        )
        mask = batch["mask"]
        stats = {
            "loss_sum": _masked(losses, mask),
            "metric_sum": _masked(metrics, mask),
            "count": jnp.sum(mask.astype(jnp.int32)),
        }
        if head_kind in ("classification", "retrieval"):
            stats |= _class_counts(outputs, batch["y"], mask, batch.get("lengths"))
        return stats

    return Steps(
        train=jax.jit(train_step, donate_argnums=(0, 1, 2)),
        evaluate=jax.jit(eval_step),
    )
