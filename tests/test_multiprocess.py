"""Training on several processes (JAX's multi-controller runtime), started on one machine.

Two `s5jax train --multihost` processes with one CPU device each (coordinator on 127.0.0.1, a
free port) train the synthetic experiment and must give the losses of one process with two CPU
devices; the first epoch's checkpoint, written by both, is resumed by both; each process reads
half the rows the single process reads; a process whose coordinator never answers stops within
--coordinator-timeout with one line and exit status 69.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from s5jax.cli import EXIT_COORDINATOR, main
from s5jax.data._batches import iterate_batches
from s5jax.data._prepared import Split
from s5jax.train import read_metrics
from s5jax.train._sharding import DataParallel

# A smaller synthetic run (one layer, 16 steps long): what costs time here is compilation.
# A constant learning rate, so that a 1-epoch run resumed to 2 epochs follows the 2-epoch run.
_SETTINGS = [
    "model.n_layers=1",
    "data.seq_len=16",
    "data.n_train=32",
    "data.n_eval=12",  # eval batch 8: the second batch is padded (4 masked rows)
    "data.batch_size=8",
    "optim.schedule=constant",
    "train.log_every=1",
    "train.save_best=false",  # one orbax save per epoch is enough here
]

# The `s5jax` command with hooks counting the rows of the batches the trainer gets and the
# rows read from the data arrays to make them.
_CHILD = textwrap.dedent("""
    import json, os, sys
    import s5jax.data._batches as batches
    import s5jax.train._engine as engine
    count = {"batch_rows": 0, "read_rows": 0}
    gather, iterate = batches._gather, engine.iterate_batches
    def counting_gather(arr, idx, contiguous):
        out = gather(arr, idx, contiguous)
        if arr.ndim == 3:  # the inputs x (B, L, D); y, lengths and t are smaller
            count["read_rows"] += len(out)
        return out
    def counting_batches(*args, **kwargs):
        for batch in iterate(*args, **kwargs):
            count["batch_rows"] += len(batch["x"])
            yield batch
    batches._gather, engine.iterate_batches = counting_gather, counting_batches
    from s5jax.cli import main
    code = main(sys.argv[1:])
    with open(os.environ["ROWS_FILE"], "w") as f:
        json.dump(count, f)
    sys.exit(code)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, rows_file):
    env = dict(os.environ, JAX_PLATFORMS="cpu", ROWS_FILE=str(rows_file))
    env.pop("XLA_FLAGS", None)
    # The processes compile the same steps: share a compilation cache between them.
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax-cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def _train_args(workdir, epochs, *extra):
    sets = [a for s in [*_SETTINGS, f"train.epochs={epochs}"] for a in ("--set", s)]
    return ["train", "synthetic", "--workdir", str(workdir), "--no-progress", *sets, *extra]


def _start(tmp_path, name, argv):
    rows = tmp_path / f"{name}.rows.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *argv],
        env=_env(tmp_path, rows),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, rows


