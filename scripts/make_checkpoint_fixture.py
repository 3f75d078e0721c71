"""Write tests/fixtures/checkpoint_v2: a tiny checkpoint in the current format (format 2).

`tests/test_checkpoint.py::test_the_committed_format_2_fixture_restores_to_its_values` restores
it into `tree()` and compares values, so a change of the on-disk format is noticed. Run from the
repository root: `.venv/bin/python scripts/make_checkpoint_fixture.py`.
"""

import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "checkpoint_v2"
META = {"epoch": 3, "step": 12, "best_val": 0.5}


def tree():
    """A fixed pytree of an Equinox module, dicts, tuples and several dtypes; no randomness."""
    linear = eqx.nn.Linear(2, 3, key=jax.random.PRNGKey(0))
    linear = eqx.tree_at(
        lambda m: (m.weight, m.bias),
        linear,
        (jnp.arange(6.0, dtype=jnp.float32).reshape(3, 2), jnp.array([0.5, -1.0, 2.0])),
    )
    return {
        "model": {"linear": linear, "Lambda_re": -jnp.arange(1.0, 3.0), "Lambda_im": jnp.ones(2)},
        "opt_state": (jnp.array(7, dtype=jnp.int32), {"mu": jnp.full((2,), 0.25)}),
        "key": jnp.asarray(np.array([1, 2], dtype=np.uint32)),
    }


def main() -> None:
    from s5jax.train._checkpoint import Checkpoints

    shutil.rmtree(OUT, ignore_errors=True)
    ckpt = Checkpoints(OUT)
    ckpt.save("latest", 12, tree(), META)
    ckpt.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
