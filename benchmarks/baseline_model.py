"""The authors' whole S5 model, computed as their JAX code computes it, in plain JAX.

What a user would otherwise run (lindermanlab/S5, `s5/ssm.py`, `s5/layers.py`,
`s5/seq_model.py`, `s5/train_helpers.py`; branch `pendulum` for the irregularly sampled
regression), written from `../shared/specs/reference-semantics.md` and the paper's App. A
listing, with the parameters as a pytree of arrays (flax's names) instead of flax modules:

- encoder: `nn.Dense(H)` on every step; token tasks receive one-hot vectors made on the host
  by `prep_batch` (so the jitted step multiplies a (B, L, vocab) float array); the pendulum's
  per-frame CNN (conv → ReLU → max-pool twice, Dense 30, ReLU, Dense H);
- sequence layer: skip; [prenorm] norm; SSM; activation (`gelu`, `full_glu`, `half_glu1`,
  `half_glu2`, tanh GELU) with flax's `Dropout(broadcast_dims=[0])` (one mask per sequence and
  channel); skip + x; [postnorm] norm. BatchNorm is flax's under `nn.vmap(axis_name="batch")`:
  mean and mean of squares per example, `pmean` over the batch, var = E[x²] − E[x]²;
  LayerNorm is flax's (eps 1e-6, the same fast variance);
- SSM (App. A): ZOH, Λ̄ repeated L times, B̄u by `jax.vmap(lambda u: B_bar @ u)` (complex
  matvecs), `jax.lax.associative_scan` forward (and reversed for bidirectional, C̃ =
  [C1 | C2]), `jax.vmap(lambda x: 2 * (C_tilde @ x).real)`, plus `D * u`; irregular sampling
  (pendulum branch): a B̄ per step, (L, P, H), from Δ·τ_k;
- pooling (mean, masked mean over `lengths`, last, none) and decoder Dense → log-softmax;
  retrieval: both documents as one batch of 2B (BatchNorm over 2B × L), masked mean pool,
  split, [o0, o1, o0 − o1, o0 ⊙ o1] → Dense(H) → GELU → Dense(2); the pendulum's Gaussian head
  (two MLPs H → 30 → act → D, σ² = exp(ℓ) if ℓ < 0 else ℓ + 1);
- the model is vmapped over examples (`axis_name="batch"`); the training step is
  `jax.value_and_grad` of the mean loss and an optax `multi_transform` (Adam for Λ, B̃, log Δ;
  AdamW for the rest) as `train_helpers.create_train_state` builds it, jitted without
  donation as the authors' `train_step` is.

`from_ours(model, state)` maps the parameters of an `s5jax.nn.S5Model` (and its BatchNorm
running statistics) into this pytree, so the two can be compared on the same numbers
(tests/test_baseline_model.py) and timed on the same model (benchmarks/train_step.py).
The authors' code is not strict about dtype or rank promotion; neither is this file: its
functions trace under standard promotion whatever the caller's setting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "Spec",
    "apply",
    "from_ours",
    "make_optimizer",
    "make_train_step",
    "model_inputs",
    "per_example_loss",
]


@dataclasses.dataclass(frozen=True)
class Spec:
    """The static architecture of a baseline model (the authors' command-line settings)."""

    n_layers: int
    norm: str  # "batch" | "layer"
    prenorm: bool
    activation: str  # "gelu" | "full_glu" | "half_glu1" | "half_glu2"
    dropout: float
    bn_momentum: float
    conj_sym: bool
    bidirectional: bool
    clip_eigs: bool
    discretization: str  # "zoh" (the authors' default) | "bilinear"
    encoder: str  # "dense" | "onehot" | "pendulum_cnn"
    vocab: int | None
    pooling: str  # "mean" | "masked_mean" | "last" | "none"
    head: str  # "classification" | "retrieval" | "gaussian" | "regression"
    irregular: bool  # per-step Δ multipliers (pendulum branch)
    gelu_approximate: bool = True
    head_activation: str = "tanh"  # the Gaussian head's hidden activation


def _loose():
    """Standard dtype and rank promotion, as the authors' code assumes."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.numpy_dtype_promotion("standard"))
    stack.enter_context(jax.numpy_rank_promotion("allow"))
    return stack


# --- the SSM (s5/ssm.py) -----------------------------------------------------------------------


def discretize_zoh(Lambda, B_tilde, Delta):
    Identity = jnp.ones(Lambda.shape[0])
    Lambda_bar = jnp.exp(Lambda * Delta)
    B_bar = (1 / Lambda * (Lambda_bar - Identity))[..., None] * B_tilde
    return Lambda_bar, B_bar


def discretize_bilinear(Lambda, B_tilde, Delta):
    Identity = jnp.ones(Lambda.shape[0])
    BL = 1 / (Identity - (Delta / 2.0) * Lambda)
    Lambda_bar = BL * (Identity + (Delta / 2.0) * Lambda)
    B_bar = (BL * Delta)[..., None] * B_tilde
    return Lambda_bar, B_bar


def binary_operator(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j


def apply_ssm(Lambda_bar, B_bar, C_tilde, input_sequence, conj_sym, bidirectional):
    """App. A; `Lambda_bar`, `B_bar` either time-invariant ((P,), (P, H)) or per step
    ((L, P), (L, P, H)) as in the pendulum branch."""
    if Lambda_bar.ndim == 1:
        Lambda_elements = Lambda_bar * jnp.ones((input_sequence.shape[0], Lambda_bar.shape[0]))
        Bu_elements = jax.vmap(lambda u: B_bar @ u)(input_sequence)
    else:
        Lambda_elements = Lambda_bar
        Bu_elements = jax.vmap(lambda B, u: B @ u)(B_bar, input_sequence)
    _, xs = jax.lax.associative_scan(binary_operator, (Lambda_elements, Bu_elements))
    if bidirectional:
        _, xs2 = jax.lax.associative_scan(
            binary_operator, (Lambda_elements, Bu_elements), reverse=True
        )
        xs = jnp.concatenate((xs, xs2), axis=-1)
    if conj_sym:
        return jax.vmap(lambda x: 2 * (C_tilde @ x).real)(xs)
    return jax.vmap(lambda x: (C_tilde @ x).real)(xs)


def ssm(spec: Spec, p, u, dt=None):
    """One S5 SSM on one sequence u (L, H); `dt` (L,) the per-step Δ multipliers."""
    if spec.clip_eigs:
        Lambda = jnp.clip(p["Lambda_re"], None, -1e-4) + 1j * p["Lambda_im"]
    else:
        Lambda = p["Lambda_re"] + 1j * p["Lambda_im"]
    B_tilde = p["B"][..., 0] + 1j * p["B"][..., 1]
    if spec.bidirectional:
        C = jnp.concatenate((p["C1"], p["C2"]), axis=-2)  # (H, 2P, 2) → C̃ = [C1 | C2]
        C_tilde = C[..., 0] + 1j * C[..., 1]
    else:
        C_tilde = p["C"][..., 0] + 1j * p["C"][..., 1]
    step = jnp.exp(p["log_step"])
    disc = discretize_zoh if spec.discretization == "zoh" else discretize_bilinear
    if dt is None:
        Lambda_bar, B_bar = disc(Lambda, B_tilde, step)
    else:  # the pendulum branch: one (Λ̄, B̄) per step
        Lambda_bar, B_bar = jax.vmap(lambda d: disc(Lambda, B_tilde, step * d))(dt)
    ys = apply_ssm(Lambda_bar, B_bar, C_tilde, u, spec.conj_sym, spec.bidirectional)
    Du = jax.vmap(lambda x: p["D"] * x)(u)
    return ys + Du


# --- norms, dropout, the sequence layer (s5/layers.py) ---------------------------------------


def batch_norm(spec: Spec, p, stats, x, training):
    """flax `nn.BatchNorm(axis_name="batch")` on one (L, H) example under `jax.vmap`."""
    if training:
        mean = jax.lax.pmean(jnp.mean(x, axis=0), "batch")
        mean2 = jax.lax.pmean(jnp.mean(x * x, axis=0), "batch")
        var = jnp.maximum(0.0, mean2 - mean * mean)
        m = spec.bn_momentum
        stats = {
            "mean": m * stats["mean"] + (1 - m) * mean,
            "var": m * stats["var"] + (1 - m) * var,
        }
    else:
        mean, var = stats["mean"], stats["var"]
    y = (x - mean) * (jax.lax.rsqrt(var + 1e-5) * p["scale"])
    return y + p["bias"], stats


def layer_norm(p, x):
    """flax `nn.LayerNorm()` (eps 1e-6, fast variance)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    mean2 = jnp.mean(x * x, axis=-1, keepdims=True)
    var = jnp.maximum(0.0, mean2 - mean * mean)
    return (x - mean) * (jax.lax.rsqrt(var + 1e-6) * p["scale"]) + p["bias"]


def dropout(rate, x, key, training):
    """flax `nn.Dropout(rate, broadcast_dims=[0])`: one mask per channel, shared over time."""
    if not training or rate == 0.0:
        return x
    keep_prob = 1.0 - rate
    mask = jax.random.bernoulli(key, p=keep_prob, shape=(1, x.shape[-1]))
    mask = jnp.broadcast_to(mask, x.shape)
    return jax.lax.select(mask, x / keep_prob, jnp.zeros_like(x))


def dense(p, x):
    return x @ p["kernel"] + p["bias"]


def gelu(spec: Spec, x):
    return jax.nn.gelu(x, approximate=spec.gelu_approximate)


def sequence_layer(spec: Spec, p, stats, x, key, training, dt=None):
    """`SequenceLayer.__call__` on one (L, H) example; returns (y, new BatchNorm stats)."""
    k1, k2 = (None, None) if key is None else tuple(jax.random.split(key, 2))
    skip = x
    if spec.prenorm:
        x, stats = _norm(spec, p, stats, x, training)
    x = ssm(spec, p["seq"], x, dt)
    if spec.activation == "full_glu":
        x = dropout(spec.dropout, gelu(spec, x), k1, training)
        x = dense(p["out1"], x) * jax.nn.sigmoid(dense(p["out2"], x))
        x = dropout(spec.dropout, x, k2, training)
    elif spec.activation == "half_glu1":
        x = dropout(spec.dropout, gelu(spec, x), k1, training)
        x = x * jax.nn.sigmoid(dense(p["out2"], x))
        x = dropout(spec.dropout, x, k2, training)
    elif spec.activation == "half_glu2":
        x1 = dropout(spec.dropout, gelu(spec, x), k1, training)
        x = x * jax.nn.sigmoid(dense(p["out2"], x1))
        x = dropout(spec.dropout, x, k2, training)
    elif spec.activation == "gelu":
        x = dropout(spec.dropout, gelu(spec, x), k1, training)
    else:
        raise ValueError(f"unknown activation {spec.activation!r}")
    x = skip + x
    if not spec.prenorm:
        x, stats = _norm(spec, p, stats, x, training)
    return x, stats


def _norm(spec, p, stats, x, training):
    if spec.norm == "batch":
        return batch_norm(spec, p["norm"], stats, x, training)
    return layer_norm(p["norm"], x), stats


# --- encoders, pooling, heads (s5/seq_model.py) ----------------------------------------------


def pendulum_cnn(p, frames):
    """The pendulum branch's per-frame encoder on (L, 576) frames: (L, H)."""
    x = frames.reshape(-1, 24, 24, 1)
    dn = ("NHWC", "HWIO", "NHWC")
    x = jax.lax.conv_general_dilated(x, p["conv1"]["kernel"], (1, 1), ((2, 2), (2, 2)),
                                     dimension_numbers=dn) + p["conv1"]["bias"]  # fmt: skip
    x = _max_pool(jax.nn.relu(x))
    x = jax.lax.conv_general_dilated(x, p["conv2"]["kernel"], (2, 2), ((1, 1), (1, 1)),
                                     dimension_numbers=dn) + p["conv2"]["bias"]  # fmt: skip
    x = _max_pool(jax.nn.relu(x))
    x = jax.nn.relu(dense(p["hidden"], x.reshape(x.shape[0], -1)))
    return dense(p["out"], x)


def _max_pool(x):
    """flax `nn.max_pool(x, (2, 2), strides=(2, 2))` (VALID)."""
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def encode_and_stack(spec: Spec, params, stats, x, key, training, dt=None):
    """Encoder + `StackedEncoderModel` on one example: (L, H) features and the new stats."""
    if spec.encoder == "pendulum_cnn":
        h = pendulum_cnn(params["encoder"], x)
    else:
        h = dense(params["encoder"], x)
    keys = [None] * spec.n_layers if key is None else list(jax.random.split(key, spec.n_layers))
    new_stats = []
    for p, s, k in zip(params["layers"], stats, keys, strict=True):
        h, s = sequence_layer(spec, p, s, h, k, training, dt)
        new_stats.append(s)
    return h, new_stats


def masked_meanpool(x, lengths):
    L = x.shape[0]
    mask = jnp.arange(L) < lengths
    return jnp.sum(mask[..., None] * x, axis=0) / lengths


def _pool(spec, h, length):
    if spec.pooling == "mean":
        return jnp.mean(h, axis=0)
    if spec.pooling == "masked_mean":
        return masked_meanpool(h, length)
    if spec.pooling == "last":
        return h[-1]
    return h


def _head(spec: Spec, params, z):
    p = params["decoder"]
    if spec.head == "classification":
        return jax.nn.log_softmax(dense(p, z), axis=-1)
    if spec.head == "regression":
        return dense(p, z)
    if spec.head == "gaussian":
        act = jnp.tanh if spec.head_activation == "tanh" else jax.nn.relu
        mean = dense(p["mean_out"], act(dense(p["mean_hidden"], z)))
        ell = dense(p["var_out"], act(dense(p["var_hidden"], z)))
        var = jnp.where(ell < 0, jnp.exp(jnp.minimum(ell, 0.0)), ell + 1)
        return mean, var
    raise ValueError(f"unknown head {spec.head!r}")


def apply(spec: Spec, params, stats, x, *, key=None, training=True, lengths=None, dt=None):
    """The batched model: `(outputs, new stats)`.

    **Arguments:** `x` as the authors' step receives it: (B, L, d_input) float (one-hot for
    token tasks, see `model_inputs`), for retrieval (2B, L, vocab) with the first documents of
    every pair then the second ones; `key` the dropout key of the batch (split per example);
    `lengths` (B,) or (2B,); `dt` (B, L) per-step Δ multipliers (pendulum).
    """
    with _loose():
        n = x.shape[0]
        keys = None if key is None else jax.random.split(key, n)

        def one(x, k, length, d):
            h, s = encode_and_stack(spec, params, stats, x, k, training, d)
            return _pool(spec, h, length), s

        pooled, new_stats = jax.vmap(
            one, axis_name="batch",
            in_axes=(0, None if keys is None else 0, None if lengths is None else 0,
                     None if dt is None else 0),
            out_axes=(0, None),
        )(x, keys, lengths, dt)  # fmt: skip
        if spec.head == "retrieval":
            o0, o1 = jnp.split(pooled, 2)
            features = jnp.concatenate([o0, o1, o0 - o1, o0 * o1], axis=-1)
            h = gelu(spec, dense(params["decoder"]["layer1"], features))
            out = jax.nn.log_softmax(dense(params["decoder"]["layer2"], h), axis=-1)
        else:
            out = jax.vmap(functools.partial(_head, spec, params))(pooled)
        return out, new_stats


# --- the training step (s5/train_helpers.py) -------------------------------------------------


def per_example_loss(spec: Spec, out, y):
    """The authors' losses, per example: NLL of the label; the Gaussian NLL averaged over
    time (σ² floored at 1e-6); the squared error."""
    with _loose():
        if spec.head in ("classification", "retrieval"):
            return -jnp.sum(jax.nn.one_hot(y, out.shape[-1]) * out, axis=-1)
        if spec.head == "gaussian":
            mean, var = out
            var = jnp.maximum(var, 1e-6)
            nll = 0.5 * (jnp.log(2 * jnp.pi * var) + (y - mean) ** 2 / var)
            return jnp.mean(jnp.sum(nll, axis=-1), axis=-1)
        return jnp.mean((out - y) ** 2, axis=tuple(range(1, out.ndim)))


SSM_PARAMETERS = ("Lambda_re", "Lambda_im", "B", "log_step")


def make_optimizer(params, *, ssm_lr=1e-3, lr=4e-3, weight_decay=0.05):
    """The authors' `create_train_state` optimiser: Adam at the SSM lr for Λ, B̃ and log Δ,
    AdamW at the global lr for the rest, each under `inject_hyperparams` (the host sets the
    rates every epoch)."""

    def label(path, _):
        names = [getattr(k, "key", None) for k in path]
        return "ssm" if names[-1] in SSM_PARAMETERS and "seq" in names else "regular"

    labels = jax.tree_util.tree_map_with_path(label, params)
    return optax.multi_transform(
        {
            "ssm": optax.inject_hyperparams(optax.adam)(learning_rate=ssm_lr),
            "regular": optax.inject_hyperparams(optax.adamw)(
                learning_rate=lr, weight_decay=weight_decay
            ),
        },
        labels,
    )


def make_train_step(spec: Spec, optimizer):
    """The jitted step `(params, stats, opt_state, batch, key) -> (params, stats, opt_state,
    loss)`; `batch` has `x`, `y` and optionally `lengths`, `dt` (see `apply`)."""

    def loss_fn(params, stats, batch, key):
        out, new_stats = apply(spec, params, stats, batch["x"], key=key, training=True,
                               lengths=batch.get("lengths"), dt=batch.get("dt"))  # fmt: skip
        return jnp.mean(per_example_loss(spec, out, batch["y"])), new_stats

    def step(params, stats, opt_state, batch, key):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, batch, key)
        with _loose():
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, stats, opt_state, loss

    return jax.jit(step)


