"""One S5 sequence layer (reference semantics §4): norm, SSM, activation, residual.

    skip = x; prenorm: x = norm(x); x = ssm(x); x = activation(x); x = skip + x;
    postnorm: x = norm(x)

Activations, with `drop` the tied dropout of `TiedDropout` (the authors' names):

- `gelu`:      drop(gelu(y))
- `full_glu`:  g = drop(gelu(y)); drop(W1 g ⊙ σ(W2 g))
- `half_glu1`: g = drop(gelu(y)); drop(g ⊙ σ(W2 g))      (App. G.1's weighted sigmoid gate)
- `half_glu2`: g = drop(gelu(y)); drop(y ⊙ σ(W2 g))      (the value path is the raw SSM output)

GELU is the tanh approximation by default, as in the authors' code.

Precision: under `"bf16"` the residual stream, the activation's output, the gate and the dropout
are bfloat16 (the gate's products with bfloat16 operands and float32 accumulation); GELU and the
sigmoid are computed in float32 (from the SSM's float32 output and the gate product's float32
accumulator) and rounded to bfloat16 once (`_nonlinear`); the norm's statistics and the SSM's
recurrence stay float32 (see `Dense`, `S5SSM`). `"fp32"` is unchanged.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from ..core import _products
from ..core._native import native_materialise
from ..core._ssm import resolve_ssm_method
from ._dense import Dense, check_precision, compute_dtype
from ._discrete import DiscreteSSM
from ._norm import BatchNorm, LayerNorm
from ._ssm import S5SSM

__all__ = ["ACTIVATIONS", "SequenceLayer", "TiedDropout"]

ACTIVATIONS = ("gelu", "full_glu", "half_glu1", "half_glu2")


class TiedDropout(eqx.Module):
    """Dropout with one mask per sequence and channel, shared across time.

    Kept entries are scaled by 1/(1 − p) (flax's `Dropout(broadcast_dims=[0])`).

    **Arguments:** `p`: the probability of dropping a channel.
    """

    p: float = eqx.field(static=True)

    def __call__(
        self, x: Float[Array, "L H"], *, key: PRNGKeyArray | None, inference: bool
    ) -> Float[Array, "L H"]:
        """**Arguments:** `x` (L, H); `key` (may be None at inference or when p = 0);
        `inference` switches dropout off.

        **Returns:** (L, H).
        """
        return self.apply(x, self.mask(x.shape[1], key=key, inference=inference))

    def mask(self, H: int, *, key: PRNGKeyArray | None, inference: bool):
        """The kept channels, bool (1, H), or None where nothing is dropped."""
        if inference or self.p == 0:
            return None
        if key is None:
            raise ValueError("TiedDropout needs a key in training mode (inference=False)")
        return jax.random.bernoulli(key, 1.0 - self.p, (1, H))

    def apply(self, x, keep):
        """x with the channels outside `keep` (from `mask`) zeroed and the rest scaled."""
        if keep is None:
            return x
        scaled = x / jnp.asarray(1.0 - self.p, x.dtype)
        return jnp.where(jnp.broadcast_to(keep, x.shape), scaled, jnp.zeros_like(x))


MATERIALISE_OUTPUT = True
"""Whether a float32 layer's output (and, in the backward pass, its cotangent) is written to
memory through `s5jax.core._native.native_materialise` on the native scan's path: the SSM's
`scan_method` is `"auto"` or `"native"` and resolves to `"native"` (a CPU backend, one device,
the C++ library built; the layer materialises even where `"auto"` then picks the fused path
for a long sequence). Without it XLA recomputes the residual stream inside every fusion that
reads it, work that grows with the square of the depth (see `native_materialise`). Read when
tracing.

Not under `precision = "bf16"`: there the norms' float32 copy of the bfloat16 residual stream
is already stored, and the barrier cost more than it saved (2-core AMD EPYC, 2026-11-28,
alternating processes, 5 steps each: Text's bf16 step 326.9 / 340.9, 349.9 / 355.9, 338.8 /
358.0 and 339.9 / 349.2 ms without / with; Text in float32 568.9 / 545.7 and 552.3 / 521.7)."""


def _materialises(ssm) -> bool:
    """Whether a layer with this SSM materialises its output (`MATERIALISE_OUTPUT`): only on
    the native scan's path, and not when `s5jax.core._products.VMAP_FRIENDLY_GRADIENT` is off
    (forward-mode autodiff, which a custom VJP does not support)."""
    method = getattr(ssm, "scan_method", None)
    if not (MATERIALISE_OUTPUT and _products.VMAP_FRIENDLY_GRADIENT and method is not None):
        return False
    return method in ("auto", "native") and resolve_ssm_method(method) == "native"


def _nonlinear(f, x, dtype, **kwargs):
    """f(x) rounded to `dtype`, computed in float32 when x is narrower (bfloat16). XLA's CPU
    backend computes GELU's tanh and the sigmoid's exp on bfloat16 arrays element by element
    through float32 without vectorising them: on a 2-core AMD EPYC (AVX-512 BF16, 2026-11-28,
    a `/tmp` script) the tanh-approximate GELU of a bfloat16 (50, 784, 96) array took 3.9 ms
    against 1.4 ms through float32, its gradient 8.7 ms against 1.7 ms, the sigmoid 2.2 against
    1.2 ms. Rounding once, after the float32 function, is also the more accurate of the two."""
    if jnp.finfo(x.dtype).bits < 32:
        x = x.astype(jnp.float32)
    return f(x, **kwargs).astype(dtype)


RECOMPUTE_ELEMENTWISE = True
"""Whether a float32 layer's activation recomputes its elementwise intermediates in the backward
pass (`jax.checkpoint` around GELU with its dropout, and around the gate with its dropout)
instead of storing them: the backward pass then reads the activation's inputs (the SSM output y,
the gate's pre-activation z, g), which are stored anyway, and XLA fuses GELU's and the sigmoid's
derivatives into the passes that read them, in place of forward passes that wrote tanh and
sigmoid values for the backward pass to read back. Read when tracing.

Whole float32 training steps, the code before / with it in alternating processes (2-core Intel
Xeon, 2026-12-02, `/tmp` script, medians of 5–7 steps, two pairs each): ListOps 246.8 / 230.6
and 250.5 / 230.3 ms, Image 667.2 / 648.3 and 654.9 / 630.2, sMNIST 309.4 / 294.7 and 298.4 /
294.9, psMNIST 403.0 / 396.7 and 401.9 / 394.5; unchanged: sCIFAR 333.9 / 331.3 and 336.7 /
341.0, Text (`half_glu2`) 776.9 / 779.2 and 786.8 / 789.1, Pendulum 95.8 / 99.2 and 96.2 / 94.8. Not
under `precision = "bf16"`, where psMNIST's step became slower (301.6 / 323.1 and 297.8 /
321.2 ms; Text and Pathfinder unchanged)."""


def _elementwise(f, precision: str):
    """f, whose backward pass recomputes its elementwise intermediates from its inputs
    (`RECOMPUTE_ELEMENTWISE`, float32 layers); f itself otherwise. Same values either way."""
    if not RECOMPUTE_ELEMENTWISE or precision != "fp32":
        return f
    return jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)


def _split(key: PRNGKeyArray | None, n: int):
    return (None,) * n if key is None else tuple(jax.random.split(key, n))


class SequenceLayer(eqx.Module):
    """A residual block around one SSM: norm, SSM, activation, dropout and skip connection.

    **Arguments:**
    - `ssm`: an `S5SSM` or `DiscreteSSM` of width H.
    - `norm`: `"batch"` or `"layer"`.
    - `prenorm`: normalise before the SSM (else after the residual sum).
    - `activation`: one of `ACTIVATIONS`.
    - `dropout`: probability of the tied dropout.
    - `gelu_approximate`: tanh-approximate GELU (the authors') or the exact erf form.
    - `bn_momentum`: running-statistics momentum of BatchNorm.
    - `dtype`: real dtype of the parameters.
    - `precision`: `"fp32"` or `"bf16"` (mixed precision; give the SSM the same policy).
    - `key`: PRNG key (keyword-only) for the gate's dense layers.
    """

    ssm: S5SSM | DiscreteSSM
    norm: BatchNorm | LayerNorm
    out1: Dense | None
    out2: Dense | None
    drop: TiedDropout
    activation: str = eqx.field(static=True)
    prenorm: bool = eqx.field(static=True)
    gelu_approximate: bool = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        ssm: S5SSM | DiscreteSSM,
        *,
        norm: str = "batch",
        prenorm: bool = True,
        activation: str = "half_glu1",
        dropout: float = 0.0,
        gelu_approximate: bool = True,
        bn_momentum: float = 0.9,
        dtype=jnp.float32,
        precision: str = "fp32",
        key: PRNGKeyArray,
    ):
        check_precision(precision)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        H = ssm.H
        if norm == "batch":
            self.norm = BatchNorm(H, momentum=bn_momentum, dtype=dtype, precision=precision)
        elif norm == "layer":
            self.norm = LayerNorm(H, dtype=dtype, precision=precision)
        else:
            raise ValueError(f"norm must be 'batch' or 'layer', got {norm!r}")
        k1, k2 = jax.random.split(key)
        self.ssm = ssm
        dense = dict(dtype=dtype, precision=precision)
        self.out1 = Dense(H, H, **dense, key=k1) if activation == "full_glu" else None
        self.out2 = Dense(H, H, **dense, key=k2) if activation != "gelu" else None
        self.drop = TiedDropout(dropout)
        self.activation, self.prenorm = activation, prenorm
        self.gelu_approximate = gelu_approximate
        self.precision = precision

    def activate(
        self, y: Float[Array, "L H"], *, key: PRNGKeyArray | None = None, inference: bool = True
    ) -> Float[Array, "L H"]:
        """The activation (with its dropouts) applied to the SSM output y (L, H)."""
        dtype = compute_dtype(self.precision) if self.precision != "fp32" else y.dtype
        k1, k2 = _split(key, 2)
        H = y.shape[-1]
        keep1 = self.drop.mask(H, key=k1, inference=inference)
        keep2 = self.drop.mask(H, key=k2, inference=inference)

        def first(y, keep1):
            g = _nonlinear(jax.nn.gelu, y, dtype, approximate=self.gelu_approximate)
            return self.drop.apply(g, keep1)

        g = _elementwise(first, self.precision)(y, keep1)
        if self.activation == "gelu":
            return g
        z = self.out2(g, fp32_output=True)

        def second(y, g, z, h, keep2):
            gate = _nonlinear(jax.nn.sigmoid, z, dtype)
            y = y.astype(dtype)
            if self.activation == "full_glu":
                out = h * gate
            elif self.activation == "half_glu1":
                out = g * gate
            else:
                out = y * gate
            return self.drop.apply(out, keep2)

        h = self.out1(g) if self.activation == "full_glu" else None
        return _elementwise(second, self.precision)(y, g, z, h, keep2)

    def __call__(
        self,
        x: Float[Array, "L H"],
        state: eqx.nn.State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool = False,
        step_rescale: float | Float[Array, ""] = 1.0,
        dt: Float[Array, " L"] | None = None,
        resets: Bool[Array, " L"] | None = None,
        segments: int = 1,
        valid: Bool[Array, " L"] | None = None,
    ) -> tuple[Float[Array, "L H"], eqx.nn.State]:
        """Apply the layer to one sequence (call under `jax.vmap(..., axis_name="batch")`).

        **Arguments:**
        - `x`: (L, H); `state`: the model state (BatchNorm running statistics).
        - `key`: dropout key (may be None at inference or without dropout).
        - `inference`: switch off dropout; BatchNorm uses its running statistics.
        - `step_rescale`, `dt`, `resets`, `segments`: passed to the SSM (see `S5SSM.__call__`).
        - `valid`: the sequence's valid steps (`model.mask_padding`), or None. The SSM reads
          zeros at the other steps (padding), and BatchNorm's training statistics count only
          the valid ones: the outputs at valid steps then do not depend on the padding,
          neither its content nor its length (a backward scan starts at the last valid step).

        **Returns:** `(y, state)` with y (L, H).
        """
        if self.precision != "fp32":  # the residual stream in the compute dtype
            x = x.astype(compute_dtype(self.precision))
        skip = x
        if self.prenorm:
            x, state = self.norm(x, state, inference=inference, valid=valid)
        if valid is not None:
            x = jnp.where(valid[:, None], x, jnp.zeros_like(x))
        x = self.ssm(x, step_rescale=step_rescale, dt=dt, resets=resets, segments=segments)
        x = skip + self.activate(x, key=key, inference=inference)
        if not self.prenorm:
            x, state = self.norm(x, state, inference=inference, valid=valid)
        if self.precision == "fp32" and _materialises(self.ssm):
            x = native_materialise(x)
        return x, state

    def step(
        self,
        x_t: Float[Array, " H"],
        ssm_state,
        state: eqx.nn.State,
        *,
        step_rescale: float | Float[Array, ""] = 1.0,
        dt: float | Float[Array, ""] | None = None,
    ):
        """One step of the layer in inference mode (dropout off, BatchNorm on its running
        statistics), equal to step k of `__call__(..., inference=True)`.

        **Arguments:** `x_t` (H,); `ssm_state`: the SSM's state after step k − 1;
        `state`: the model state (BatchNorm running statistics, read only); `step_rescale`
        and `dt` (this step's Δ multiplier) are passed to `ssm.step`.

        **Returns:** `(ssm_state′, y_t)` with y_t (H,).
        """
        x = x_t[None, :]
        if self.precision != "fp32":
            x = x.astype(compute_dtype(self.precision))
        skip = x
        if self.prenorm:
            x, _ = self.norm(x, state, inference=True)
        ssm_state, y = self.ssm.step(ssm_state, x[0], step_rescale=step_rescale, dt=dt)
        x = skip + self.activate(y[None, :], inference=True)
        if not self.prenorm:
            x, _ = self.norm(x, state, inference=True)
        return ssm_state, x[0]