def _finish(proc, rows, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    count = json.loads(rows.read_text())
    return out, (count["batch_rows"], count["read_rows"])


def _two_processes(tmp_path, name, workdir, epochs, *extra, beside=()):
    """Run processes 0 and 1 (and the processes `beside`, started already) to their end."""
    port = _free_port()
    procs = []
    for i in range(2):
        multi = ["--multihost", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
        argv = _train_args(workdir, epochs, *multi, "--process-id", str(i), *extra)
        procs.append(_start(tmp_path, f"{name}-{i}", [*argv, "--coordinator-timeout", "120"]))
    try:
        return [_finish(*p) for p in [*procs, *beside]]
    finally:
        for p, _ in [*procs, *beside]:
            if p.poll() is None:
                p.kill()


def _records(workdir):
    steps = [(r["step"], r["loss"]) for r in read_metrics(workdir, kind="step")]
    keys = ("train_loss", "val_loss", "val_accuracy", "test_loss")
    epochs = [
        [r["epoch"], *(r.get(k, np.nan) for k in keys)] for r in read_metrics(workdir, kind="epoch")
    ]
    return steps, np.asarray(epochs, float)


def test_two_processes_train_resume_and_read_half_of_each_batch_like_two_devices(tmp_path):
    # One process, two CPU devices: the reference (2 epochs, uninterrupted), run beside
    # two processes x one CPU device that train epoch 1, then both resume for epoch 2.
    one, two = tmp_path / "one", tmp_path / "two"
    reference = _start(tmp_path, "one", _train_args(one, 2, "--cpu-devices", "2"))
    *first, (out, rows_one) = _two_processes(tmp_path, "first", two, 1, beside=[reference])
    assert "on 2 cpu devices" in out
    assert "2 cpu devices in 2 processes (this is process 1)" in first[1][0]
    ckpt = two / "checkpoints" / "latest"
    assert [p.name for p in ckpt.iterdir() if p.name.isdigit()] == ["4"]
    assert (ckpt / "4" / "s5jax.json").is_file()
    second = _two_processes(tmp_path, "second", two, 2, "--resume")
    assert "resumed from epoch 1 (step 4)" in second[0][0] and second[1][0].count("resumed") == 1

    # The same steps, losses and evaluations as one process with two devices.
    (steps_one, epochs_one), (steps_two, epochs_two) = _records(one), _records(two)
    assert [s for s, _ in steps_two] == [s for s, _ in steps_one] == list(range(1, 9))
    np.testing.assert_allclose([l for _, l in steps_two], [l for _, l in steps_one], atol=1e-5)
    np.testing.assert_allclose(epochs_two, epochs_one, atol=1e-5)

    # Each process got half of the rows of each batch the single process got (8 of 16 rows
    # for val's padded second batch), and read from the data only those: its share.
    (_, (first_0, read_0)), (_, (first_1, read_1)) = first
    (_, (second_0, read_2)), (_, (second_1, read_3)) = second
    assert first_0 == first_1 and second_0 == second_1
    assert 2 * (first_0 + second_0) == rows_one[0], (first, second, rows_one)
    assert (read_0, read_1, read_2, read_3) == (first_0, first_1, second_0, second_1)

    # Process 0 alone wrote the run's files: one config, one metrics line per record.
    assert json.loads((two / "results.json").read_text())["epochs_run"] == 2
    assert len(read_metrics(two, kind="epoch")) == 2


def test_two_processes_train_several_seeds_one_after_another(tmp_path):
    # `--seeds` runs one training after another in each process: every run's announcements
    # from process 0 (the run directory's check, the resumed state) are numbered by run, so
    # that process 1 waits for the second run's and does not read the first's again.
    work = tmp_path / "seeds"
    outs = _two_processes(tmp_path, "seeds", work, 1, "--seeds", "0-1")
    assert [o.count("== seed") for o, _ in outs] == [2, 2], outs[1][0][-2000:]
    summary = json.loads((work / "summary.json").read_text())
    assert [(r["seed"], r["status"]) for r in summary["per_seed"]] == [(0, "done"), (1, "done")]
    for s in (0, 1):
        assert json.loads((work / f"seed-{s}" / "config.json").read_text())["train"]["seed"] == s
        assert len(read_metrics(work / f"seed-{s}", kind="epoch")) == 1
    # The seeds differ (initialisation, data order), so neither run repeated the other.
    assert read_metrics(work / "seed-0", kind="step") != read_metrics(work / "seed-1", kind="step")


def test_every_process_stops_with_the_error_of_process_0(tmp_path):
    # Process 0 refuses a non-empty folder that is no run's; process 1, which does not check it,
    # stops with process 0's message and exit status, and nothing is written.
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine\n")
    port, procs = _free_port(), []
    for i in range(2):
        multi = ["--multihost", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
        argv = _train_args(workdir, 1, *multi, "--process-id", str(i))
        procs.append(_start(tmp_path, f"refused-{i}", argv)[0])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    errors = [[line for line in out.splitlines() if "error:" in line] for out in outs]
    assert [p.returncode for p in procs] == [2, 2], outs
    assert errors[0] == errors[1] and len(errors[0]) == 1
    assert errors[0][0].startswith(
        f"s5jax train: error: {workdir} is not empty and not an s5jax run directory"
    )
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]


def test_a_process_that_cannot_reach_the_coordinator_stops_within_the_timeout(tmp_path):
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    argv = _train_args(tmp_path / "run", 1, "--multihost", "--coordinator", address)
    argv += ["--num-processes", "2", "--process-id", "1", "--coordinator-timeout", "2"]
    start = time.monotonic()
    proc, _ = _start(tmp_path, "lost", argv)
    out, _ = proc.communicate(timeout=60)
    seconds = time.monotonic() - start
    assert proc.returncode == EXIT_COORDINATOR == 69
    errors = [line for line in out.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("s5jax train: error: cannot reach the ")
    assert address in errors[0] and "--coordinator-timeout" in errors[0]
    assert seconds < 30  # 2 s of waiting, plus starting Python
    assert not (tmp_path / "run").exists()


def test_a_coordinator_whose_processes_never_join_stops_within_the_timeout(tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    argv = _train_args(tmp_path / "run", 1, "--multihost", "--coordinator", address)
    argv += ["--num-processes", "2", "--process-id", "0", "--coordinator-timeout", "2"]
    proc, _ = _start(tmp_path, "alone", argv)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_COORDINATOR
    errors = [line for line in out.splitlines() if "error:" in line]
    assert errors == [
        f"s5jax train: error: all 2 processes did not join the coordinator at {address} "
        "within 2 s: start every process (with the same --coordinator and --num-processes, "
        "and distinct --process-id), or wait longer with --coordinator-timeout SECONDS"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--coordinator", "127.0.0.1:1234"], "configure --multihost: add it"),
        (["--multihost", "--coordinator", "nohost"], "is not HOST:PORT"),
        (["--multihost", "--coordinator", "h:1", "--coordinator-timeout", "0"], "positive"),
        (["--multihost", "--num-processes", "2", "--process-id", "2"], "must be in 0 .. "),
        (["--multihost", "--num-processes", "0"], "must be at least 1"),
    ],
)
def test_multihost_options_are_checked_before_joining(tmp_path, capsys, extra, message):
    assert main(_train_args(tmp_path / "run", 1, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("s5jax train: error: ") and message in err[0]
    assert not (tmp_path / "run").exists()


def _split(n):
    rng = np.random.default_rng(0)
    return Split(x=rng.normal(size=(n, 3, 2)).astype(np.float32), y=np.arange(n))


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_rows_of_each_process_make_up_the_batches(shuffle):
    # 11 examples in batches of 4: the last batch has 3 real rows and one padding row.
    split = _split(11)
    whole = list(iterate_batches(split, 4, shuffle=shuffle, seed=2, epoch=3))
    parts = [
        list(iterate_batches(split, 4, shuffle=shuffle, seed=2, epoch=3, rows=slice(a, a + 2)))
        for a in (0, 2)
    ]
    assert len(whole) == len(parts[0]) == len(parts[1]) == 3
    for batch, low, high in zip(whole, *parts, strict=True):
        assert set(batch) == set(low) == set(high)
        for name in batch:
            np.testing.assert_array_equal(np.concatenate([low[name], high[name]]), batch[name])
    assert whole[-1]["mask"].tolist() == [True, True, True, False]
    every = list(iterate_batches(split, 4, shuffle=shuffle, seed=2, epoch=3, rows=slice(0, 4)))
    for batch, same in zip(whole, every, strict=True):
        assert all(np.array_equal(batch[k], same[k]) for k in batch)


def test_one_process_holds_every_row_and_shard_local_equals_shard():
    parallel = DataParallel.local()
    assert parallel.local_rows(8) == slice(0, 8)
    batch = {"x": np.arange(16.0).reshape(8, 2)}
    np.testing.assert_array_equal(parallel.shard_local(batch, 8)["x"], parallel.shard(batch)["x"])


def test_a_batch_size_the_devices_do_not_divide_names_the_next_that_fits():
    class ThreeDevices(DataParallel):
        n_devices = 3  # the check reads only the count

    parallel = ThreeDevices(DataParallel.local().mesh)
    parallel.check_batch_size(9, "data.batch_size")
    with pytest.raises(ValueError, match=r"data\.batch_size=8 must be divisible by the number "
                       r"of devices \(3\).*\(--set data\.batch_size=9\)"):  # fmt: skip
        parallel.check_batch_size(8, "data.batch_size")
    with pytest.raises(ValueError, match=r"--batch-size=5 .*\(--batch-size 6\)"):
        parallel.check_batch_size(5, "--batch-size")
