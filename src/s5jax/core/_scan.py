"""Scans for the diagonal linear recurrence x_k = a_k ⊙ x_{k−1} + b_k (§2.2, App. H).

Three ways to compute the same states:
- `"sequential"`: `jax.lax.scan`, one step at a time. Work O(LP), fastest on CPU.
- `"parallel"`: `jax.lax.associative_scan` with the App. H operator
  (a_i, b_i) • (a_j, b_j) = (a_j a_i, a_j b_i + b_j): depth O(log L), for GPU/TPU.
- `"auto"`: sequential on CPU, parallel elsewhere (decided at trace time).

`a` may be time-invariant (P,) (S5's Λ̄; no L×P copy of it is made by the sequential scan)
or per step (L, P) (irregular sampling). Options: `reverse` (x_k = a_k x_{k+1} + b_k),
`initial_state` (the state before the first step processed), `resets` (a boolean per step:
where set, the state restarts, x_k = b_k, as for episodes packed in one sequence).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Inexact

__all__ = ["SCAN_METHODS", "linear_recurrence", "resolve_scan_method"]


def _sequential(a, b, reverse):
    if a.ndim == 1:  # time-invariant: close over a, scan only over b (no L×P copy of a)

        def step(x, b_k):
            x = a * x + b_k
            return x, x

        _, xs = jax.lax.scan(step, jnp.zeros_like(b[0]), b, reverse=reverse)
        return xs

    def step_varying(x, ab):
        a_k, b_k = ab
        x = a_k * x + b_k
        return x, x

    _, xs = jax.lax.scan(step_varying, jnp.zeros_like(b[0]), (a, b), reverse=reverse)
    return xs


def binary_operator(element_i, element_j):
    """The App. H operator (a_i, b_i) • (a_j, b_j) = (a_j a_i, a_j b_i + b_j), i before j."""
    a_i, b_i = element_i
    a_j, b_j = element_j
    return a_j * a_i, a_j * b_i + b_j


def _parallel(a, b, reverse):
    a = jnp.broadcast_to(a, b.shape)
    _, xs = jax.lax.associative_scan(binary_operator, (a, b), reverse=reverse)
    return xs


SCAN_METHODS: dict[str, Callable] = {"sequential": _sequential, "parallel": _parallel}


def resolve_scan_method(method: str) -> str:
    """Map `"auto"` to `"sequential"` on CPU and `"parallel"` on accelerators; validate."""
    if method == "auto":
        return "sequential" if jax.default_backend() == "cpu" else "parallel"
    if method not in SCAN_METHODS:
        raise ValueError(
            f"scan method must be 'auto' or one of {sorted(SCAN_METHODS)}, got {method!r}"
        )
    return method


def linear_recurrence(
    a: Inexact[Array, "*La P"],
    b: Inexact[Array, "L P"],
    *,
    reverse: bool = False,
    initial_state: Inexact[Array, " P"] | None = None,
    resets: Bool[Array, " L"] | None = None,
    method: str = "auto",
) -> tuple[Inexact[Array, "L P"], Inexact[Array, " P"]]:
    """All states of x_k = a_k ⊙ x_{k−1} + b_k, and the final state.

    **Arguments:**
    - `a`: decay, (P,) for every step or (L, P) per step.
    - `b`: inputs, (L, P).
    - `reverse`: run from the last step to the first: x_k = a_k ⊙ x_{k+1} + b_k.
    - `initial_state`: the state before the first processed step (zeros if `None`).
    - `resets`: (L,) booleans; where true the state restarts there: x_k = b_k.
    - `method`: `"auto"`, `"sequential"` or `"parallel"`.

    **Returns:** `(xs, final_state)`: xs of shape (L, P); the final state is the last one
    processed (xs[-1], or xs[0] when `reverse`).
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    _check_recurrence_args(a, b, initial_state, resets)
    method = resolve_scan_method(method)
    if resets is not None:
        keep = jnp.logical_not(jnp.asarray(resets))[:, None]
        a = jnp.where(keep, jnp.broadcast_to(a, b.shape), jnp.zeros(b.shape, a.dtype))
    if initial_state is not None:
        # Fold x_init into the first processed input: x_first = a_first x_init + b_first.
        first = -1 if reverse else 0
        a_first = a[first] if a.ndim == 2 else a
        b = b.at[first].add(a_first * jnp.asarray(initial_state, b.dtype))
    xs = SCAN_METHODS[method](a, b, reverse)
    return xs, xs[0] if reverse else xs[-1]


def _check_recurrence_args(a, b, initial_state, resets) -> None:
    if b.ndim != 2:
        raise ValueError(f"b must have shape (L, P), got {b.shape}")
    L, P = b.shape
    if a.shape not in ((P,), (L, P)):
        raise ValueError(f"a must have shape (P,) = ({P},) or (L, P) = {b.shape}, got {a.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if initial_state is not None and jnp.shape(initial_state) != (P,):
        raise ValueError(
            f"initial_state must have shape (P,) = ({P},), got {jnp.shape(initial_state)}"
        )
    if resets is not None:
        if jnp.shape(resets) != (L,):
            raise ValueError(f"resets must have shape (L,) = ({L},), got {jnp.shape(resets)}")
        if jnp.asarray(resets).dtype != jnp.bool_:
            raise ValueError(f"resets must be boolean, got dtype {jnp.asarray(resets).dtype}")
