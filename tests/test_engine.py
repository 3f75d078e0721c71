"""train_and_evaluate end to end on the synthetic experiment: outputs, repeatability, resume,
divergence, and one device against two."""

import dataclasses
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from s5jax import core
from s5jax.config import apply_overrides, load_experiment
from s5jax.data import Split, iterate_batches
from s5jax.train import _engine, read_metrics
from s5jax.train._checkpoint import Checkpoints
from s5jax.train._datasets import synthetic_dataset
from s5jax.train._engine import TrainingDiverged, train_and_evaluate
from s5jax.train._run_info import git_commit, native_scan_status, pallas_scan_status


def _cfg(*overrides):
    return apply_overrides(load_experiment("synthetic"), list(overrides))


def _run(tmp_path, name, cfg, **kw):
    return train_and_evaluate(cfg, tmp_path / name, progress=False, stream=io.StringIO(), **kw)


def _step_losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir, kind="step")]


def test_a_run_writes_its_outputs_and_learns(tmp_path):
    cfg = _cfg("train.epochs=3", "data.n_train=128")
    summary = _run(tmp_path, "run", cfg)
    run = tmp_path / "run"
    for name in ("config.json", "run_info.json", "metrics.jsonl", "results.json", "curves.png"):
        assert (run / name).is_file(), name
    assert load_experiment(run / "config.json") == cfg
    assert json.loads((run / "results.json").read_text()) == summary
    info = json.loads((run / "run_info.json").read_text())
    assert info["versions"]["jax"] and info["n_params"] == summary["n_params"]
    # Which scan "auto" could use here, so that two hosts' speeds can be told apart.
    assert info["scan_method"] == cfg.model.scan_method == "auto"
    if core.native_available():
        assert info["native_scan"] == "available"
    else:
        assert info["native_scan"] == f"unavailable: {core.native_build_error()}"
    epochs = read_metrics(run, kind="epoch")
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert len(_step_losses(run)) == 3 * 16
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert summary["best_epoch"] in (1, 2, 3) and summary["epochs_run"] == 3
    best = max(epochs, key=lambda r: r["val_accuracy"])
    assert summary["test_at_best_val"] == best["test_accuracy"]
    assert any((run / "tensorboard").iterdir())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_git_commit_is_the_full_commit_of_the_checkout(tmp_path):
    """run_info.json's `git_commit`: the whole 40-digit commit, as git's own files hold it
    (the branch ref under .git/), from any folder inside the checkout; None outside one."""
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "f.txt").write_text("x\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}  # fmt: skip
    # no `init -b` (git >= 2.28) and no signing, whatever the host's git and its settings
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "commit.gpgsign=false", "commit", "-q", "-m", "one"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    head = (repo / ".git" / "HEAD").read_text().strip()  # "ref: refs/heads/<branch>"
    assert head.startswith("ref: ")
    ref = (repo / ".git" / head.removeprefix("ref: ")).read_text().strip()
    assert len(ref) == 40
    assert git_commit(repo / "sub") == ref
    outside = tmp_path / "outside"
    outside.mkdir()
    assert git_commit(outside) is None


def test_native_scan_status_does_not_build_for_methods_that_cannot_use_it(monkeypatch):
    def must_not_build():
        raise AssertionError("native_available() was called")

    monkeypatch.setattr(core, "native_available", must_not_build)
    assert native_scan_status("chunked") == "not used (scan_method = 'chunked')"
    assert native_scan_status("fused") == "not used (scan_method = 'fused')"
    monkeypatch.setattr(jax, "device_count", lambda *args: 2)
    assert native_scan_status("auto") == "not used (2 devices: 'auto' runs the chunked scan)"
    monkeypatch.setattr(jax, "device_count", lambda *args: 1)
    monkeypatch.setattr(core, "native_available", lambda: False)
    monkeypatch.setattr(core, "native_build_error", lambda: "S5JAX_NATIVE=0 is set")
    assert native_scan_status("auto") == "unavailable: S5JAX_NATIVE=0 is set"
    monkeypatch.setattr(core, "native_available", lambda: True)
    assert native_scan_status("native") == "available"


def test_pallas_scan_status_says_whether_auto_runs_the_kernel(monkeypatch):
    from s5jax.core import _ssm

    monkeypatch.delenv("S5JAX_PALLAS", raising=False)
    assert pallas_scan_status("chunked") == "not used (scan_method = 'chunked')"
    assert pallas_scan_status("pallas") == "used (scan_method = 'pallas')"
    assert pallas_scan_status("auto") == (
        "not used by 'auto': the Pallas kernel needs a GPU; the default backend is cpu"
    )
    monkeypatch.setattr(core, "pallas_unavailable_reason", lambda: "")
    monkeypatch.setattr(jax, "device_count", lambda *args: 2)
    assert pallas_scan_status("auto") == "not used by 'auto': 2 devices"
    monkeypatch.setattr(jax, "device_count", lambda *args: 1)
    assert pallas_scan_status("auto") == (
        f"used by 'auto' above {_ssm.AUTO_GPU_PALLAS_ABOVE} stored states per sequence"
    )


def test_best_ties_choose_the_earliest_or_the_lower_loss_epoch(tmp_path):
    # 8 val examples: accuracy moves in steps of 1/8 and ties from epoch 5 on (seen: 0.625 at
    # epochs 5-8 with val loss falling), so the two rules pick different epochs.
    sets = ("train.epochs=8", "data.n_eval=8", "data.eval_batch_size=8",
            "train.test_every_epoch=true")  # fmt: skip
    runs = {
        ties: (_run(tmp_path, ties, _cfg(*sets, f"train.best_ties={ties}")),
               read_metrics(tmp_path / ties, kind="epoch"))
        for ties in ("earliest", "lower_loss")
    }  # fmt: skip
    # the setting changes selection only: training and evaluation are the same
    (_, first), (_, lower) = runs["earliest"], runs["lower_loss"]
    assert [(r["val_accuracy"], r["val_loss"]) for r in first] == [
        (r["val_accuracy"], r["val_loss"]) for r in lower
    ]
    for ties, (summary, epochs) in runs.items():
        best = None
        for r in epochs:  # the rule, restated over the recorded figures
            key = (r["val_accuracy"], -r["val_loss"] if ties == "lower_loss" else 0.0)
            if best is None or key > best[0]:
                best = (key, r)
        assert summary["best_epoch"] == best[1]["epoch"], ties
        assert summary["test_at_best_val"] == best[1]["test_accuracy"]
    assert runs["lower_loss"][0]["best_epoch"] > runs["earliest"][0]["best_epoch"]


def test_select_last_reports_the_model_where_training_ends(tmp_path):
    sets = ("train.epochs=4", "data.n_eval=8", "data.eval_batch_size=8")
    best = _run(tmp_path, "best", _cfg(*sets, "train.test_every_epoch=true"))
    last = _run(tmp_path, "last", _cfg(*sets, "train.select=last"))
    best_epochs = read_metrics(tmp_path / "best", kind="epoch")
    last_epochs = read_metrics(tmp_path / "last", kind="epoch")
    # the same training and val figures; only what is reported differs
    assert [(r["val_accuracy"], r["val_loss"]) for r in best_epochs] == [
        (r["val_accuracy"], r["val_loss"]) for r in last_epochs
    ]
    assert (last["best_epoch"], last["select"], best["select"]) == (4, "last", "best_val")
    assert last["best_val"] == last_epochs[-1]["val_accuracy"]
    # test is evaluated once, at the end, and equals the every-epoch run's last figure
    assert ["test_accuracy" in r for r in last_epochs] == [False, False, False, True]
    assert last["test_at_best_val"] == best_epochs[-1]["test_accuracy"]
    assert best["best_epoch"] != 4  # the two protocols differ here, so the check bites
    ckpt = Checkpoints(tmp_path / "last")
    assert ckpt.latest_step("best") == ckpt.latest_step("latest") == last_epochs[-1]["step"]
    ckpt.close()
    # early stopping ends training: the epoch it stops at is the one reported
    stopped = _run(tmp_path, "stop", _cfg(*sets, "train.epochs=20", "train.select=last",
                                          "train.early_stop_patience=1"))  # fmt: skip
    epochs = read_metrics(tmp_path / "stop", kind="epoch")
    assert len(epochs) < 20 and stopped["best_epoch"] == stopped["epochs_run"] == len(epochs)
    assert ["test_accuracy" in r for r in epochs] == [False] * (len(epochs) - 1) + [True]


def test_test_split_is_evaluated_when_val_improves_unless_asked_every_epoch(tmp_path):
    lazy = _run(tmp_path, "lazy", _cfg("train.epochs=4"))
    eager = _run(tmp_path, "eager", _cfg("train.epochs=4", "train.test_every_epoch=true"))
    lazy_epochs = read_metrics(tmp_path / "lazy", kind="epoch")
    eager_epochs = read_metrics(tmp_path / "eager", kind="epoch")
    # Same training either way; only the extra test passes differ.
    assert [r["val_accuracy"] for r in lazy_epochs] == [r["val_accuracy"] for r in eager_epochs]
    assert all("test_accuracy" in r for r in eager_epochs)
    best = None
    for lazy_r, eager_r in zip(lazy_epochs, eager_epochs, strict=True):
        improved = best is None or lazy_r["val_accuracy"] > best
        best = lazy_r["val_accuracy"] if improved else best
        assert ("test_accuracy" in lazy_r) == improved
        if improved:
            assert lazy_r["test_accuracy"] == eager_r["test_accuracy"]
    # The run has both kinds of epoch, so both branches were checked.
    assert {"test_accuracy" in r for r in lazy_epochs} == {True, False}
    assert lazy["test_at_best_val"] == eager["test_at_best_val"]
    assert lazy["best_epoch"] == eager["best_epoch"]


def test_same_seed_same_losses(tmp_path):
    a = _run(tmp_path, "a", _cfg())
    b = _run(tmp_path, "b", _cfg())
    assert _step_losses(tmp_path / "a") == _step_losses(tmp_path / "b")
    assert a["test_at_best_val"] == b["test_at_best_val"]
    _run(tmp_path, "c", _cfg("train.seed=1"))
    assert _step_losses(tmp_path / "c") != _step_losses(tmp_path / "a")


def test_resumed_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    cfg = _cfg("train.epochs=3", "model.dropout=0.1")
    _run(tmp_path, "whole", cfg)

    saves = {"n": 0}
    original = Checkpoints.save

    def save_then_die(self, which, step, tree, meta):
        original(self, which, step, tree, meta)
        if which == "latest":
            saves["n"] += 1
            if saves["n"] == 2:
                raise KeyboardInterrupt  # killed right after epoch 2 was checkpointed

    monkeypatch.setattr(Checkpoints, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "killed", cfg)
    monkeypatch.setattr(Checkpoints, "save", original)
    _run(tmp_path, "killed", cfg, resume=True)
    whole, resumed = _step_losses(tmp_path / "whole"), _step_losses(tmp_path / "killed")
    assert len(resumed) == len(whole)
    np.testing.assert_allclose(resumed, whole, rtol=1e-6, atol=1e-6)
    epochs = read_metrics(tmp_path / "killed", kind="epoch")
    assert [r["epoch"] for r in epochs] == [1, 2, 3]


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = _cfg("train.epochs=2")
    good = synthetic_dataset(seq_len=32, n_train=64, n_eval=32)
    _run(tmp_path, "run", _cfg("train.epochs=1"), dataset=good)
    bad_x = np.array(good.splits["train"].x)
    bad_x[:, 3] = np.nan
    bad = type(good)(
        good.name,
        good.task,
        {**good.splits, "train": Split(bad_x, good.splits["train"].y)},
        n_classes=good.n_classes,
    )
    with pytest.raises(TrainingDiverged, match=r"at step 9 \(epoch 2\)"):
        _run(tmp_path, "run", cfg, dataset=bad, resume=True)
    ckpt = Checkpoints(tmp_path / "run")
    assert ckpt.latest_step() == 8
    ckpt.close()


def test_nan_loss_found_at_a_fetch_names_its_step_and_the_fetched_range(tmp_path):
    # With log_every = 4 the losses of steps 9-12 reach the host together, at step 12.
    good = synthetic_dataset(seq_len=32, n_train=64, n_eval=32)
    _run(tmp_path, "run", _cfg("train.epochs=1", "train.log_every=4"), dataset=good)
    bad_x = np.array(good.splits["train"].x)
    bad_x[:, 3] = np.nan
    bad = type(good)(
        good.name,
        good.task,
        {**good.splits, "train": Split(bad_x, good.splits["train"].y)},
        n_classes=good.n_classes,
    )
    cfg = _cfg("train.epochs=2", "train.log_every=4")
    with pytest.raises(TrainingDiverged, match=r"at step 9 \(epoch 2\) \(steps 9-12 checked"):
        _run(tmp_path, "run", cfg, dataset=bad, resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "run", kind="step")] == [4, 8]


