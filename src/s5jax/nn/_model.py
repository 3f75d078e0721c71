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
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from ._dense import check_precision
from ._discrete import DiscreteSSM
from ._encoders import DenseEncoder, EmbeddingEncoder, PendulumCNN
from ._ensemble import ENSEMBLE_HEADS, Ensemble
from ._heads import (
    ClassificationHead,
    GaussianHead,
    RegressionHead,
    RetrievalHead,
    Targets,
    pool,
)
from ._layers import SequenceLayer
from ._ssm import S5SSM
from ._tags import DEFAULT_GROUPS, parameter_roles

__all__ = ["S5Model", "StreamState", "build_model", "count_parameters", "parameter_breakdown"]

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


def _head(cfg, n_outputs, dtype, key, targets=None) -> Head:
    H, options = cfg.d_model, dict(dtype=dtype, precision=_precision(cfg), key=key)
    if targets is not None and cfg.head not in ("regression", "gaussian"):
        raise ValueError(f"targets: the {cfg.head!r} head predicts no targets to scale")
    if cfg.head == "classification":
        return ClassificationHead(H, n_outputs, **options)
    if cfg.head == "regression":
        return RegressionHead(H, n_outputs, targets=targets, **options)
    if cfg.head == "gaussian":
        return GaussianHead(
            H, n_outputs, activation=cfg.head_activation, targets=targets, **options
        )
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


def _call_layer(layer, x, state, key, inference, step_rescale, dt, resets, segments, valid):
    return layer(
        x, state, key=key, inference=inference, step_rescale=step_rescale, dt=dt, resets=resets,
        segments=segments, valid=valid,
    )  # fmt: skip


