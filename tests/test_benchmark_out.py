"""The benchmarks' `--out NAME` is checked before anything runs: a folder in it is refused with
argparse's one-line error (exit 2) and nothing is written, instead of a traceback when the
results are written at the end of a long run."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
from _common import out_name  # noqa: E402


@pytest.mark.parametrize("bad", ["/tmp/x", "sub/x", "..", ".hidden", ""])
def test_out_name_refuses_paths(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="bare name"):
        out_name(bad)


def test_out_name_keeps_names():
    assert out_name("train-step-merged") == "train-step-merged"


@pytest.mark.parametrize(
    "script",
    ["layer.py", "train_step.py", "train_step_memory.py", "matmul_precision.py", "products.py",
     "planar_scan.py", "flop_bound.py"],
)
def test_scripts_refuse_a_folder_before_running(script, tmp_path):
    target = tmp_path / "x"
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--out", str(target)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: argument --out: a bare name"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())
