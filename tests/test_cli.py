"""The `s5jax` command, called in process: train, eval, list, data prepare and their errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from s5jax.cli import main


def test_train_then_eval_the_synthetic_experiment(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "synthetic",
                "--workdir",
                str(run),
                "--no-progress",
                "--set",
                "train.epochs=1",
            ]
        )
        == 0
    )
    results = json.loads((run / "results.json").read_text())
    assert results["epochs_run"] == 1
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "val", "--checkpoint", "latest"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "val" and 0.0 <= out["accuracy"] <= 1.0
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in epochs if r["kind"] == "epoch"][-1]["val_accuracy"]
    assert out["accuracy"] == pytest.approx(val, abs=1e-6)  # the same model and data


def test_train_on_user_npz(tmp_path, capsys):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 32), ("val", 8), ("test", 8)):
        arrays[f"x_{split}"] = rng.standard_normal((n, 12, 2)).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, 3, n)
    path = tmp_path / "mine.npz"
    np.savez(path, **arrays)
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--data",
            str(path),
            "--workdir",
            str(run),
            "--no-progress",
            "--set",
            "train.epochs=1",
            "--set",
            "data.batch_size=8",
            "--set",
            "model.d_model=8",
            "--set",
            "model.ssm_size=8",
            "--set",
            "model.blocks=2",
        ]
    )
    assert code == 0
    assert json.loads((run / "results.json").read_text())["experiment"] == "mine"


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    assert main(["train", "synthetic", "--set", "train.epoch=3"]) == 2
    assert "epoch" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((2, 3, 1), np.float32))
    assert main(["train", "--data", str(bad)]) == 2
    assert "y_train" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such run directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2  # a folder, but not a run's
    assert "not an s5jax run directory" in capsys.readouterr().err


def test_a_sweep_or_seeds_directory_given_as_a_run_names_one_of_its_runs(tmp_path, capsys):
    """eval/predict/export of a sweep directory point at its selected trial (summary.json's,
    not the first), of a seeds directory at its first seed in numeric order (seed-2, not
    seed-10, which sorts first as text)."""
    sweep, seeds = tmp_path / "sw", tmp_path / "seeds"
    for run in ("trial-000", "trial-001", "trial-002"):
        (sweep / run).mkdir(parents=True)
        (sweep / run / "config.json").write_text("{}")
    (sweep / "summary.json").write_text(json.dumps({"selected": "trial-001"}))
    for run in ("seed-10", "seed-2"):
        (seeds / run).mkdir(parents=True)
        (seeds / run / "config.json").write_text("{}")
    (seeds / "seed-1").mkdir()  # not a run: no config.json
    assert main(["export", str(sweep), "--out", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err.endswith(
        f"{sweep} is a sweep directory; give one of its runs (the selected trial: "
        f"{sweep / 'trial-001'})\n"
    )
    assert not (tmp_path / "e").exists()
    (sweep / "summary.json").unlink()  # interrupted before its summary: the first trial
    assert main(["eval", str(sweep)]) == 2
    assert f"give one of its runs (e.g. {sweep / 'trial-000'})" in capsys.readouterr().err
    assert main(["predict", str(seeds), "--out", str(tmp_path / "p.npz")]) == 2
    assert capsys.readouterr().err.endswith(
        f"{seeds} is a seeds directory; give one of its runs (e.g. {seeds / 'seed-2'})\n"
    )


def test_missing_dataset_says_what_to_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["data", "prepare", "text"]) == 2
    err = capsys.readouterr().err
    assert "aclImdb" in err and str(tmp_path) in err


@pytest.mark.parametrize(
    "name", ["listops", "pathfinder", "pathx", "text", "retrieval", "image", "smnist", "speech35"]
)
def test_missing_data_names_the_flags_that_point_elsewhere(tmp_path, monkeypatch, capsys, name):
    """Each reader's missing-data message names the command-line ways to give a copy elsewhere
    (not only the Python argument), and the generator where there is one."""
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["data", "prepare", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("s5jax data prepare: error: ") and err.count("\n") == 1
    assert "`--source PATH` (`s5jax data prepare`)" in err
    assert "`--set data.root=PATH` (`s5jax train`)" in err
    generates = name in ("listops", "pathfinder", "pathx")
    assert (f"`s5jax data prepare {name} --generate`" in err) == generates
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data", "prepare", "mnist"], "unknown dataset 'mnist': did you mean smnist, psmnist?"),
        (["data", "prepare", "speech"], "unknown dataset 'speech': did you mean speech35?"),
        (["data", "prepare", "synthetic"], "synthetic is generated in memory"),
        (["train", "listops", "--set", "data.dataset=cifar", "--workdir", "W"],
         "data.dataset = 'cifar': did you mean scifar? known datasets: image,"),
    ],
)  # fmt: skip
def test_an_unknown_dataset_name_suggests_the_close_ones(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a == "W" else a for a in argv]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "W").exists()


def test_a_data_root_that_is_a_file_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """`$S5JAX_DATA` naming a file: one line before the pendulum is generated (it failed when
    writing the cache, after the work); an empty `$S5JAX_DATA` is the default `./data`."""
    from s5jax.data import data_root

    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("S5JAX_DATA", str(afile))
    for argv in (["data", "prepare", "pendulum"], ["list"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"$S5JAX_DATA={afile} is a file, not a folder" in err and err.count("\n") == 1
    assert afile.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    monkeypatch.setenv("S5JAX_DATA", "")
    monkeypatch.chdir(tmp_path)
    assert data_root() == Path("data")


def test_list_shows_experiments_and_data_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "listops" in out and "missing" in out and "62.15" in out
    assert "lra_release.gz" in out


def test_help_for_each_command(capsys):
    for command in (
        ["--help"],
        ["train", "--help"],
        ["eval", "--help"],
        ["list", "--help"],
        ["data", "prepare", "--help"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(command)
        assert exc.value.code == 0
    assert "usage: s5jax" in capsys.readouterr().out


def test_quick_runs_a_tenth_of_the_epochs(tmp_path):
    run = tmp_path / "run"
    # synthetic has 2 epochs: a tenth rounds down to 0, and at least one epoch runs.
    assert main(["train", "synthetic", "--quick", "--workdir", str(run), "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 1


def test_cpu_devices_warns_when_jax_has_already_started(tmp_path, capsys, monkeypatch):
    import jax

    jax.devices()  # start the backend here, whatever ran before in this worker
    monkeypatch.setenv("XLA_FLAGS", "")
    code = main(
        [
            "train",
            "synthetic",
            "--cpu-devices",
            "2",
            "--workdir",
            str(tmp_path / "r"),
            "--no-progress",
            "--set",
            "train.epochs=1",
        ]
    )
    assert code == 0
    assert "--cpu-devices 2 had no effect" in capsys.readouterr().err


def test_log_lines_print_once_when_a_library_configured_the_root_logger(capsys):
    """absl's logging (used by orbax) calls `logging.basicConfig()`: the root handler it adds
    must not print each `s5jax` line a second time (it did: "INFO:s5jax.data:...")."""
    import logging
    import sys

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)  # what logging.basicConfig() adds
    root.addHandler(handler)
    try:
        assert main(["-v", "config", "synthetic"]) == 0
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("glibc allocator tuning") == 1
    assert logging.getLogger("s5jax").propagate  # restored for library users (caplog, apps)


def test_main_restores_the_data_progress_factory(tmp_path):
    """`main` installs the trainer's bar for dataset preparation only while it runs: a
    library user calling `main` in-process gets log lines again afterwards."""
    from s5jax.data._common import progress_factory

    before = progress_factory()
    assert main(["config", "pendulum"]) == 0
    assert progress_factory() is before