def test_each_step_trains_on_its_own_batch_in_the_epoch_s_order(tmp_path, monkeypatch):
    # The loop reads and places batch i + 1 while step i runs (one batch ahead): step i must
    # still get batch i of the epoch's shuffled order, and every training example once.
    seen = []
    make_steps = _engine.make_steps

    def recording(*args, **kwargs):
        steps = make_steps(*args, **kwargs)

        def train(params, state, opt_state, batch, key):
            seen.append(np.asarray(batch["x"]))
            return steps.train(params, state, opt_state, batch, key)

        return dataclasses.replace(steps, train=train)

    monkeypatch.setattr(_engine, "make_steps", recording)
    cfg = _cfg("train.epochs=2")
    data = synthetic_dataset(seq_len=32, n_train=64, n_eval=32)
    _run(tmp_path, "run", cfg, dataset=data)
    split, size = data.splits["train"], cfg.data.batch_size
    want = [
        b["x"]
        for epoch in (1, 2)
        for b in iterate_batches(
            split, size, shuffle=True, seed=cfg.train.seed, epoch=epoch, drop_last=True
        )
    ]
    assert len(seen) == len(want) == 2 * 64 // size
    for got, expected in zip(seen, want):
        np.testing.assert_array_equal(got, expected)
    rows = np.concatenate(seen[: 64 // size]).reshape(64, -1)
    assert len(np.unique(rows, axis=0)) == 64  # the first epoch saw every example once


def test_epoch_means_count_every_step_once_whatever_log_every(tmp_path):
    # The steps' statistics reach the host in windows of log_every steps (and at the epoch's
    # end); the epoch's train_loss and train_accuracy are the means over its steps all the same.
    _run(tmp_path, "every", _cfg("train.epochs=2", "train.log_every=1"))
    _run(tmp_path, "third", _cfg("train.epochs=2", "train.log_every=3"))
    steps = read_metrics(tmp_path / "every", kind="step")
    every = read_metrics(tmp_path / "every", kind="epoch")
    third = read_metrics(tmp_path / "third", kind="epoch")
    assert len(steps) == 2 * 8  # 64 examples, batch 8
    for epoch, record in enumerate(every, start=1):
        mine = [s for s in steps if s["epoch"] == epoch]
        assert len(mine) == 8
        assert record["train_loss"] == pytest.approx(np.mean([s["loss"] for s in mine]), rel=1e-9)
        assert record["train_accuracy"] == pytest.approx(
            np.mean([s["accuracy"] for s in mine]), rel=1e-9
        )
    for a, b in zip(every, third, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-9)
        assert b["train_accuracy"] == pytest.approx(a["train_accuracy"], rel=1e-9)
    logged = {s["step"]: s["loss"] for s in read_metrics(tmp_path / "third", kind="step")}
    assert sorted(logged) == [3, 6, 9, 12, 15]
    assert all(logged[k] == steps[k - 1]["loss"] for k in logged)


def test_batch_larger_than_the_data_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"data\.batch_size=128 is larger"):
        _run(tmp_path, "run", _cfg("data.batch_size=128"))


_TWO_DEVICE_SCRIPT = textwrap.dedent("""
    import io, json, sys, tempfile
    import jax
    from s5jax.config import apply_overrides, load_experiment
    from s5jax.train import read_metrics
    from s5jax.train._engine import train_and_evaluate
    cfg = apply_overrides(load_experiment("synthetic"), ["train.epochs=1"])
    d = tempfile.mkdtemp()
    train_and_evaluate(cfg, d, progress=False, stream=io.StringIO())
    print(json.dumps({"devices": len(jax.devices()),
                      "losses": [r["loss"] for r in read_metrics(d, kind="step")]}))
""")


def _losses_on(n_devices):
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}",
        JAX_PLATFORMS="cpu",
    )
    out = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICE_SCRIPT],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_devices_give_the_losses_of_one():
    one, two = _losses_on(1), _losses_on(2)
    assert (one["devices"], two["devices"]) == (1, 2)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5, atol=1e-6)


