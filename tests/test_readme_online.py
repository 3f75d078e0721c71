"""The README's "Use a trained model" commands, run as written (with a small own-data file in
the README's format): train, predict offline and streamed, export, and load the export with
jax and numpy only."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from s5jax.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use a trained model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n(.*?)```", section, re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def test_readme_use_a_trained_model_commands_run(tmp_path, monkeypatch):
    commands = _commands()
    assert any(c.startswith("s5jax predict") for c in commands)
    assert any(c.startswith("s5jax export") for c in commands)
    rng = np.random.default_rng(0)
    sizes = {"train": 64, "val": 16, "test": 16}
    arrays = {f"x_{s}": rng.normal(size=(n, 12, 3)).astype(np.float32) for s, n in sizes.items()}
    arrays |= {f"y_{s}": rng.integers(0, 4, size=n) for s, n in sizes.items()}
    np.savez(tmp_path / "mydata.npz", **arrays)
    np.savez(tmp_path / "new.npz", x=rng.normal(size=(10, 12, 3)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == "s5jax":
            if argv[1] == "train":  # the README's model, smaller, so the test stays fast
                argv += ["--set", "model.d_model=16", "--set", "model.ssm_size=8",
                         "--set", "model.n_layers=2", "--no-progress"]  # fmt: skip
            assert main(argv[1:]) == 0, command
        else:
            assert argv[0] == "python", command
            argv[1] = str(ROOT / argv[1])
            done = subprocess.run(
                [sys.executable, *argv[1:]], capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr[-2000:]
    with np.load(tmp_path / "pred.npz") as a, np.load(tmp_path / "pred-stream.npz") as b:
        assert a["log_probs"].shape == (10, 4)
        np.testing.assert_allclose(a["log_probs"], b["log_probs"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(a["pred"], np.argmax(a["log_probs"], axis=1))
