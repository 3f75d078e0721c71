"""Kill a small training with SIGKILL at random moments, resume it each time, and check that it
ends exactly where an uninterrupted run ends.

    .venv/bin/python scripts/fault_soak.py [--kills 20] [--seed 0] [--epochs 4] [--keep DIR]

1. A reference run of the `synthetic` experiment (`--epochs` epochs, `log_every` 1) trains
   uninterrupted into `REF/`; its wall time T is measured.
2. The same command with `--resume-or-start` is started in `SOAK/` and killed with SIGKILL,
   `--kills` times (seeded): four times in five once its `metrics.jsonl` reaches a random
   record of the reference's and up to a second later (inside a step, an evaluation, a
   checkpoint write or a metrics write), else after a random 0.5-8 s (start-up,
   compilation). A start that finished before its kill counts as finished; the script says
   how many kills landed.
3. The soak run is then completed without interruption.
4. Compared with the reference: every `metrics.jsonl` record (timing fields removed) must
   be equal, `results.json` (timing fields removed) equal, and `s5jax eval` on the `latest`
   and `best` checkpoints must print identical JSON (same parameters, bit for bit, since the
   evaluation is deterministic). Also: no temporary files left in the run directory.

Prints one line per kill (delay, what the run had written by then) and the verdict; exits 1
on any difference. Each start pays JAX's start-up and compilation (~5-15 s on 2 cores), so 20
kills take several minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

S5JAX = [sys.executable, "-c", "import sys; from s5jax.cli import main; sys.exit(main())"]
TIMING = ("seconds", "per_second", "wall", "time", "elapsed")


def _command(workdir: Path, epochs: int, extra: list[str]) -> list[str]:
    return [
        *S5JAX, "train", "synthetic", "--workdir", str(workdir),
        "--set", f"train.epochs={epochs}", "--no-progress", *extra,
    ]  # fmt: skip


def _strip(record):
    if isinstance(record, dict):
        return {
            k: _strip(v) for k, v in record.items() if not any(t in k for t in TIMING)
        }  # fmt: skip
    if isinstance(record, list):
        return [_strip(v) for v in record]
    return record


def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [_strip(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def _eval(run: Path, which: str) -> str:
    done = subprocess.run(
        [*S5JAX, "eval", str(run), "--checkpoint", which],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def _records(run: Path) -> int:
    try:
        return len((run / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def _written(run: Path) -> str:
    """What the run directory holds now: epochs in metrics.jsonl, checkpoints."""
    epochs = 0
    if (run / "metrics.jsonl").exists():
        epochs = sum('"epoch"' in line for line in (run / "metrics.jsonl").read_text().splitlines())
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("*/*")) if run.exists() else []
    return f"{epochs} metric records, checkpoints {ckpts or '-'}"


def _leftovers(run: Path) -> list[str]:
    names = ("tmp", ".partial", "orbax-checkpoint-tmp")
    return [str(p.relative_to(run)) for p in run.rglob("*") if any(n in p.name for n in names)]


def soak(
    kills: int, seed: int, epochs: int, root: Path, fractions: list[float] | None = None
) -> bool:
    """Run the soak in `root`; `fractions` (of the reference's metrics records: kill 0.3 s after
    the run reaches that record) replace the random kills when given. True when the soak run
    ends equal to the reference."""
    env = {**os.environ, "S5JAX_DATA": str(root / "data")}
    ref, run = root / "ref", root / "soak"
    start = time.perf_counter()
    subprocess.run(_command(ref, epochs, []), env=env, check=True, capture_output=True)
    total = time.perf_counter() - start
    print(f"reference run: {total:.1f} s")
    rng = random.Random(seed)
    n_records = len((ref / "metrics.jsonl").read_text().splitlines())
    # Each kill waits for a random point of the run's progress (its metrics.jsonl reaching a
    # random record, then up to a second more: inside a step, an evaluation, a checkpoint or
    # a metrics write), or, one time in five, for a random moment of start-up/compilation.
    # Progress, not wall time, so a slower or faster host still kills mid-run.
    plans = [
        ("startup", rng.uniform(0.5, 8.0)) if rng.random() < 0.2
        else ("record", (rng.randint(1, n_records), rng.uniform(0.0, 1.0)))
        for _ in range(kills)
    ]  # fmt: skip
    if fractions is not None:
        plans = [("record", (max(1, round(f * n_records)), 0.3)) for f in fractions]
    landed = 0
    for k, (kind, plan) in enumerate(plans):
        proc = subprocess.Popen(
            _command(run, epochs, ["--resume-or-start"]), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        if kind == "startup":
            deadline, when = time.monotonic() + plan, f"after {plan:5.1f} s"
        else:
            record, extra = plan
            when = f"at record {record:>3} + {extra:.2f} s"
            deadline = None
            while proc.poll() is None and _records(run) < record:
                time.sleep(0.05)
            deadline = time.monotonic() + extra
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            outcome = "killed"
            landed += 1
        else:
            outcome = f"finished (exit {proc.returncode})"
        proc.stderr.close()
        print(f"kill {k + 1:>2}/{len(plans)}: {when}, {outcome}; {_written(run)}")
    print(f"{landed} of {len(plans)} starts were killed before they finished")
    done = subprocess.run(
        _command(run, epochs, ["--resume-or-start"]), env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        print(f"the final resume failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return False
    checks = {
        "metrics.jsonl": _metrics(ref) == _metrics(run),
        "results.json": _strip(json.loads((ref / "results.json").read_text()))
        == _strip(json.loads((run / "results.json").read_text())),
        "eval latest": _eval(ref, "latest") == _eval(run, "latest"),
        "eval best": _eval(ref, "best") == _eval(run, "best"),
        "no temporary files": not _leftovers(run),
    }
    for name, ok in checks.items():
        print(f"{name:>20}: {'equal' if ok else 'DIFFERENT'}")
    if _leftovers(run):
        print(f"left behind: {_leftovers(run)}")
    if not checks["metrics.jsonl"]:
        a, b = _metrics(ref), _metrics(run)
        print(f"reference {len(a)} records, soak {len(b)}")
        for x, y in zip(a, b, strict=False):
            if x != y:
                print(f"first difference:\n  {x}\n  {y}")
                break
    return all(checks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="s5jax-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        ok = soak(args.kills, args.seed, args.epochs, root)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"fault soak: {args.kills} kills, {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