def test_steps_compile_once_despite_a_padded_last_batch(tmp_path):
    # 70 training examples with batch 8 (the last 6 are dropped), 37 eval examples with batch 8
    # (the last batch is padded with masked rows): one compilation each.
    from s5jax.train._engine import _Run

    cfg = _cfg("data.n_train=70", "data.n_eval=37")
    data = synthetic_dataset(seq_len=32, n_train=70, n_eval=37)
    run = _Run(cfg, tmp_path, data, io.StringIO())
    run.build()

    class _Quiet:
        def log_step(self, *a, **k):
            pass

    for epoch in (1, 2):
        run.train_epoch(epoch, 0, _Quiet(), show_progress=False)
        val = run.evaluate("val")
    assert run.steps.train._cache_size() == 1
    assert run.steps.evaluate._cache_size() == 1
    assert 0.0 <= val["accuracy"] <= 1.0
    # Padding rows do not count: the accuracy is a multiple of 1/37.
    assert abs(val["accuracy"] * 37 - round(val["accuracy"] * 37)) < 1e-4


def test_bf16_on_a_cpu_without_bfloat16_arithmetic_is_warned_about(tmp_path, monkeypatch, caplog):
    """`model.precision = "bf16"` on an x86 CPU whose flags have neither avx512_bf16 nor
    amx_bf16 prints one warning line at the start of training (its steps are slower than
    float32 ones there); with either flag, in float32, or where no x86 flags can be read
    (another OS, an Arm CPU), nothing. The flags come from /proc/cpuinfo's first `flags` line."""
    from s5jax.train import _engine

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
        "processor\t: 1\nflags\t\t: fpu avx512_bf16\n"
    )
    assert _engine._cpu_flags(cpuinfo) == {"fpu", "sse2", "avx", "avx2", "fma"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert _engine._cpu_flags(arm) is None
    assert _engine._cpu_flags(tmp_path / "missing") is None

    bf16, fp32 = _cfg("model.precision=bf16"), _cfg()
    avx2 = {"avx", "avx2", "fma"}
    warning = _engine._precision_warning(bf16, avx2)
    assert warning is not None and warning.startswith("warning: model.precision = 'bf16'")
    assert "\n" not in warning and "model.precision = 'fp32'" in warning
    for flags in (avx2 | {"avx512_bf16"}, avx2 | {"amx_bf16"}):
        assert _engine._precision_warning(bf16, flags) is None
    assert _engine._precision_warning(fp32, avx2) is None
    monkeypatch.setattr(_engine, "_cpu_flags", lambda: None)
    assert _engine._precision_warning(bf16) is None

    # Logged once, at the start of a run, as a warning (so `s5jax -q` keeps it).
    monkeypatch.setattr(_engine, "_cpu_flags", lambda: avx2)
    stream = io.StringIO()
    cfg = _cfg("model.precision=bf16", "train.epochs=1", "data.n_train=32")
    with caplog.at_level(logging.WARNING, logger="s5jax"):
        train_and_evaluate(cfg, tmp_path / "run", progress=False, stream=stream)
    logged = [r for r in caplog.records if r.name == "s5jax.train._engine"]
    assert [(r.levelno, r.getMessage()) for r in logged] == [
        (logging.WARNING, warning.removeprefix("warning: "))
    ]
    assert "model.precision" not in stream.getvalue()
