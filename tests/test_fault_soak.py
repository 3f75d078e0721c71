"""Fault injection (`scripts/fault_soak.py`): a small training is killed with SIGKILL twice,
0.3 s after its metrics reach 75 % and then 95 % of the reference's records, resumed each
time with `--resume-or-start`, and must end
with the metrics, results and parameters (evaluated bit for bit) of an uninterrupted run.
The script runs more kills at random moments for the issue notes (`--kills 20`)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fault_soak.py"


@pytest.mark.slow
def test_killed_and_resumed_run_ends_like_an_uninterrupted_one(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("fault_soak", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    assert soak.soak(kills=2, seed=0, epochs=3, root=tmp_path, fractions=[0.75, 0.95])
    out = capsys.readouterr().out
    kills = [line for line in out.splitlines() if line.startswith("kill ")]
    assert len(kills) == 2 and "2 of 2 starts were killed" in out
    assert "DIFFERENT" not in out
