"""The dependency rule of ARCHITECTURE.md: core <- nn <- train <- cli; data <- train.

Checked on the source text (every import statement of every module), so that it holds
whatever is imported lazily inside functions.
"""

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "s5jax"

# What each layer may import, besides the standard library.
ALLOWED = {
    "core": {"jax", "jaxtyping", "numpy", "s5jax.core"},
    "nn": {"jax", "jaxtyping", "numpy", "equinox", "s5jax.core", "s5jax.nn"},
    "data": {"numpy", "PIL", "s5jax.data"},
    "config": {"tomllib", "tomli", "s5jax.config"},
    "train": {
        "jax",
        "jaxtyping",
        "numpy",
        "equinox",
        "optax",
        "orbax",
        "PIL",
        "tensorboardX",
        "matplotlib",
        "tqdm",
        "s5jax.core",
        "s5jax.nn",
        "s5jax.config",
        "s5jax.data",
        "s5jax.train",
    },
}
STDLIB_OK = set(sys.stdlib_module_names)
# s5jax._atomic (atomic file writes), s5jax._signals (signals held back during a save) and
# s5jax._cache (the per-host cache folder) are standard library only: every layer may use them.
SHARED = ("s5jax._atomic", "s5jax._signals", "s5jax._cache")


def _imports(path: Path, package: str):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                if node.module:
                    yield ".".join([*parts, node.module])
                else:  # `from .. import core` imports the submodule s5jax.core
                    for alias in node.names:
                        yield ".".join([*parts, alias.name])
            else:
                yield node.module


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    folder = SRC / layer
    if not folder.exists():
        pytest.skip(f"s5jax.{layer} does not exist yet")
    bad = []
    for path in folder.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        package = ".".join(rel.parts[:-1])
        for name in _imports(path, package):
            top = name.split(".")[0]
            if top in STDLIB_OK:
                continue
            if name.startswith("s5jax.") or name == "s5jax":
                ok = any(
                    name == a or name.startswith(a + ".")
                    for a in (*ALLOWED[layer], *SHARED)
                    if a.startswith("s5jax")
                )
            else:
                ok = top in ALLOWED[layer]
            if not ok:
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", SHARED)
def test_the_shared_modules_import_only_the_standard_library(module):
    path = SRC / (module.split(".", 1)[1] + ".py")
    names = list(_imports(path, "s5jax"))
    assert names and all(n.split(".")[0] in STDLIB_OK or n == "__future__" for n in names), names