def model_inputs(spec: Spec, batch: dict) -> dict:
    """Our batch (token ids (B, L), retrieval pairs (B, 2, L)) → what the authors' step
    receives: one-hot float inputs made on the host (`prep_batch`), retrieval pairs as a batch
    of 2B documents (all first documents, then all second ones)."""
    x = np.asarray(batch["x"])
    lengths = batch.get("lengths")
    if spec.head == "retrieval":
        x = np.concatenate([x[:, 0], x[:, 1]], axis=0)
        lengths = np.concatenate([np.asarray(lengths)[:, 0], np.asarray(lengths)[:, 1]])
    if spec.encoder == "onehot":
        x = np.eye(spec.vocab, dtype=np.float32)[x]
    out = {"x": jnp.asarray(x), "y": jnp.asarray(batch["y"])}
    if lengths is not None and spec.pooling == "masked_mean":
        out["lengths"] = jnp.asarray(lengths)
    if batch.get("dt") is not None:
        out["dt"] = jnp.asarray(batch["dt"])
    return out


# --- our parameters in the authors' pytree ---------------------------------------------------


def _dense(d):
    return {"kernel": d.weight, "bias": d.bias}


def _ri(re, im):
    return jnp.stack([re, im], axis=-1)


def from_ours(model, state=None):
    """`(spec, params, stats)` of the baseline holding the parameters (and BatchNorm running
    statistics, from `state`) of an `s5jax.nn.S5Model`."""
    from s5jax import nn

    first = model.layers[0]
    s = first.ssm
    if not isinstance(s, nn.S5SSM):
        raise ValueError("the baseline has the continuous-time S5SSM only")
    enc = model.encoder
    if isinstance(enc, nn.EmbeddingEncoder):
        kind, vocab, enc_p = "onehot", enc.vocab, {"kernel": enc.weight, "bias": enc.bias}
    elif isinstance(enc, nn.PendulumCNN):
        if enc.append_dt:
            raise ValueError("the baseline does not append Δt to the CNN features")
        kind, vocab = "pendulum_cnn", None
        enc_p = {
            "conv1": {"kernel": jnp.transpose(enc.conv1.weight, (2, 3, 1, 0)),
                      "bias": enc.conv1.bias.reshape(-1)},
            "conv2": {"kernel": jnp.transpose(enc.conv2.weight, (2, 3, 1, 0)),
                      "bias": enc.conv2.bias.reshape(-1)},
            "hidden": _dense(enc.hidden), "out": _dense(enc.out),
        }  # fmt: skip
    else:
        kind, vocab, enc_p = "dense", None, _dense(enc.dense)
    head = model.head
    if isinstance(head, nn.RetrievalHead):
        head_kind, dec = (
            "retrieval",
            {"layer1": _dense(head.hidden), "layer2": _dense(head.decoder)},
        )
    elif isinstance(head, nn.GaussianHead):
        head_kind = "gaussian"
        dec = {
            n: _dense(getattr(head, n))
            for n in ("mean_hidden", "mean_out", "var_hidden", "var_out")
        }
    elif isinstance(head, nn.ClassificationHead):
        head_kind, dec = "classification", _dense(head.decoder)
    else:
        head_kind, dec = "regression", _dense(head.decoder)
    if any(s.log_step.shape != (s.P,) for s in (layer.ssm for layer in model.layers)):
        raise ValueError("the baseline has one Δ per state (no scalar_dt)")
    norm = "batch" if isinstance(first.norm, nn.BatchNorm) else "layer"
    spec = Spec(
        n_layers=len(model.layers), norm=norm, prenorm=first.prenorm,
        activation=first.activation, dropout=first.drop.p,
        bn_momentum=getattr(first.norm, "momentum", 0.9), conj_sym=s.conj_sym,
        bidirectional=s.bidirectional, clip_eigs=s.clip_eigs, discretization=s.discretization,
        encoder=kind, vocab=vocab,
        pooling="masked_mean" if head_kind == "retrieval" else model.pooling, head=head_kind,
        irregular=model.timestep_mode == "irregular", gelu_approximate=first.gelu_approximate,
        head_activation=getattr(head, "activation", "relu"),
    )  # fmt: skip
    if state is not None:  # a clone: reading an equinox State marks it as used
        leaves, treedef = jax.tree_util.tree_flatten(state)
        state = jax.tree_util.tree_unflatten(treedef, leaves)
    layers, stats = [], []
    for layer in model.layers:
        q = layer.ssm
        P = q.P
        seq = {"Lambda_re": q.Lambda_re, "Lambda_im": q.Lambda_im, "B": _ri(q.B_re, q.B_im),
               "D": q.D, "log_step": q.log_step}  # fmt: skip
        C = _ri(q.C_re, q.C_im)
        if q.bidirectional:
            seq["C1"], seq["C2"] = C[:, :P], C[:, P:]
        else:
            seq["C"] = C
        p = {"seq": seq, "norm": {"scale": layer.norm.weight, "bias": layer.norm.bias}}
        if layer.out1 is not None:
            p["out1"] = _dense(layer.out1)
        if layer.out2 is not None:
            p["out2"] = _dense(layer.out2)
        layers.append(p)
        if norm == "batch" and state is not None:
            mean, var = state.get(layer.norm.state_index)
            stats.append({"mean": mean, "var": var})
        elif norm == "batch":
            H = q.H
            dtype = q.D.dtype
            stats.append({"mean": jnp.zeros((H,), dtype), "var": jnp.ones((H,), dtype)})
        else:
            stats.append({})
    return spec, {"encoder": enc_p, "layers": layers, "decoder": dec}, stats
