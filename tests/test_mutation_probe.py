"""`scripts/mutation_probe.py` stays runnable: every planted bug still names a fragment that is
in its file exactly once and tests that exist. A fragment the code has moved away from makes
its mutation "stale", and the probe then silently checks less (four were, 2026-12-06). `--merge`
updates the results file in place."""

import importlib.util
import json
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


def test_merge_keeps_the_other_records_and_replaces_those_run_again(tmp_path):
    probe = _probe()
    path = tmp_path / "results.json"

    def rec(name, result):
        return {"name": name, "result": result, "detail": "", "seconds": 1.0}

    assert probe._write(path, "cmd a,b,c", [rec("a", "caught"), rec("b", "survived"),
                                            rec("c", "stale")]) == (1, 2)  # fmt: skip
    merged = probe._write(path, "cmd b,d", [rec("b", "caught"), rec("d", "caught")], merge=True)
    assert merged == (3, 3)
    saved = json.loads(path.read_text())
    assert [(r["name"], r["result"]) for r in saved["records"]] == [
        ("a", "caught"), ("b", "caught"), ("c", "stale"), ("d", "caught")]  # fmt: skip
    assert saved["command"] == "scripts/mutation_probe.py --only a,b,c,d"
    assert (saved["caught"], saved["ran"], saved["score"]) == (3, 3, 1.0)
    path.write_text(json.dumps({**saved, "notes": ["b survived once"]}))
    probe._write(path, "cmd a", [rec("a", "caught")], merge=True)
    assert json.loads(path.read_text())["notes"] == ["b survived once"]  # other keys stay
    probe._write(path, "cmd e", [rec("e", "survived")])  # without merge: this run only
    assert [r["name"] for r in json.loads(path.read_text())["records"]] == ["e"]
