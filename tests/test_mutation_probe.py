"""`scripts/mutation_probe.py` stays runnable: every planted bug still names a fragment that is
in its file exactly once and tests that exist. A fragment the code has moved away from makes
its mutation "stale", and the probe then silently checks less (four were, 2026-12-06)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _probe():
    spec = importlib.util.spec_from_file_location(
        "mutation_probe", ROOT / "scripts" / "mutation_probe.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_mutation_applies_to_the_current_code_and_names_existing_tests():
    probe = _probe()
    names = [m.name for m in probe.MUTATIONS]
    assert len(names) == len(set(names))
    stale = {m.name: probe._status(m) for m in probe.MUTATIONS if probe._status(m) is not None}
    assert not stale, f"update these fragments to the code as it is now: {stale}"
    for m in probe.MUTATIONS:
        assert m.original != m.replacement, m.name
        for test in m.tests:
            path, _, node = test.partition("::")
            assert (ROOT / path).is_file(), f"{m.name}: {path} does not exist"
            if node:
                assert f"def {node}(" in (ROOT / path).read_text(), f"{m.name}: no test {node}"