def _valid_steps(L: int, lengths) -> Bool[Array, " L"]:
    """The first `lengths` of L steps (`lengths` (2,) for two segments of L // 2 steps)."""
    lengths = jnp.asarray(lengths)
    if lengths.ndim == 0:
        return jnp.arange(L) < lengths
    steps = jnp.arange(L // lengths.shape[0])
    return (steps[None, :] < lengths[:, None]).reshape(L)


class _CheckpointedSSM(eqx.Module):
    """An SSM whose forward pass is recomputed in the backward pass (`remat = "ssm"`).

    Put in place of a layer's SSM at trace time only; the stored model never holds one.
    """

    ssm: S5SSM | DiscreteSSM

    def __call__(self, x, **kwargs):
        return eqx.filter_checkpoint(lambda ssm, x, kwargs: ssm(x, **kwargs))(self.ssm, x, kwargs)


class StreamState(eqx.Module):
    """The state of a model run online (`S5Model.init_state`, `S5Model.step`): a pytree.

    **Fields:**
    - `ssm`: one SSM state per layer, complex (P,) each.
    - `model_state`: the model's `eqx.nn.State` (BatchNorm running statistics), read only:
      online steps are in inference mode.
    - `pool_sum`: the features (H,) summed since the last reset (mean pooling).
    - `count`: steps since the last reset (a real scalar).

    Batch streams by giving every leaf a leading axis (`S5Model.init_state(state, batch=B)`)
    and calling `jax.vmap(model.step)`.
    """

    ssm: tuple[Array, ...]
    model_state: eqx.nn.State
    pool_sum: Array
    count: Array


class S5Model(eqx.Module):
    """A deep S5 network for one example (use `build_model`, or `eqx.nn.make_with_state`).

    **Arguments:**
    - `cfg`: a `ModelConfig` (or any object with its fields).
    - `d_input`: input features per step (ignored by the embedding encoder).
    - `n_outputs`: classes (classification, retrieval) or output dimensions (regression).
    - `vocab`: one-hot width of token inputs (embedding encoder), else None.
    - `scan_method`: how each SSM is computed: `"auto"` (on CPU the native C++ scan where it builds,
      else the chunked scan, and the fused path above 2²¹ states per sequence and layer),
      `"fused"`, or
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

    `cfg.mask_padding` (False when absent): with `lengths` given, every layer's SSM reads
    zeros at the padding steps and BatchNorm's training statistics count only the valid ones,
    so the outputs at valid steps do not depend on the padding (its content or how far a
    sequence is padded): a bidirectional layer's backward scan starts at the last valid step.
    Off, padding passes through the encoder and the SSMs as in the authors' model (reference
    semantics §4), and a bidirectional model's outputs move with the padding.

    `cfg.precision` (`"fp32"` when absent): `"bf16"` is mixed precision. Parameters stay
    float32; matrix products take bfloat16 operands and accumulate in float32; activations and
    the residual stream are bfloat16 (GELU and the gate's sigmoid computed in float32, rounded
    once); norms compute their statistics, and the SSMs Λ, Δ, the
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
    mask_padding: bool = eqx.field(static=True)

    def __init__(
        self,
        cfg,
        *,
        d_input: int,
        n_outputs: int,
        vocab: int | None = None,
        scan_method: str = "auto",
        dtype=jnp.float32,
        targets: Targets | None = None,
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
        self.head = _head(cfg, n_outputs, dtype, head_key, targets)
        self.pooling, self.timestep_mode = cfg.pooling, cfg.timestep_mode
        self.remat = remat
        self.precision = _precision(cfg)
        self.mask_padding = bool(getattr(cfg, "mask_padding", False))

    def _to_float32(self, h):
        """The features in float32 for pooling and the head (a no-op under `"fp32"`)."""
        return h if self.precision == "fp32" else h.astype(self._param_dtype())

    def _param_dtype(self):
        """The parameters' real dtype (the dtype of the head's outputs)."""
        return jax.tree_util.tree_leaves(self.head)[0].dtype

    def stack(
        self, x, state, *, key, inference, step_rescale, dt=None, resets=None, segments=1,
        lengths=None,
    ):  # fmt: skip
        """The sequence layers on encoded features (L, H): returns `(features, state)`.
        `segments`: x is that many independent sequences laid end to end (`S5SSM.__call__`).
        `lengths`: each segment's valid steps, read when `mask_padding` is on (see `S5Model`).
        """
        call = eqx.filter_checkpoint(_call_layer) if self.remat == "layers" else _call_layer
        valid = None
        if self.mask_padding and lengths is not None:
            valid = _valid_steps(x.shape[0], lengths)
        for layer, k in zip(self.layers, _split(key, len(self.layers)), strict=True):
            if self.remat == "ssm":
                layer = eqx.tree_at(lambda m: m.ssm, layer, _CheckpointedSSM(layer.ssm))
            x, state = call(
                layer, x, state, k, inference, step_rescale, dt, resets, segments, valid
            )
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
        - `lengths`: valid steps (masked-mean and last-step pooling, per-step targets,
          `mask_padding`); (2,) for retrieval.
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
            h, state, key=key, inference=inference, step_rescale=step_rescale, dt=ssm_dt,
            lengths=lengths,
        )  # fmt: skip
        h = self._to_float32(h)
        if self.pooling in ("masked_mean", "last"):
            h = pool(h, self.pooling, lengths)
        else:
            h = pool(h, self.pooling)
        return self.head(h), state

    def _retrieval(self, x, state, key, inference, lengths, step_rescale):
        # Both documents go through the shared stack as one (2L, H) sequence of two segments:
        # no state crosses between them (the SSM runs them as a batch of two, the same as a
        # reset at each document's start, but on every scan method) and BatchNorm sees the
        # 2·B·L positions the authors' concatenated batch gives. (Tied dropout then shares
        # one mask across the pair; the paper's Retrieval run has no dropout.)
        if x.ndim != 2 or x.shape[0] != 2 or lengths is None:
            raise ValueError("the retrieval model needs x of shape (2, L) and lengths (2,)")
        L = x.shape[1]
        h = jax.vmap(self.encoder)(x).reshape(2 * L, -1)
        h, state = self.stack(
            h, state, key=key, inference=inference, step_rescale=step_rescale, segments=2,
            lengths=lengths,
        )  # fmt: skip
        h = self._to_float32(h.reshape(2, L, -1))
        o0 = pool(h[0], "masked_mean", lengths[0])
        o1 = pool(h[1], "masked_mean", lengths[1])
        return self.head(o0, o1), state

    # --- online use -----------------------------------------------------------------------

    def check_online(self) -> None:
        """Raise a `ValueError` that says why when the model cannot run step by step."""
        if isinstance(self.head, RetrievalHead):
            raise ValueError(
                "the retrieval model cannot run online: it compares two whole documents"
            )
        if any(layer.ssm.bidirectional for layer in self.layers):
            raise ValueError(
                "a bidirectional model cannot run online: its backward scan needs the future "
                "inputs (train with model.bidirectional = false for online use)"
            )

    def init_state(self, state: eqx.nn.State | None = None, *, batch: int | None = None):
        """The `StreamState` before the first input of an online run.

        **Arguments:**
        - `state`: the model state from `build_model` or a checkpoint (BatchNorm running
          statistics); `None` builds the initial one (untrained statistics).
        - `batch`: give every leaf a leading axis of this size, for
          `jax.vmap(model.step)` over `batch` independent streams.
        """
        self.check_online()
        if state is None:
            state = eqx.nn.State(self)
        dtype = self._param_dtype()
        H = self.layers[0].ssm.H
        stream = StreamState(
            ssm=tuple(layer.ssm.init_state() for layer in self.layers),
            model_state=state,
            pool_sum=jnp.zeros((H,), dtype),
            count=jnp.zeros((), dtype),
        )
        if batch is None:
            return stream
        return jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (batch, *a.shape)), stream)

    def step(
        self,
        stream: StreamState,
        x_t: Float[Array, " d_input"] | Int[Array, ""],
        *,
        dt_t: float | Float[Array, ""] | None = None,
        reset: bool | Bool[Array, ""] = False,
        step_rescale: float | Float[Array, ""] = 1.0,
    ):
        """One online step: O(PH) work per layer, the paper's recurrence (§3.3, App. C.2).

        **Arguments:**
        - `stream`: the `StreamState` after the previous step (`init_state` at the start).
        - `x_t`: this step's input: features (d_input,) or a token id ().
        - `dt_t`: this step's Δ multiplier t_k − t_{k−1} (1 at an episode's first step), used
          as the model's `timestep_mode` says (`"irregular"`: the SSMs; `"append"`: the
          encoder; `"drop"`: ignored). `None` means 1.
        - `reset`: a new episode starts at this step (may be traced): the SSM states and the
          pooling sums return to their initial values first.
        - `step_rescale`: multiplies every Δ, as in `__call__`.

        **Returns:** `(stream′, output)`. Per-step heads (pooling `"none"`) give this step's
        output: log-probabilities (C,), a prediction (D,), or `(mean, variance)` (D,) each.
        Pooled heads give the offline model's output on the inputs since the last reset.
        Equal to the offline model in inference mode (`tests/test_stream.py`).
        """
        self.check_online()
        stream = self._maybe_reset(stream, reset)
        h = self._encode_step(x_t, dt_t)
        ssm_dt = dt_t if self.timestep_mode == "irregular" else None
        states = []
        for layer, s in zip(self.layers, stream.ssm, strict=True):
            s, h = layer.step(h, s, stream.model_state, step_rescale=step_rescale, dt=ssm_dt)
            states.append(s)
        h = self._to_float32(h)
        pool_sum, count = stream.pool_sum, stream.count
        if self.pooling in ("mean", "masked_mean"):
            pool_sum, count = pool_sum + h, count + 1
            out = self.head(pool_sum / count)
        elif self.pooling == "none" and isinstance(self.head, GaussianHead):
            mean, var = self.head(h[None, :])
            out = (mean[0], var[0])
        else:  # "last", or per-step classification/regression ("none")
            out = self.head(h)
        new = StreamState(tuple(states), stream.model_state, pool_sum, count)
        return new, out

    def _maybe_reset(self, stream: StreamState, reset) -> StreamState:
        if isinstance(reset, bool) and not reset:
            return stream
        reset = jnp.asarray(reset)
        if reset.shape != () or reset.dtype != jnp.bool_:
            raise ValueError(f"reset must be a boolean scalar, got {reset.dtype}{reset.shape}")

        def restart(a):
            return jnp.where(reset, jnp.zeros_like(a), a)

        return StreamState(
            tuple(restart(s) for s in stream.ssm),
            stream.model_state,
            restart(stream.pool_sum),
            restart(stream.count),
        )

    def _encode_step(self, x_t, dt_t):
        x_t = jnp.asarray(x_t)
        if isinstance(self.encoder, EmbeddingEncoder):
            if x_t.shape != () or not jnp.issubdtype(x_t.dtype, jnp.integer):
                raise ValueError(
                    f"x_t must be one integer token id (shape ()), got {x_t.dtype}{x_t.shape}"
                )
            return self.encoder(x_t[None])[0]
        width = 576 if isinstance(self.encoder, PendulumCNN) else self.encoder.dense.in_features
        if x_t.shape != (width,):
            raise ValueError(f"x_t must have shape (d_input,) = ({width},), got {x_t.shape}")
        if isinstance(self.encoder, PendulumCNN):
            append = self.timestep_mode == "append"
            dt = None
            if append and dt_t is not None:
                dt = jnp.reshape(jnp.asarray(dt_t, x_t.dtype), (1,))
            elif append:
                dt = jnp.ones((1,), x_t.dtype)
            return self.encoder(x_t[None], dt)[0]
        return self.encoder(x_t[None])[0]

    def run_online(
        self,
        stream: StreamState,
        xs: Float[Array, "L d_input"] | Int[Array, " L"],
        *,
        dt: Float[Array, " L"] | None = None,
        resets: Bool[Array, " L"] | None = None,
        step_rescale: float | Float[Array, ""] = 1.0,
    ):
        """`step` over a whole sequence with `jax.lax.scan`.

        **Arguments:** `stream`; `xs` (L, d_input) or (L,) tokens; `dt` (L,) per-step Δ
        multipliers (`s5jax.core.step_multipliers`); `resets` (L,) booleans; `step_rescale`.

        **Returns:** `(stream′, outputs)`, the outputs of every step stacked on a leading L
        axis (a tuple of two (L, D) arrays for the Gaussian head).
        """
        self.check_online()
        L = xs.shape[0]
        if dt is not None and jnp.shape(dt) != (L,):
            raise ValueError(f"dt must have shape (L,) = ({L},), got {jnp.shape(dt)}")
        if resets is not None and jnp.shape(resets) != (L,):
            raise ValueError(f"resets must have shape (L,) = ({L},), got {jnp.shape(resets)}")

        def body(carry, inputs):
            x_t, dt_t, reset = inputs
            return self.step(carry, x_t, dt_t=dt_t, reset=reset, step_rescale=step_rescale)

        if resets is None:
            resets = jnp.zeros((L,), jnp.bool_)
        if dt is None and self.timestep_mode == "append":
            dt = jnp.ones((L,), self._param_dtype())
        return jax.lax.scan(body, stream, (xs, dt, jnp.asarray(resets)))


def build_model(
    cfg,
    *,
    d_input: int,
    n_outputs: int,
    key: PRNGKeyArray,
    vocab: int | None = None,
    scan_method: str | None = None,
    dtype=jnp.float32,
    targets: Targets | None = None,
) -> tuple[S5Model | Ensemble, eqx.nn.State]:
    """Build `(model, state)` from a `ModelConfig`; see `S5Model` for the arguments.

    With `cfg.members = K` ≥ 2 (1 when the config has none) the model is an `Ensemble` of K
    members initialised from `jax.random.split(key, K)`.

    `vocab` is the one-hot width for token inputs (False or None otherwise). `scan_method`
    overrides the config's `scan_method` (`"auto"` when the config has none). `targets`:
    the regression targets' per-output (mean, std), the head's fixed output affine
    (`RegressionHead`; `data.normalize_targets`).
    """
    if scan_method is None:
        scan_method = getattr(cfg, "scan_method", "auto")

    def make(k):
        return eqx.nn.make_with_state(S5Model)(
            cfg, d_input=d_input, n_outputs=n_outputs, vocab=vocab or None,
            scan_method=scan_method, dtype=dtype, targets=targets, key=k,
        )  # fmt: skip

    members = int(getattr(cfg, "members", 1))
    if members == 1:
        return make(key)
    if members < 1:
        raise ValueError(f"model.members must be >= 1, got {members}")
    if cfg.head not in ENSEMBLE_HEADS:
        raise ValueError(
            f"model.members = {members}: an ensemble averages {', '.join(ENSEMBLE_HEADS)} "
            f"outputs, not the {cfg.head!r} head's; set model.members = 1"
        )
    model, state = eqx.filter_vmap(make)(jax.random.split(key, members))
    return Ensemble(model, members, cfg.head), state


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
