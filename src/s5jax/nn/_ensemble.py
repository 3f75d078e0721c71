"""`Ensemble`: K S5 models of one config, trained side by side, whose predictions are averaged.

A deep ensemble (Lakshminarayanan et al., 2017): the members differ only in their initial
parameters and dropout keys; each is trained on its own loss (`make_steps` averages the members'
losses, so each member's gradient is its own) and the ensemble predicts the mean of the
members' probabilities (classification, retrieval) or of their predictions (regression). On a
training set of a few dozen examples a single network's test accuracy moves by several points
with the seed; the average of K members moves much less (measured: `docs/results.md`).

The members are one `S5Model` whose every array has a leading axis of size K (built with
`eqx.filter_vmap`, the Equinox ensemble idiom), so one compiled step trains them all and a
checkpoint stores them as one pytree. BatchNorm statistics are kept per member.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

__all__ = ["ENSEMBLE_HEADS", "Ensemble", "combine_members"]

#: Heads whose members' outputs can be averaged.
ENSEMBLE_HEADS = ("classification", "retrieval", "regression")


def combine_members(kind: str, outputs):
    """The ensemble's output from the members' outputs stacked on a leading axis K.

    Log-probabilities (classification, retrieval): the log of the mean probability,
    `logsumexp(outputs, 0) - log K`. Predictions (regression): their mean.
    """
    if kind in ("classification", "retrieval"):
        return jax.nn.logsumexp(outputs, axis=0) - math.log(outputs.shape[0])
    if kind == "regression":
        return jnp.mean(outputs, axis=0)
    raise ValueError(f"an ensemble averages {ENSEMBLE_HEADS} heads, not {kind!r}")


class Ensemble(eqx.Module):
    """K models trained together; called like `S5Model` (one example, vmap for batches).

    **Fields:**
    - `members`: one `S5Model` whose arrays have a leading member axis of size `size`.
    - `size`: K, the number of members.
    - `kind`: the head (`ENSEMBLE_HEADS`), which says how the outputs are averaged.

    Build one with `build_model` and `model.members = K` (K ≥ 2). The state (BatchNorm
    running statistics) has the same leading member axis.
    """

    members: eqx.Module
    size: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)

    @property
    def timestep_mode(self) -> str:
        """The members' `timestep_mode` (what the `dt` input means)."""
        return self.members.timestep_mode

    @property
    def mask_padding(self) -> bool:
        """The members' `mask_padding` (whether `lengths` mask the layers' padding)."""
        return self.members.mask_padding

    @property
    def pooling(self) -> str:
        """The members' `pooling`."""
        return self.members.pooling

    def each(self, x, state, *, key: PRNGKeyArray | None = None, **kwargs):
        """Every member's `(output, state)` on one example, stacked on a leading axis K.

        Keyword arguments are `S5Model.__call__`'s; `key` is split into one dropout key per
        member.
        """
        if key is None:

            def one(member, member_state):
                return member(x, member_state, key=None, **kwargs)

            return eqx.filter_vmap(one)(self.members, state)

        def keyed(member, member_state, k):
            return member(x, member_state, key=k, **kwargs)

        return eqx.filter_vmap(keyed)(self.members, state, jax.random.split(key, self.size))

    def __call__(self, x, state, *, key: PRNGKeyArray | None = None, **kwargs):
        """The averaged output and the members' new states: `(output, state)`, as
        `S5Model.__call__` (log-probabilities are the log of the mean probability)."""
        outputs, state = self.each(x, state, key=key, **kwargs)
        return combine_members(self.kind, outputs), state

    def check_online(self) -> None:
        """An ensemble runs whole sequences only: always raises a `ValueError` that says why
        (the members' own reason first, e.g. bidirectional layers)."""
        self.members.check_online()
        raise ValueError(
            f"an ensemble (model.members = {self.size}) runs whole sequences only; train with "
            "model.members = 1 for online (step-by-step) use"
        )

    def init_state(self, *args, **kwargs):
        """Not available: see `check_online`."""
        self.check_online()

    def step(self, *args, **kwargs):
        """Not available: see `check_online`."""
        self.check_online()

    def run_online(self, *args, **kwargs):
        """Not available: see `check_online`."""
        self.check_online()
