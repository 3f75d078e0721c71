"""Runs a user can trust (issue 17): one run owns its directory, every failure is one line and
an exit status, and bad inputs are refused before anything is written to the run directory.

Each test states the user-facing outcome: the exit status of `s5jax`, a one-line message on
stderr (a traceback only with --debug), and what the run directory holds afterwards.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.nn import S5SSM
from s5jax.nn._ssm import _check_inputs
from s5jax.train import _engine

TINY = [
    "--no-progress",
    "--set",
    "train.epochs=1",
    "--set",
    "data.n_train=16",
    "--set",
    "data.n_eval=8",
    "--set",
    "model.n_layers=1",
]


def _train(workdir, *extra):
    return main(["train", "synthetic", "--workdir", str(workdir), *TINY, *extra])


def _error_line(capsys) -> str:
    """stderr's one error line (and that it is the only line and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("s5jax train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A complete one-epoch run; tests copy it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert _train(run) == 0
    return run


def _copy(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


def _records(run):
    return (run / "metrics.jsonl").read_text().splitlines()


def _epochs(run):
    return [json.loads(r) for r in _records(run) if '"kind": "epoch"' in r]


# --- one run per directory -------------------------------------------------------------------

_HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from s5jax.train._rundir import RunDirLock
    lock = RunDirLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_run_directory_locked_by_another_process_is_refused_naming_its_pid(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert _train(run) == 75
        line = _error_line(capsys)
        assert f"in use by process {holder.pid}" in line and str(run / ".lock") in line
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing else written
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The OS released the killed holder's lock: the stale .lock file blocks nothing.
    assert _train(run) == 0


def test_a_new_run_into_a_non_empty_run_directory_is_refused(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    before = _records(run)
    assert _train(run) == 2
    line = _error_line(capsys)
    assert "already holds a run" in line and "--resume" in line and "--overwrite" in line
    assert _records(run) == before


def test_overwrite_replaces_the_run_without_mixing(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    (run / "old-marker").write_text("old run")
    assert _train(run, "--overwrite", "--set", "train.seed=7") == 0
    assert not (run / "old-marker").exists()
    assert '"seed": 7' in (run / "config.json").read_text()
    epochs = [r for r in _records(run) if '"kind": "epoch"' in r]
    assert len(epochs) == 1  # the new run's records only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary sibling left


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    assert _train(folder, "--overwrite") == 2
    assert "not an s5jax run directory" in _error_line(capsys)
    assert (folder / "thesis.tex").read_text() == "precious"


@pytest.mark.parametrize("flags", [(), ("--overwrite",), ("--resume-or-start",), ("--resume",)])
@pytest.mark.parametrize(
    "files, what",
    [
        (("sweep.json", "trial-000/config.json"), "is a sweep directory (sweep.json)"),
        (("summary.json", "seed-0/config.json"), "is a seeds directory (seed-N)"),
        (("thesis.tex",), "is not empty and not an s5jax run directory (no config.json)"),
    ],
)
def test_no_mode_trains_into_a_folder_that_is_not_a_run(tmp_path, capsys, flags, files, what):
    """A sweep's, a seeds' or any other non-empty folder is not a run directory: a new run,
    --overwrite and --resume refuse it with one line, and nothing in it changes; so does
    --resume-or-start a sweep's or seeds' folder (another folder it starts a run in: a
    scheduler's log may be there first)."""
    folder = tmp_path / "mine"
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("precious")
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    if flags == ("--resume-or-start",) and files == ("thesis.tex",):  # the table's exception
        assert _train(folder, *flags) == 0
        assert (folder / "config.json").is_file() and (folder / "thesis.tex").read_text() == (
            "precious"
        )
        return
    assert _train(folder, *flags) == 2
    line = _error_line(capsys)
    if flags == ("--resume",):
        assert "--resume: no checkpoint in" in line and "--resume-or-start" in line
    else:
        assert f"{folder} {what}: it holds " in line
        assert line.endswith("choose another --workdir")
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    assert all((folder / name).read_text() == "precious" for name in files)


def test_resume_without_a_checkpoint_is_an_error_and_creates_nothing(tmp_path, capsys):
    run = tmp_path / "typo"
    assert _train(run, "--resume") == 2
    line = _error_line(capsys)
    assert "no checkpoint" in line and "--resume-or-start" in line
    assert not run.exists()


def test_resume_after_a_kill_during_the_first_save_is_the_no_checkpoint_error(tmp_path, capsys):
    # orbax writes a step into a temporary folder and renames it when done: killed before
    # that, the run has no checkpoint, only the temporary (which the next save cleans up).
    run = tmp_path / "run"
    temporary = run / "checkpoints" / "latest" / "16.orbax-checkpoint-tmp-1764990000000000"
    (temporary / "state").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    assert _train(run, "--resume") == 2
    line = _error_line(capsys)
    assert "--resume: no checkpoint in" in line and "--resume-or-start" in line
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


def test_resume_or_start_starts_then_reports_a_complete_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--resume-or-start") == 0
    before = _records(run)
    capsys.readouterr()
    assert _train(run, "--resume-or-start") == 0
    captured = capsys.readouterr()
    assert "holds a complete run (1 of 1 epochs)" in captured.err
    assert "test accuracy at best val" in captured.err  # its summary table
    assert _records(run) == before  # nothing trained again


def test_resume_or_start_continues_a_killed_run(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    assert _train(run, "--resume-or-start", "--set", "train.epochs=2") == 0
    assert "resumed from epoch 1" in capsys.readouterr().err
    epochs = [r for r in _records(run) if '"kind": "epoch"' in r]
    assert len(epochs) == 2


@pytest.mark.parametrize(
    "change",
    ["model.d_model=8", "optim.weight_decay=0.3", "train.seed=5", "model.dropout=0.3"],
)
def test_resume_with_a_changed_config_leaves_config_json_untouched(
    finished, tmp_path, capsys, change
):
    """A setting that changes what is trained, whether or not the checkpoint's shapes still
    fit (weight decay, seed), is refused naming the key and both values; nothing changes."""
    run = _copy(finished, tmp_path)
    files = ("config.json", "run_info.json", "metrics.jsonl", "results.json")
    before = {name: (run / name).read_bytes() for name in files}
    assert _train(run, "--resume", "--set", "train.epochs=2", "--set", change) == 2
    line = _error_line(capsys)
    key = change.split("=")[0]
    assert f"holds a run of another config ({key} (" in line and " here)" in line, line
    assert f"{run / 'config.json'} --workdir {run} --resume" in line
    assert {name: (run / name).read_bytes() for name in files} == before


def test_resume_may_extend_the_epochs_and_change_what_is_only_logged(finished, tmp_path):
    run = _copy(finished, tmp_path)
    free = ["train.epochs=2", "train.log_every=1", "data.eval_batch_size=4"]
    assert _train(run, "--resume", *(a for kv in free for a in ("--set", kv))) == 0
    assert [r["epoch"] for r in _epochs(run)] == [1, 2]
    # and the run's own config.json, as the refusal suggests, resumes it
    assert main(["train", str(run / "config.json"), "--workdir", str(run), "--resume",
                 "--no-progress", "--set", "train.epochs=3"]) == 0  # fmt: skip
    assert [r["epoch"] for r in _epochs(run)] == [1, 2, 3]


# --- exit statuses -----------------------------------------------------------------------------


def _nan_inputs(monkeypatch):
    original = _engine._host_batch

    def nan_batch(batch, head):
        out = original(batch, head)
        return {**out, "x": np.full_like(out["x"], np.nan)}

    monkeypatch.setattr(_engine, "_host_batch", nan_batch)


def test_divergence_in_epoch_1_exits_3_and_claims_no_checkpoint(tmp_path, capsys, monkeypatch):
    _nan_inputs(monkeypatch)
    assert _train(tmp_path / "run") == 3
    line = _error_line(capsys)
    assert "at step 1 (epoch 1)" in line and "no checkpoint was written" in line
    assert "kept in" not in line


def test_check_workdir_follows_the_documented_table(tmp_path):
    """`s5jax.train._rundir`'s table: each kind of folder under each mode. ("resume" in a
    folder without a checkpoint is the table's "start again in it": the trainer restores
    only where a checkpoint is.)"""
    from s5jax.train._rundir import RunDirError, check_workdir

    def folder(name, *files):
        path = tmp_path / name
        for f in files:
            (path / f).parent.mkdir(parents=True, exist_ok=True)
            (path / f).write_text("x")
        return path

    kinds = {
        "absent": tmp_path / "absent",
        "empty": folder("empty", ".lock"),  # the lock file alone is not an earlier run
        "checkpoint": folder("ckpt", "config.json", "checkpoints/latest/12/state"),
        "no checkpoint": folder("nockpt", "config.json", "metrics.jsonl"),
        "not a run": folder("notes", "notes.txt"),
        "sweep": folder("sweep", "sweep.json", "trial-000/config.json"),
        "seeds": folder("seeds", "summary.json", "seed-0/config.json"),
    }
    modes = [dict(resume=False, overwrite=False), dict(resume=False, overwrite=True),
             dict(resume=True, overwrite=False), dict(resume="auto", overwrite=False)]  # fmt: skip
    want = {  # new run, --overwrite, --resume, --resume-or-start (None: refused)
        "absent": ["new", "new", None, "new"],
        "empty": ["new", "new", None, "new"],
        "checkpoint": [None, "overwrite", "resume", "resume"],
        "no checkpoint": [None, "overwrite", None, "resume"],
        "not a run": [None, None, None, "resume"],
        "sweep": [None, None, None, None],
        "seeds": [None, None, None, None],
    }
    for kind, path in kinds.items():
        for flags, expected in zip(modes, want[kind], strict=True):
            if expected is None:
                with pytest.raises(RunDirError):
                    check_workdir(path, **flags)
            else:
                assert check_workdir(path, **flags) == expected, (kind, flags)
    with pytest.raises(RunDirError, match="give one"):
        check_workdir(kinds["checkpoint"], resume=True, overwrite=True)


def test_ctrl_c_exits_130_with_the_resume_command(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_engine, "_epochs", interrupted)
    run = tmp_path / "run"
    assert _train(run, "--resume-or-start") == 130
    line = _error_line(capsys)
    command = ["s5jax", "train", "synthetic", "--workdir", str(run), *TINY]
    # stopped before its first checkpoint: --resume would be refused, --resume-or-start
    # starts it again in the same folder
    assert line.endswith(f"interrupted; resume with: {' '.join(command)} --resume-or-start")
    # a run with a checkpoint resumes with --resume
    finished_run = tmp_path / "done"
    monkeypatch.undo()
    assert _train(finished_run) == 0
    monkeypatch.setattr(_engine, "_epochs", interrupted)
    capsys.readouterr()
    argv = ["train", "synthetic", "--workdir", str(finished_run), *TINY, "--set", "train.epochs=2"]
    assert main([*argv, "--resume"]) == 130
    expected = " ".join(["s5jax", *argv, "--resume"])
    assert _error_line(capsys).endswith(f"interrupted; resume with: {expected}")
    # --overwrite is dropped from the command (it would start the run over); here the new run
    # had replaced the old one and stopped before its first checkpoint
    assert main([*argv, "--overwrite"]) == 130
    expected = " ".join(["s5jax", *argv, "--resume-or-start"])
    assert _error_line(capsys).endswith(f"interrupted; resume with: {expected}")
    # --seeds resumes each seed itself (--resume is refused with it)
    argv = ["train", "synthetic", "--seeds", "0-1", "--workdir", str(tmp_path / "s"), *TINY]
    assert main(argv) == 130
    assert _error_line(capsys).endswith(f"interrupted; resume with: {' '.join(['s5jax', *argv])}")


def test_sigterm_stops_like_ctrl_c_with_143_and_the_run_resumes(tmp_path, capsys):
    """A scheduler's SIGTERM (preemption, time limit) mid-training: exit 143, one line ending in
    the resume command and no traceback (a save in progress finishes first), no temporary file
    left; the printed command's run then continues from its last checkpoint."""
    run = tmp_path / "run"
    sets = [a for kv in ("data.n_train=16", "data.n_eval=8", "model.n_layers=1")
            for a in ("--set", kv)]  # fmt: skip
    argv = ["train", "synthetic", "--workdir", str(run), "--no-progress", *sets]
    proc = subprocess.Popen(
        [sys.executable, "-m", "s5jax", *argv, "--set", "train.epochs=100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not list(run.glob("checkpoints/latest/*/s5jax.json")):  # a complete checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    lines = [line for line in err.splitlines() if line.startswith("s5jax train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "terminated (SIGTERM); resume with: s5jax train synthetic" in lines[0]
    assert lines[0].endswith("--set train.epochs=100000 --resume")
    assert [p for p in run.rglob("*") if p.name.endswith(".tmp")] == []
    reached = _epochs(run)[-1]["epoch"]
    assert main([*argv, "--set", f"train.epochs={reached + 1}", "--resume"]) == 0
    assert "resumed from epoch" in capsys.readouterr().err
    assert [r["epoch"] for r in _epochs(run)] == list(range(1, reached + 2))


@pytest.mark.parametrize("case", ["file", "file/sub", "read-only parent"])
def test_unwritable_workdirs_exit_74(tmp_path, capsys, case):
    if case == "read-only parent" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    (tmp_path / "file").write_text("x")
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    workdir = {"file": "file", "file/sub": "file/sub", "read-only parent": "ro/run"}[case]
    try:
        assert _train(tmp_path / workdir) == 74
    finally:
        parent.chmod(0o700)
    line = _error_line(capsys)
    assert str(tmp_path) in line and "permissions" in line


def test_debug_prints_the_traceback(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["--debug", "train", "synthetic", "--workdir", str(tmp_path / "file")]) == 74
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "NotADirectoryError" in err
    assert err.strip().splitlines()[-1].startswith("s5jax train: error:")


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for line in ("2    usage", "3    training diverged", "74   I/O", "75   the run", "130  inter",
                 "143  terminated (SIGTERM"):  # fmt: skip
        assert line in out


# --- input bounds: refused before the run directory exists -----------------------------------


def _npz(tmp_path, x_train, **extra):
    rng = np.random.default_rng(0)
    arrays = {"x_train": x_train, "y_train": rng.integers(0, 2, len(x_train))}
    for split in ("val", "test"):
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x_train[:2], arrays["y_train"][:2]
    path = tmp_path / "mine.npz"
    np.savez(path, **arrays, **extra)
    return path


@pytest.mark.parametrize(
    ("x", "extra", "message"),
    [
        (np.zeros((4, 0, 2), np.float32), {}, "L = 0 steps"),
        (np.zeros((4, 5, 0), np.float32), {}, "D = 0 features"),
        (np.array([[0, 1, 2_000_000_000]] * 4), {}, "--set model.max_vocab_size=2000000001"),
        (np.zeros((4, 3, 1), np.float32), {"n_classes": 2_000_000_000}, "model.max_classes"),
    ],
    ids=["L=0", "D=0", "token id 2e9", "n_classes 2e9"],
)
def test_own_data_out_of_bounds_is_refused_before_the_workdir_exists(
    tmp_path, capsys, x, extra, message
):
    run = tmp_path / "run"
    path = _npz(tmp_path, x, **extra)
    args = ["--workdir", str(run), "--no-progress", "--set", "data.batch_size=2"]
    assert main(["train", "--data", str(path), *args]) == 2
    assert message in _error_line(capsys)
    assert not run.exists()


def test_cpu_devices_0_is_a_usage_error(tmp_path, capsys):
    assert _train(tmp_path / "run", "--cpu-devices", "0") == 2
    assert "--cpu-devices must be at least 1" in _error_line(capsys)


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_eval_step_rescale_must_be_finite_and_positive(finished, capsys, value):
    assert main(["eval", str(finished), "--step-rescale", value]) == 2
    err = capsys.readouterr().err
    assert "s5jax eval: error: --step-rescale must be a finite number > 0" in err


def test_s5ssm_refuses_a_bad_step_rescale_and_integer_inputs():
    ssm = S5SSM(4, ssm_size=4, J=1, key=jax.random.PRNGKey(0))
    u = jnp.ones((5, 4))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="step_rescale must be finite and > 0"):
            ssm(u, step_rescale=bad)
        with pytest.raises(ValueError, match="step_rescale must be finite and > 0"):
            ssm.step(ssm.init_state(), u[0], step_rescale=bad)
    # Under the tests' jaxtyping checks the annotation refuses int32 first; without them
    # (a user's run) the layer's own check does, with the fix in the message.
    with pytest.raises(TypeError):
        ssm(jnp.ones((5, 4), jnp.int32))
    with pytest.raises(TypeError, match=r"int32; S5SSM takes real float inputs"):
        _check_inputs(jnp.ones(4, jnp.int32), "u_k", 1.0)
    with pytest.raises(ValueError, match="step_rescale must be finite and > 0"):
        _check_inputs(jnp.ones(4), "u_k", 0)  # a plain int, as a user may pass it
    # A traced step_rescale is not checked (it has no value yet) and still works.
    y = jax.jit(lambda r: ssm(u, step_rescale=r))(2.0)
    np.testing.assert_allclose(y, ssm(u, step_rescale=2.0), rtol=1e-5, atol=1e-6)
