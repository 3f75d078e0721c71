"""Equinox modules for S5: the SSM layer, the deep models built from it, and parameter roles
for the optimiser groups.

Modules handle one example; batch them with `jax.vmap` (with `axis_name="batch"` for models
with BatchNorm).
"""

from ._dense import Dense
from ._discrete import DiscreteSSM
from ._encoders import DenseEncoder, EmbeddingEncoder, PendulumCNN
from ._ensemble import ENSEMBLE_HEADS, Ensemble, combine_members
from ._heads import (
    POOLINGS,
    ClassificationHead,
    GaussianHead,
    RegressionHead,
    RetrievalHead,
    accuracy,
    gaussian_nll,
    gaussian_variance,
    mse,
    nll_loss,
    pool,
)
from ._layers import ACTIVATIONS, SequenceLayer, TiedDropout
from ._model import S5Model, StreamState, build_model, count_parameters, parameter_breakdown
from ._norm import BatchNorm, LayerNorm
from ._ssm import S5SSM
from ._tags import DEFAULT_GROUPS, ROLES, param_field, parameter_roles

__all__ = [
    "ACTIVATIONS",
    "DEFAULT_GROUPS",
    "ENSEMBLE_HEADS",
    "POOLINGS",
    "ROLES",
    "S5SSM",
    "BatchNorm",
    "ClassificationHead",
    "Dense",
    "DenseEncoder",
    "DiscreteSSM",
    "EmbeddingEncoder",
    "Ensemble",
    "GaussianHead",
    "LayerNorm",
    "PendulumCNN",
    "RegressionHead",
    "RetrievalHead",
    "S5Model",
    "SequenceLayer",
    "StreamState",
    "TiedDropout",
    "accuracy",
    "build_model",
    "combine_members",
    "count_parameters",
    "gaussian_nll",
    "gaussian_variance",
    "mse",
    "nll_loss",
    "param_field",
    "parameter_breakdown",
    "parameter_roles",
    "pool",
]
