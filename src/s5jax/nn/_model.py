"""`S5Model`: encoder → n_layers S5 sequence layers → head (reference semantics §4, §6).

The model handles one example and is meant to be called under
`jax.vmap(model, axis_name="batch", in_axes=(0, None, ...), out_axes=(0, None))` so that
BatchNorm statistics span batch × time. `build_model` turns a `ModelConfig` (any object with
its fields; `s5jax.nn` does not import `s5jax.config`) into `(model, state)`; the state holds
the BatchNorm running statistics and is threaded through every call.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ._dense import check_precision
from ._discrete import DiscreteSSM
from ._encoders import DenseEncoder, EmbeddingEncoder, PendulumCNN
from ._heads import ClassificationHead, GaussianHead, RegressionHead, RetrievalHead, pool
from ._layers import SequenceLayer
from ._ssm import S5SSM
from ._tags import DEFAULT_GROUPS, parameter_roles

__all__ = ["S5Model", "build_model", "count_parameters", "parameter_breakdown"]

Encoder = DenseEncoder | EmbeddingEncoder | PendulumCNN
Head = ClassificationHead | RegressionHead | GaussianHead | RetrievalHead


def _precision(cfg) -> str:
    """`cfg.precision` (`"fp32"` when the config has none), validated."""
    return check_precision(getattr(cfg, "precision", "fp32"), "model.precision")


def _encoder(cfg, d_input, vocab, dtype, key) -> Encoder:
    precision = _precision(cfg)
    if cfg.timestep_mode == "append" and cfg.encoder != "pendulum_cnn":
        raise ValueError("model.timestep_mode = 'append' needs model.encoder = 'pendulum_cnn'")
    if cfg.encoder == "embedding":
        if not vocab:
            raise ValueError("model.encoder = 'embedding' needs the vocabulary size (vocab=...)")
        return EmbeddingEncoder(int(vocab), cfg.d_model, dtype=dtype, precision=precision, key=key)
    if vocab:
        raise ValueError(f"vocab={vocab!r} given, but model.encoder = {cfg.encoder!r}")
    if cfg.encoder == "dense":
        return DenseEncoder(d_input, cfg.d_model, dtype=dtype, precision=precision, key=key)
    if cfg.encoder == "pendulum_cnn":
        if d_input != 576:
            raise ValueError(f"the pendulum CNN reads 24×24 frames (d_input 576), got {d_input}")
        append = cfg.timestep_mode == "append"
        return PendulumCNN(cfg.d_model, append_dt=append, dtype=dtype, precision=precision, key=key)
    raise ValueError(f"unknown model.encoder {cfg.encoder!r}")


def _head(cfg, n_outputs, dtype, key) -> Head:
    H, options = cfg.d_model, dict(dtype=dtype, precision=_precision(cfg), key=key)
    if cfg.head == "classification":
        return ClassificationHead(H, n_outputs, **options)
    if cfg.head == "regression":
        return RegressionHead(H, n_outputs, **options)
    if cfg.head == "gaussian":
        return GaussianHead(H, n_outputs, **options)
    if cfg.head == "retrieval":
        return RetrievalHead(H, n_outputs, gelu_approximate=cfg.gelu_approximate, **options)
    raise ValueError(f"unknown model.head {cfg.head!r}")


def _ssm(cfg, dtype, scan_method, key) -> S5SSM | DiscreteSSM:
    options = dict(
        J=cfg.blocks, conj_sym=cfg.conj_sym, bidirectional=cfg.bidirectional,
        discretization=cfg.discretization, c_init=cfg.c_init, lambda_init=cfg.lambda_init,
        dt_min=cfg.dt_min, dt_max=cfg.dt_max, scalar_dt=cfg.scalar_dt,
        clip_eigs=cfg.clip_eigs, scan_method=scan_method, dtype=dtype,
        precision=_precision(cfg), key=key,
    )  # fmt: skip
    if cfg.parameterization == "discrete":
        return DiscreteSSM(cfg.d_model, cfg.ssm_size, **options)
    return S5SSM(cfg.d_model, cfg.ssm_size, **options)


def _layer(cfg, dtype, scan_method, ssm_key, key) -> SequenceLayer:
    return SequenceLayer(
        _ssm(cfg, dtype, scan_method, ssm_key), norm=cfg.norm, prenorm=cfg.prenorm,
        activation=cfg.activation, dropout=cfg.dropout, gelu_approximate=cfg.gelu_approximate,
        bn_momentum=cfg.bn_momentum, dtype=dtype, precision=_precision(cfg), key=key,
    )  # fmt: skip


def _split(key: PRNGKeyArray | None, n: int):
    return [None] * n if key is None else list(jax.random.split(key, n))


REMAT = ("none", "layers", "ssm")


def _call_layer(layer, x, state, key, inference, step_rescale, dt, resets):
    return layer(
        x, state, key=key, inference=inference, step_rescale=step_rescale, dt=dt, resets=resets
    )


class _CheckpointedSSM(eqx.Module):
    """An SSM whose forward pass is recomputed in the backward pass (`remat = "ssm"`).

    Put in place of a layer's SSM at trace time only; the stored model never holds one.
    """

    ssm: S5SSM | DiscreteSSM

    def __call__(self, x, **kwargs):
        return eqx.filter_checkpoint(lambda ssm, x, kwargs: ssm(x, **kwargs))(self.ssm, x, kwargs)


class S5Model(eqx.Module):
    """A deep S5 network for one example (use `build_model`, or `eqx.nn.make_with_state`).

    **Arguments:**
    - `cfg`: a `ModelConfig` (or any object with its fields).
    - `d_input`: input features per step (ignored by the embedding encoder).
    - `n_outputs`: classes (classification, retrieval) or output dimensions (regression).
    - `vocab`: one-hot width of token inputs (embedding encoder), else None.
    - `scan_method`: how each SSM is computed: `"auto"` (the fused path on CPU), `"fused"`, or
      a scan: `"sequential"`, `"parallel"`, `"chunked"`, `"native"`, `"pallas"` (see
      `s5jax.core.apply_ssm`).
    - `dtype`: real dtype of the parameters.
    - `key`: PRNG key (keyword-only).

    `cfg.remat` (`"none"` when absent) chooses what the backward pass recomputes instead of
    storing: `"layers"` checkpoints each sequence layer (`eqx.filter_checkpoint`; only the
    layer inputs are kept), `"ssm"` only each layer's SSM. Outputs and gradients are the same.
    On CPU, XLA's default scheduler moves the recomputation next to the forward pass and so
    cancels the saving: start JAX with
    `XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false` (benchmarks/README.md).

    `cfg.precision` (`"fp32"` when absent): `"bf16"` is mixed precision. Parameters stay
    float32; matrix products take bfloat16 operands and accumulate in float32; activations and
    the residual stream are bfloat16; norms compute their statistics, and the SSMs Λ, Δ, the
    discretisation and the recurrence, in float32; the features are cast back to float32
    before pooling, and the head's final layer, the outputs and the loss are float32.
    """

    encoder: Encoder
    layers: tuple[SequenceLayer, ...]
    head: Head
    pooling: str = eqx.field(static=True)
    timestep_mode: str = eqx.field(static=True)
    remat: str = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        cfg,
        *,
        d_input: int,
        n_outputs: int,
        vocab: int | None = None,
        scan_method: str = "auto",
        dtype=jnp.float32,
        key: PRNGKeyArray,
    ):
        remat = getattr(cfg, "remat", "none")
        if remat not in REMAT:
            raise ValueError(f"model.remat must be one of {REMAT}, got {remat!r}")
        enc_key, head_key, *layer_keys = jax.random.split(key, 2 + 2 * cfg.n_layers)
        self.encoder = _encoder(cfg, d_input, vocab, dtype, enc_key)
        self.layers = tuple(
            _layer(cfg, dtype, scan_method, k_ssm, k_layer)
            for k_ssm, k_layer in zip(layer_keys[0::2], layer_keys[1::2], strict=True)
        )
        self.head = _head(cfg, n_outputs, dtype, head_key)
        self.pooling, self.timestep_mode = cfg.pooling, cfg.timestep_mode
        self.remat = remat
        self.precision = _precision(cfg)

    def _to_float32(self, h):
        """The features in float32 for pooling and the head (a no-op under `"fp32"`)."""
        return h if self.precision == "fp32" else h.astype(self._param_dtype())

    def _param_dtype(self):
        """The parameters' real dtype (the dtype of the head's outputs)."""
        return jax.tree_util.tree_leaves(self.head)[0].dtype

    def stack(self, x, state, *, key, inference, step_rescale, dt=None, resets=None):
        """The sequence layers on encoded features (L, H): returns `(features, state)`."""
        call = eqx.filter_checkpoint(_call_layer) if self.remat == "layers" else _call_layer
        for layer, k in zip(self.layers, _split(key, len(self.layers)), strict=True):
            if self.remat == "ssm":
                layer = eqx.tree_at(lambda m: m.ssm, layer, _CheckpointedSSM(layer.ssm))
            x, state = call(layer, x, state, k, inference, step_rescale, dt, resets)
        return x, state

    def __call__(
        self,
        x: Float[Array, "L d_input"] | Int[Array, " L"] | Int[Array, "2 L"],
        state: eqx.nn.State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool = False,
        lengths: Int[Array, ""] | Int[Array, " 2"] | None = None,
        dt: Float[Array, " L"] | None = None,
        step_rescale: float | Float[Array, ""] = 1.0,
    ):
        """Apply the model to one example (vmap with `axis_name="batch"` for batches).

        **Arguments:**
        - `x`: features (L, d_input), token ids (L,), or for retrieval two documents (2, L).
        - `state`: the model state (BatchNorm running statistics).
        - `key`: dropout key (may be None at inference or without dropout).
        - `inference`: no dropout; BatchNorm uses its running statistics.
        - `lengths`: valid steps (masked-mean pooling); (2,) for retrieval.
        - `dt`: per-step Δ multipliers [1, t_1 − t_0, …] (`s5jax.core.step_multipliers`):
          used by the SSMs in timestep_mode "irregular", appended to the encoder features in
          "append", ignored in "drop".
        - `step_rescale`: multiplies every Δ (zero-shot resampling, §6.2).

        **Returns:** `(output, state)`: log-probabilities (C,) for classification and retrieval
        ((L, C) without pooling); predictions for regression; `(mean, variance)` (L, D) each for
        the Gaussian head.
        """
        if isinstance(self.head, RetrievalHead):
            return self._retrieval(x, state, key, inference, lengths, step_rescale)
        if isinstance(self.encoder, PendulumCNN):
            h = self.encoder(x, dt if self.timestep_mode == "append" else None)
        else:
            h = self.encoder(x)
        ssm_dt = dt if self.timestep_mode == "irregular" else None
        h, state = self.stack(
            h, state, key=key, inference=inference, step_rescale=step_rescale, dt=ssm_dt
        )
        h = self._to_float32(h)
        if self.pooling in ("masked_mean", "last"):
            h = pool(h, self.pooling, lengths)
        else:
            h = pool(h, self.pooling)
        return self.head(h), state

    def _retrieval(self, x, state, key, inference, lengths, step_rescale):
        # Both documents go through the shared stack as one (2L, H) sequence with a reset at
        # each document's start: no state crosses between them and BatchNorm sees the 2·B·L
        # positions the authors' concatenated batch gives. (Tied dropout then shares one mask
        # across the pair; the paper's Retrieval run has no dropout.)
        if x.ndim != 2 or x.shape[0] != 2 or lengths is None:
            raise ValueError("the retrieval model needs x of shape (2, L) and lengths (2,)")
        L = x.shape[1]
        h = jax.vmap(self.encoder)(x).reshape(2 * L, -1)
        resets = jnp.zeros((2 * L,), bool).at[jnp.asarray([0, L])].set(True)
        h, state = self.stack(
            h, state, key=key, inference=inference, step_rescale=step_rescale, resets=resets
        )
        h = self._to_float32(h.reshape(2, L, -1))
        o0 = pool(h[0], "masked_mean", lengths[0])
        o1 = pool(h[1], "masked_mean", lengths[1])
        return self.head(o0, o1), state


def build_model(
    cfg,
    *,
    d_input: int,
    n_outputs: int,
    key: PRNGKeyArray,
    vocab: int | None = None,
    scan_method: str | None = None,
    dtype=jnp.float32,
) -> tuple[S5Model, eqx.nn.State]:
    """Build `(model, state)` from a `ModelConfig`; see `S5Model` for the arguments.

    `vocab` is the one-hot width for token inputs (False or None otherwise). `scan_method`
    overrides the config's `scan_method` (`"auto"` when the config has none).
    """
    if scan_method is None:
        scan_method = getattr(cfg, "scan_method", "auto")
    return eqx.nn.make_with_state(S5Model)(
        cfg, d_input=d_input, n_outputs=n_outputs, vocab=vocab or None,
        scan_method=scan_method, dtype=dtype, key=key,
    )  # fmt: skip


def _is_parameter(leaf) -> bool:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jnp.issubdtype(leaf.dtype, jnp.inexact)
    return eqx.is_inexact_array(leaf)


def count_parameters(model) -> int:
    """Every real parameter entry, as the paper counts; BatchNorm running statistics live in
    the state and are not counted. Also accepts the abstract model of
    `eqx.filter_eval_shape(build_model, ...)`, to count without allocating.
    """
    leaves = jax.tree_util.tree_leaves(eqx.filter(model, _is_parameter))
    return int(sum(np.prod(leaf.shape, dtype=np.int64) for leaf in leaves))


def parameter_breakdown(model, groups: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """Parameter counts per role and per optimiser group.

    **Arguments:** `model`; `groups` maps roles to group names (default `DEFAULT_GROUPS`).

    **Returns:** `{"roles": {role: count}, "groups": {group: count}}`.
    """
    groups = DEFAULT_GROUPS if groups is None else groups
    params = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))
    roles = jax.tree_util.tree_leaves(parameter_roles(model))
    by_role: dict[str, int] = {}
    by_group: dict[str, int] = {}
    for leaf, role in zip(params, roles, strict=True):
        n = int(np.prod(leaf.shape, dtype=np.int64))
        by_role[role] = by_role.get(role, 0) + n
        by_group[groups[role]] = by_group.get(groups[role], 0) + n
    return {"roles": by_role, "groups": by_group}
