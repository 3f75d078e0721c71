"""s5jax: S5 (Simplified State Space Layers for Sequence Modeling) in JAX.

Layers (an arrow points at what a layer may import)::

    core  <-  nn  <-  train  <-  cli
    data  <-  train

- `s5jax.core`: the paper's math as pure functions on one sequence (jax and numpy only).
- `s5jax.nn`: Equinox modules holding real parameters.
- `s5jax.data`: dataset generators, readers and cached preparation (numpy, Pillow).

Library messages go to the standard `logging` logger `"s5jax"` (and its children); the library
adds no handler of its own, so nothing is printed unless the application configures logging.
The `s5jax` command prints them as `s5jax: message` on stderr (`-q` / `-v` set the level).
"""

import logging as _logging
from importlib import metadata as _metadata

from ._malloc import configure_cpu_malloc

try:  # the version lives in pyproject.toml only; the installed metadata carries it
    __version__ = _metadata.version("s5jax")
except _metadata.PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
    __version__ = "0+unknown"

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = ["configure_cpu_malloc"]
