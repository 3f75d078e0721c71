"""s5jax: S5 (Simplified State Space Layers for Sequence Modeling) in JAX.

Layers (an arrow points at what a layer may import)::

    core  <-  nn  <-  train  <-  cli
    data  <-  train

- `s5jax.core`: the paper's math as pure functions on one sequence (jax and numpy only).
- `s5jax.nn`: Equinox modules holding real parameters.
- `s5jax.data`: dataset generators, readers and cached preparation (numpy, Pillow).
"""

__version__ = "0.1.0"

from ._malloc import configure_cpu_malloc

__all__ = ["configure_cpu_malloc"]
