"""`s5jax train --seeds` and `s5jax sweep`: real tiny runs of the synthetic experiment, their
summaries read back against each run's own results.json, resumption, the trial scheduler on
a fake device list, and the SPACE.toml errors."""

import io
import json
import statistics
import threading
import time

import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import ConfigError, load_experiment
from s5jax.train._rundir import RunDirLock
from s5jax.train._sweep import (
    SweepSpace,
    device_slots,
    parse_seeds,
    read_space,
    run_seeds,
    run_trials,
)

# 2 steps per epoch on 16 examples of length 16: each run is mostly its compilation.
TINY = [
    "data.n_train=16",
    "data.n_eval=8",
    "data.seq_len=16",
    "model.d_model=8",
    "model.ssm_size=4",
    "model.blocks=1",
    "model.n_layers=1",
]


def _sets(*overrides):
    return [a for o in (*TINY, *overrides) for a in ("--set", o)]


def _files(folder):
    """Every file under `folder` with its modification time and size."""
    return {
        p.relative_to(folder): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_parse_seeds():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds("0-2,9,1") == [0, 1, 2, 9]
    assert parse_seeds("5,0-3,2,9") == [5, 0, 1, 2, 3, 9]  # the order given, repeats dropped
    assert parse_seeds("10-99999,0-20") == [*range(10, 100_000), *range(10)]
    # A typo's range is refused before it is built (10^9 seeds would fill the memory).
    with pytest.raises(ValueError, match=r"the range '0-1000000000' holds 1,000,000,001 seeds"):
        parse_seeds("0-1000000000")
    with pytest.raises(ValueError, match=r"100,001 seeds or more, more than the 100,000"):
        parse_seeds("0-99999,100000")
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_seeds_summary_rerun_and_interrupted_seed(tmp_path, capsys):
    work = tmp_path / "seeds"
    config = load_experiment("synthetic", TINY)

    class CtrlCAfterEpoch1OfSeed1:
        """Ctrl-C while seed 1 prints its first epoch (its epoch-1 checkpoint is saved)."""

        text = ""

        def write(self, s):
            self.text += s
            if s.startswith("epoch 1:") and "seed-1" in self.text:
                raise KeyboardInterrupt

        def flush(self):
            pass

    with pytest.raises(KeyboardInterrupt):
        run_seeds(config, [0, 1], work, progress=False, stream=CtrlCAfterEpoch1OfSeed1())
    partial = json.loads((work / "summary.json").read_text())  # written on the way out
    assert [r["seed"] for r in partial["per_seed"]] == [0] and partial["n"] == 1
    assert not (work / "seed-1" / "results.json").exists()
    seed0 = _files(work / "seed-0")

    # The same seeds again (from the command line): seed 0 is read, not retrained (its
    # files untouched); seed 1 resumes from its epoch-1 checkpoint.
    args = ["train", "synthetic", "--workdir", str(work), "--no-progress", *_sets()]
    assert main([*args, "--seeds", "0-1"]) == 0
    captured = capsys.readouterr()
    assert "seed-0: finished earlier" in captured.err
    assert "resumed from epoch 1" in captured.err
    assert _files(work / "seed-0") == seed0
    assert main(["eval", str(work)]) == 2  # a seeds directory: the error names one of its runs
    assert capsys.readouterr().err.endswith(
        f"{work} is a seeds directory; give one of its runs (e.g. {work / 'seed-0'})\n"
    )
    epochs = [
        json.loads(line)["epoch"]
        for line in (work / "seed-1" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "epoch"
    ]
    assert epochs == [1, 2]

    summary = json.loads((work / "summary.json").read_text())
    per_seed = []
    for s in (0, 1):
        results = json.loads((work / f"seed-{s}" / "results.json").read_text())
        assert json.loads((work / f"seed-{s}" / "config.json").read_text())["train"]["seed"] == s
        row = summary["per_seed"][s]
        assert (row["seed"], row["status"]) == (s, "done")
        assert row["test"] == results["test_at_best_val"]
        assert row["best_val"] == results["best_val"]
        per_seed.append(results["test_at_best_val"])
    assert summary["n"] == 2 and summary["not_finished"] == []
    assert summary["mean"] == pytest.approx(statistics.fmean(per_seed))
    # the sample standard deviation of two values: |a - b| / sqrt(2)
    assert summary["std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2**0.5)
    assert "ours (mean ± sample std)" in (work / "summary.md").read_text()
    assert "ours (mean ± sample std)" in captured.out
    # the constant baseline (one dataset): every seed's, once, in the summary's unit
    assert summary["baseline"] == results["baseline"] and summary["unit"] == "1"
    row = f"| a constant: {results['baseline']['what']} | {results['baseline']['value']:.4g} |"
    assert row in (work / "summary.md").read_text()
    # The seeds differ: other initialisations and data orders.
    m0 = (work / "seed-0" / "metrics.jsonl").read_text()
    assert m0 != (work / "seed-1" / "metrics.jsonl").read_text()

    # A third run, with seed 2's folder held by another process: seeds 0 and 1 are read
    # (nothing changes in their folders), seed 2 is listed as busy, not averaged in, and the
    # command exits 75 (EX_TEMPFAIL).
    before = _files(work / "seed-0") | _files(work / "seed-1")
    lock = RunDirLock(work / "seed-2").acquire()
    try:
        assert main([*args, "--seeds", "0-2"]) == 75
    finally:
        lock.release()
    captured = capsys.readouterr()
    assert captured.err.count("finished earlier") == 2
    assert _files(work / "seed-0") | _files(work / "seed-1") == before
    summary = json.loads((work / "summary.json").read_text())
    assert summary["n"] == 2 and summary["mean"] == pytest.approx(statistics.fmean(per_seed))
    assert [(f["seed"], f["status"]) for f in summary["not_finished"]] == [(2, "busy")]
    assert "seed 2 (busy)" in (work / "summary.md").read_text()

    # A seed folder of another config is refused before anything trains.
    assert main([*args, "--seeds", "0", "--set", "optim.ssm_lr=0.01"]) == 2
    assert "optim.ssm_lr" in capsys.readouterr().err
    assert main([*args, "--seeds", "0", "--set", "train.seed=3"]) == 2
    assert "train.seed" in capsys.readouterr().err


def test_seeds_run_to_fewer_epochs_are_extended_when_more_are_asked(tmp_path):
    # A seed folder whose results.json says 1 epoch, asked for 2: not "finished earlier" but
    # resumed from its checkpoint and trained on; the summary has the 2-epoch figures.
    work = tmp_path / "seeds"
    run_seeds(load_experiment("synthetic", [*TINY, "train.epochs=1"]), [0], work, progress=False)
    first = json.loads((work / "seed-0" / "results.json").read_text())
    assert first["epochs_run"] == 1
    log = io.StringIO()
    summary = run_seeds(
        load_experiment("synthetic", [*TINY, "train.epochs=2"]), [0], work, progress=False,
        stream=log,
    )  # fmt: skip
    results = json.loads((work / "seed-0" / "results.json").read_text())
    assert results["epochs_run"] == 2
    assert "finished earlier" not in log.getvalue() and "resumed from epoch 1" in log.getvalue()
    (row,) = summary["per_seed"]
    assert row["epochs_run"] == 2 and row["test"] == results["test_at_best_val"]


def test_grid_expands_in_order():
    space = SweepSpace(
        base="synthetic", grid={"optim.ssm_lr": [1e-3, 1e-2], "model.d_model": [8, 16, 32]}
    )
    trials = space.trials()
    assert len(trials) == 6
    assert trials[0] == {"optim.ssm_lr": 1e-3, "model.d_model": 8}
    assert trials[1] == {"optim.ssm_lr": 1e-3, "model.d_model": 16}
    assert trials[5] == {"optim.ssm_lr": 1e-2, "model.d_model": 32}
    sampled = SweepSpace(grid=space.grid, samples=3, seed=1).trials()
    assert len(sampled) == 3 and all(t in trials for t in sampled)
    assert sampled == SweepSpace(grid=space.grid, samples=3, seed=1).trials()
    rand = SweepSpace(random={"optim.ssm_lr": {"log_uniform": [1e-4, 1e-2]},
                              "model.n_layers": {"int_uniform": [1, 3]},
                              "model.d_model": [8, 16]}, samples=20, seed=0).trials()  # fmt: skip
    assert len(rand) == 20
    assert all(1e-4 <= t["optim.ssm_lr"] <= 1e-2 and t["model.n_layers"] in (1, 2, 3)
               and t["model.d_model"] in (8, 16) for t in rand)  # fmt: skip


def test_grid_and_random_together(tmp_path, capsys):
    """[grid] and [random] in one space: every grid point with `samples` draws of the random
    keys, in grid order; the sweep trains them and its table and plot show every key."""
    space = tmp_path / "space.toml"
    fixed = [*TINY, "train.epochs=1"]
    space.write_text(
        f'base = "synthetic"\nset = {json.dumps(fixed)}\nsamples = 2\nseed = 4\n'
        "[grid]\nmodel.prenorm = [true, false]\n"
        "[random]\noptim.ssm_lr = { log_uniform = [1e-4, 1e-2] }\n"
    )
    trials = read_space(space).trials()
    assert [t["model.prenorm"] for t in trials] == [True, True, False, False]
    lrs = [t["optim.ssm_lr"] for t in trials]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 4
    assert read_space(space).trials() == trials  # the seed fixes the draws
    sweepdir = tmp_path / "sw"
    assert main(["sweep", str(space), "--workdir", str(sweepdir), "--no-progress"]) == 0
    for i, want in enumerate(trials):
        config = json.loads((sweepdir / f"trial-00{i}" / "config.json").read_text())
        assert config["model"]["prenorm"] == want["model.prenorm"]
        assert config["optim"]["ssm_lr"] == want["optim.ssm_lr"]
    header = (sweepdir / "summary.md").read_text().splitlines()[2]
    assert header.startswith("| trial | model.prenorm | optim.ssm_lr | best val_accuracy")
    assert (sweepdir / "sweep.png").stat().st_size > 0


def test_random_draws_follow_their_ranges():
    """log_uniform is uniform in log (a decade each side of the middle gets the same share),
    uniform in value, int_uniform includes both ends and a list choice takes each item."""
    space = {
        "optim.ssm_lr": {"log_uniform": [1e-4, 1e-2]},
        "optim.lr": {"uniform": [0.0, 1.0]},
        "model.n_layers": {"int_uniform": [1, 3]},
        "model.d_model": [8, 16],
    }
    trials = SweepSpace(random=space, samples=2000, seed=3).trials()
    logs = np.log10([t["optim.ssm_lr"] for t in trials])
    # under log_uniform half the draws lie below 1e-3; drawn linearly, about 9 %
    assert abs(np.mean(logs < -3) - 0.5) < 0.05 and logs.min() >= -4 and logs.max() <= -2
    lr = np.array([t["optim.lr"] for t in trials])
    assert abs(np.mean(lr < 0.5) - 0.5) < 0.05 and lr.min() >= 0 and lr.max() <= 1
    counts = np.bincount([t["model.n_layers"] for t in trials], minlength=4)
    assert counts[0] == 0 and all(abs(c / 2000 - 1 / 3) < 0.05 for c in counts[1:])
    assert abs(np.mean([t["model.d_model"] == 8 for t in trials]) - 0.5) < 0.05


def test_sweep_selects_by_val_and_reports_only_its_test(tmp_path, capsys):
    # A user's .npz, named relative to the space file; its data-chosen defaults are
    # recorded in each trial's run_info.json, as `s5jax train --data` does.
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 16), ("val", 8), ("test", 8)):
        arrays[f"x_{split}"] = rng.standard_normal((n, 16, 2)).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, 3, n)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "mine.npz", **arrays)
    fixed = [*TINY[3:], "train.epochs=1", "data.batch_size=8"]
    space = tmp_path / "space.toml"
    space.write_text(
        f'data = "data/mine.npz"\nset = {json.dumps(fixed)}\n[grid]\noptim.ssm_lr = [0.001, 0.05]\n'
    )
    sweepdir = tmp_path / "sw"
    assert main(["sweep", str(space), "--workdir", str(sweepdir), "--no-progress"]) == 0
    recorded = json.loads((sweepdir / "sweep.json").read_text())
    assert [t["dir"] for t in recorded["trials"]] == ["trial-000", "trial-001"]
    assert recorded["trials"][1]["overrides"][-1] == "optim.ssm_lr=0.05"
    results = [json.loads((sweepdir / t / "results.json").read_text())
               for t in ("trial-000", "trial-001")]  # fmt: skip
    assert (
        json.loads((sweepdir / "trial-001" / "config.json").read_text())["optim"]["ssm_lr"] == 0.05
    )
    info = json.loads((sweepdir / "trial-000" / "run_info.json").read_text())
    assert info["defaults"]["lines"]  # what was chosen from the data, and why
    summary = json.loads((sweepdir / "summary.json").read_text())
    vals = [r["best_val"] for r in results]
    best = max(range(2), key=lambda i: (vals[i], -i))  # accuracy: higher; the first on a tie
    assert summary["selected"] == f"trial-00{best}"
    assert summary["test_accuracy_of_selected"] == results[best]["test_at_best_val"]
    assert [r["best_val"] for r in summary["trials"]] == vals
    assert all("test" not in k for r in summary["trials"] for k in r)
    table = (sweepdir / "summary.md").read_text()
    assert "(selected)" in table and table.count("test_accuracy") == 1
    # 8 val examples: the defaults chose train.select = "last", and the summary says so
    assert [r["select"] for r in results] == ["last", "last"]
    assert summary["test_reported_at"] == "last epoch" and "at its last epoch:" in table
    assert (sweepdir / "sweep.png").stat().st_size > 0
    # Rerun: nothing retrained.
    before = _files(sweepdir / "trial-000") | _files(sweepdir / "trial-001")
    capsys.readouterr()
    assert main(["sweep", str(space), "--workdir", str(sweepdir), "--no-progress"]) == 0
    assert capsys.readouterr().err.count("finished earlier") == 2
    assert _files(sweepdir / "trial-000") | _files(sweepdir / "trial-001") == before
    # The sweep directory given where a run is expected: the error names the selected trial.
    assert main(["predict", str(sweepdir), "--out", str(tmp_path / "p.npz")]) == 2
    err = capsys.readouterr().err
    assert err == (f"s5jax predict: error: {sweepdir / 'config.json'} not found: {sweepdir} is "
                   f"a sweep directory; give one of its runs (the selected trial: "
                   f"{sweepdir / summary['selected']})\n")  # fmt: skip
    # Selection by val loss instead (SPACE.toml `metric = "val_loss"`): the lowest val loss
    # of each trial's epochs, read from its metrics.jsonl.
    from s5jax.train._sweep import _best_val_loss, sweep_summary

    losses = [
        min(
            json.loads(line)["val_loss"]
            for line in (sweepdir / t / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "epoch"
        )
        for t in ("trial-000", "trial-001")
    ]
    records = [
        {"status": "done", "results": r, "val_loss": _best_val_loss(sweepdir / t["dir"])}
        for r, t in zip(results, recorded["trials"], strict=True)
    ]
    by_loss = sweep_summary(read_space(space), recorded["trials"], records, "accuracy", "val_loss")
    assert [r["best_val"] for r in by_loss["trials"]] == losses
    assert by_loss["selected"] == f"trial-00{losses.index(min(losses))}"
    assert by_loss["selection"] == "best val_loss (lower is better)"
    # Another space in the same folder is refused.
    space.write_text(space.read_text().replace("0.05", "0.02"))
    assert main(["sweep", str(space), "--workdir", str(sweepdir)]) == 2
    assert "another space" in capsys.readouterr().err


def test_selection_skips_unfinished_and_diverged_trials(tmp_path):
    """Only finished trials with a finite best val take part: a failed trial's partial
    figure, a diverged (NaN) one and a trial not run are listed but never selected; by
    val loss, each trial's lowest finite epoch figure (written by the trainer's logger)."""
    from s5jax.train._logging import MetricsLogger
    from s5jax.train._sweep import _best_val_loss, sweep_summary

    space = SweepSpace(base="synthetic", grid={"optim.ssm_lr": [1e-4, 1e-3, 1e-2, 1e-1]})
    trials = [{"dir": f"trial-00{i}", "values": v} for i, v in enumerate(space.trials())]
    epochs = {  # val loss per epoch of each trial
        "trial-000": [float("nan"), float("nan")],
        "trial-001": [0.9, 0.4, float("nan"), 0.6],
        "trial-002": [0.2, 0.05],
    }
    for name, losses in epochs.items():
        with MetricsLogger(tmp_path / name, tensorboard=False) as log:
            for epoch, loss in enumerate(losses, 1):
                log.log_epoch(10 * epoch, epoch, val_loss=loss, val_accuracy=0.5)
    assert _best_val_loss(tmp_path / "trial-001") == (0.4, 2)
    assert _best_val_loss(tmp_path / "trial-000") == (None, None)
    assert _best_val_loss(tmp_path / "trial-003") == (None, None)  # no metrics.jsonl

    def record(status, best_val, test):
        return {"status": status, "results": {"best_val": best_val, "best_epoch": 2,
                                              "test_at_best_val": test}}  # fmt: skip

    records = [record("done", float("nan"), 9.0), record("done", 0.5, 1.5),
               record("failed", 0.1, 0.2), {"status": "not run"}]  # fmt: skip
    for r, t in zip(records, trials, strict=True):
        r["val_loss"] = _best_val_loss(tmp_path / t["dir"])
    by_mse = sweep_summary(space, trials, records, "mse")
    assert by_mse["selected"] == "trial-001" and by_mse["test_mse_of_selected"] == 1.5
    assert by_mse["not_finished"] == ["trial-002", "trial-003"]
    by_loss = sweep_summary(space, trials, records, "mse", "val_loss")
    assert [r["best_val"] for r in by_loss["trials"]] == [None, 0.4, 0.05, None]
    assert by_loss["selected"] == "trial-001"  # trial-002's 0.05 is a failed run's


def test_trials_spread_over_a_fake_device_list():
    lock = threading.Lock()
    busy: dict[str, int] = {}
    seen, peak = [], [0]

    def launch(task, device):
        with lock:
            assert device not in busy  # one trial per device at a time
            busy[device] = task
            peak[0] = max(peak[0], len(busy))
        time.sleep(0.02)
        with lock:
            del busy[device]
            seen.append((task, device))
        return task * 10

    assert run_trials(list(range(7)), ["0", "1", "2"], launch) == [t * 10 for t in range(7)]
    assert sorted(t for t, _ in seen) == list(range(7))
    assert peak[0] == 3 and {d for _, d in seen} == {"0", "1", "2"}

    def failing(task, device):
        if task == 1:
            raise RuntimeError("trial 1 broke")
        return task

    with pytest.raises(RuntimeError, match="trial 1"):
        run_trials([0, 1, 2], ["0"], failing)


def test_device_slots():
    assert device_slots("0,1,3") == ["0", "1", "3"]
    assert device_slots("cpu") == []
    assert device_slots(None, {"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
    assert device_slots(None, {"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError, match="--devices"):
        device_slots("0,,1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('base = "synthetic"\n[grid]\noptim.ssm_rate = [1]\n', "optim.ssm_rate"),
        ('base = "synthetic"\n[grid]\noptim.lr = [1e-3]\n',
         "[grid] optim.lr: optim.lr is derived, not set: it is optim.lr_factor * optim.ssm_lr"),
        ('base = "synthetic"\n[grid]\nssm_lr = [1]\n', "ssm_lr: expected section.key"),
        ('base = "synthetic"\n[grid]\noptim.ssm_lr = []\n', "optim.ssm_lr: the list"),
        ('base = "synthetic"\n[grid]\noptim.ssm_lr = { log_uniform = [1e-4, 1e-2] }\n',
         "ranges belong in [random]"),
        ('base = "synthetic"\nsamples = 4\n[random]\noptim.ssm_lr = { log_uniform = [0, 1] }\n',
         "optim.ssm_lr: log_uniform needs low > 0"),
        ('base = "synthetic"\nsamples = 4\n[random]\noptim.ssm_lr = { uniform = [2, 1] }\n',
         "optim.ssm_lr: uniform needs low < high"),
        ('base = "synthetic"\nsamples = 4\n[random]\noptim.ssm_lr = { normal = [0, 1] }\n',
         "optim.ssm_lr: expected a list"),
        ('base = "synthetic"\n[random]\noptim.ssm_lr = [1e-3]\n', "needs samples"),
        ('base = "synthetic"\ntrials = 3\n[grid]\noptim.ssm_lr = [1e-3]\n', "unknown key 'trials'"),
        ('[grid]\noptim.ssm_lr = [1e-3]\n', "give either base"),
        ('base = "synthetic"\n', "[grid], [random] or both"),
        ('base = "synthetic"\nsamples = 2\n[grid]\noptim.ssm_lr = [1e-3]\n[random]\n'
         'optim.ssm_lr = [2e-3]\n', "[random] optim.ssm_lr: also in [grid]"),
        ('base = "synthetic"\n[grid]\nmodel.d_model = [8]\n[random]\noptim.ssm_lr = [2e-3]\n',
         "needs samples = N (how many draws of [random] at every [grid] point)"),
        ('base = "synthetic"\nmetric = "val_acc"\n[grid]\noptim.ssm_lr = [1e-3]\n',
         "metric = 'val_acc': expected one of val_accuracy, val_mse, val_loss"),
        ('base = "synthetic"\n[grid]\noptim.ssm_lr = [1e-3, 2e-3, 0.001]\n',
         "[grid] optim.ssm_lr: 0.001 is listed twice"),
        ('base = "synthetic"\nsamples = 5\n[grid]\noptim.ssm_lr = [1e-3, 2e-3]\n'
         'model.d_model = [8, 16]\n',
         "samples = 5 but the grid has only 4 points; give at most 4"),
    ],
)  # fmt: skip
def test_space_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_space(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_sweep_value_errors_name_the_trial_key(tmp_path, capsys):
    # a value the config refuses: caught for every trial before any folder is made
    code = main(["sweep", "synthetic", "--set", "model.d_model=8,-1",
                 "--workdir", str(tmp_path / "sw")])  # fmt: skip
    assert code == 2
    assert "d_model" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()
    code = main(["sweep", "synthetic", "--set", "optim.ssm_lr=1e-3,2e-3", "--metric", "val_mse",
                 "--workdir", str(tmp_path / "sw")])  # fmt: skip
    assert code == 2
    assert "use val_accuracy or val_loss" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()
    # a value listed twice would train two identical trials
    code = main(["sweep", "synthetic", "--set", "model.d_model=8,16,8",
                 "--workdir", str(tmp_path / "sw")])  # fmt: skip
    assert code == 2
    assert "'model.d_model=8,16,8': 8 is listed twice" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()
    # more samples than grid points would silently run the whole grid
    code = main(["sweep", "synthetic", "--set", "model.d_model=8,16", "--set",
                 "optim.ssm_lr=1e-3,2e-3,4e-3", "--sample", "7",
                 "--workdir", str(tmp_path / "sw")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--sample 7 but the grid has only 6 points; give at most 6" in err
    assert err.count("\n") == 1 and not (tmp_path / "sw").exists()


def test_a_folder_that_is_not_a_sweep_or_seeds_keeps_its_files(tmp_path, capsys):
    """A sweep into a non-empty folder without sweep.json, or --seeds into a folder whose
    summary.md / summary.json are someone else's, is refused before anything is written
    (they would have been replaced by the command's own)."""
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes")
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    code = main(["sweep", "synthetic", "--set", "model.d_model=8,16", "--workdir", str(mine)])
    assert code == 2
    err = capsys.readouterr().err
    assert "is not empty (summary.md) and holds no sweep (sweep.json)" in err
    seeds = ["train", "synthetic", "--seeds", "0-1", "--workdir", str(mine)]
    assert main([*seeds, *_sets()]) == 2
    assert "summary.md that is not the summary of a folder of seeds" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before


def test_sweep_flags_reach_the_space_and_the_runner(tmp_path, monkeypatch, capsys):
    # The command line's half of `s5jax sweep`: each flag lands in the space or the runner's
    # arguments (the runner itself is exercised end to end above).
    import s5jax.train._sweep as sweeps

    calls = []

    def record(space, workdir, *, devices, progress, stream):
        calls.append((space, workdir, devices, progress))
        return {"not_finished": []}

    monkeypatch.setattr(sweeps, "run_sweep", record)
    monkeypatch.setattr(sweeps, "sweep_table", lambda summary: "")
    data = tmp_path / "mine.npz"
    sets = ["--set", "optim.ssm_lr=1e-3,2e-3,4e-3", "--set", "model.d_model=8,16"]
    assert main(["sweep", "synthetic", *sets, "--workdir", str(tmp_path / "a")]) == 0
    assert main(["sweep", "--data", str(data), *sets, "--sample", "3", "--seed", "5",
                 "--metric", "val_loss", "--devices", "0,2", "--no-progress",
                 "--workdir", str(tmp_path / "b")]) == 0  # fmt: skip
    (plain, work_a, dev_a, prog_a), (flagged, work_b, dev_b, prog_b) = calls
    assert plain.base == "synthetic" and plain.data is None and flagged.data == str(data)
    grid = {"optim.ssm_lr": [1e-3, 2e-3, 4e-3], "model.d_model": [8, 16]}
    assert plain.grid == flagged.grid == grid
    assert len(plain.trials()) == 6  # the whole grid
    assert (flagged.samples, flagged.seed, flagged.metric) == (3, 5, "val_loss")
    drawn = flagged.trials()
    assert len(drawn) == 3 and drawn == SweepSpace(grid=grid, samples=3, seed=5).trials()
    assert plain.metric is None
    assert (work_a, work_b) == (tmp_path / "a", tmp_path / "b")
    assert (dev_b, prog_a, prog_b) == (["0", "2"], True, False)
    assert dev_a == device_slots(None)  # no --devices: CUDA_VISIBLE_DEVICES / nvidia-smi
