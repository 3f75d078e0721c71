"""Parameter roles, attached where a parameter is defined, from which optimiser groups are built.

A field declared with `param_field(role)` carries its role in the dataclass metadata. The
trainer reads the roles with `parameter_roles` and maps them to the paper's optimiser groups
(reference semantics §5): by default Λ, B̃ and log Δ form the "ssm" group (Adam at the SSM
learning rate, no weight decay) and everything else the "regular" group (AdamW).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax

__all__ = ["DEFAULT_GROUPS", "ROLES", "param_field", "parameter_roles"]

_KEY = "s5jax_role"

#: Roles of the S5 SSM's parameters; any other array has the role "regular".
ROLES = ("Lambda", "B", "C", "D", "log_step", "regular")

#: The optimiser group of each role in the paper's "standard" partition.
DEFAULT_GROUPS = {
    "Lambda": "ssm",
    "B": "ssm",
    "log_step": "ssm",
    "C": "regular",
    "D": "regular",
    "regular": "regular",
}


def param_field(role: str, **kwargs):
    """A module field whose arrays have the optimiser role `role` (one of `ROLES`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    metadata = dict(kwargs.pop("metadata", {}), **{_KEY: role})
    return eqx.field(metadata=metadata, **kwargs)


def parameter_roles(model):
    """A pytree like `eqx.filter(model, eqx.is_inexact_array)` holding each array's role.

    The role of an array is that of the innermost tagged field on its path from the root;
    untagged arrays are `"regular"`.
    """
    params = eqx.filter(model, eqx.is_inexact_array)

    def role_of(path, _leaf):
        obj, role = model, None
        for key in path:
            if isinstance(key, jax.tree_util.GetAttrKey):
                field = _find_field(obj, key.name)
                if field is not None and _KEY in field.metadata:
                    role = field.metadata[_KEY]
                obj = getattr(obj, key.name)
            elif isinstance(key, jax.tree_util.SequenceKey):
                obj = obj[key.idx]
            elif isinstance(key, jax.tree_util.DictKey):
                obj = obj[key.key]
        return role or "regular"

    return jax.tree_util.tree_map_with_path(role_of, params)


def _find_field(obj, name):
    if not dataclasses.is_dataclass(obj):
        return None
    for field in dataclasses.fields(obj):
        if field.name == name:
            return field
    return None
