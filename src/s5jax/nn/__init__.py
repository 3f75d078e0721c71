"""Equinox modules for S5: the SSM layer, and parameter roles for the optimiser groups.

Modules handle one example; batch them with `jax.vmap`.
"""

from ._ssm import S5SSM
from ._tags import DEFAULT_GROUPS, ROLES, param_field, parameter_roles

__all__ = ["DEFAULT_GROUPS", "ROLES", "S5SSM", "param_field", "parameter_roles"]
