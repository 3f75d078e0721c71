"""`python -m s5jax` runs the `s5jax` command."""

import sys

from .cli import main

sys.exit(main())
