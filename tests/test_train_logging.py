"""Run-directory outputs of the trainer: metrics.jsonl, TensorBoard events (read back with
TensorBoard's own EventAccumulator), progress bar, summary table and curve plots."""

import io
import math
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from tqdm import tqdm

from s5jax.config import apply_overrides, load_experiment
from s5jax.train._engine import train_and_evaluate
from s5jax.train._logging import METRICS_FILE, MetricsLogger, read_metrics, summary_table
from s5jax.train._plots import (
    COMPARISON_SIZE,
    PANEL_SIZE,
    comparison_figure,
    curves_figure,
    log_scale_for,
    plot_curves,
    plot_runs,
)
from s5jax.train._progress import Progress
from s5jax.train._tensorboard import EventWriter, flat_hparams, ssm_statistics

# ---------------------------------------------------------------------------- helpers


class Clock:
    """A settable clock."""

    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def _accumulator(directory):
    """TensorBoard's reader over every event file in `directory`, keeping all events."""
    acc = EventAccumulator(
        str(directory), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0}
    )
    return acc.Reload()


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# ---------------------------------------------------------------------------- TensorBoard


def test_event_writer_read_by_tensorboard(tmp_path):
    with EventWriter(tmp_path) as w:
        w.add_scalars({"train/loss": 0.25, "lr": 1e-3}, step=7, wall_time=5.0)
        w.add_scalars({"train/loss": 0.125}, step=2**40)
        w.add_histograms({"h": np.arange(12.0).reshape(3, 4)}, step=7)
        w.add_text("config", "```toml\na = 1\n```")
    acc = _accumulator(tmp_path)
    assert _scalars(acc, "train/loss") == [(7, 0.25), (2**40, 0.125)]
    assert acc.Scalars("lr")[0].value == pytest.approx(1e-3)
    assert acc.Scalars("lr")[0].wall_time == 5.0
    [hist] = acc.Histograms("h")
    assert hist.step == 7 and hist.histogram_value.num == 12
    assert (hist.histogram_value.min, hist.histogram_value.max) == (0.0, 11.0)
    [text] = acc.Tensors("config/text_summary")
    assert text.tensor_proto.string_val[0].decode() == "```toml\na = 1\n```"


def test_two_writers_in_one_second_keep_both_files(tmp_path):
    with EventWriter(tmp_path) as a, EventWriter(tmp_path) as b:
        a.add_scalars({"x": 1.0}, step=1)
        b.add_scalars({"x": 2.0}, step=2)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert _scalars(_accumulator(tmp_path), "x") == [(1, 1.0), (2, 2.0)]


def test_flat_hparams():
    tree = {"name": "x", "model": {"n": 2, "dt": 0.1, "flag": True, "sizes": (1, 2)}, "p": None}
    assert flat_hparams(tree) == {
        "name": "x",
        "model.n": 2,
        "model.dt": 0.1,
        "model.flag": True,
        "model.sizes": "(1, 2)",
    }


def test_hparams_are_read_by_the_hparams_plugin(tmp_path):
    with EventWriter(tmp_path) as w:
        w.add_hparams({"optim.lr": 0.01, "name": "run"}, {"final/acc": 0.9, "none": None}, 10)
    acc = _accumulator(tmp_path)
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    assert {h.name for h in experiment.hparam_infos} == {"optim.lr", "name"}
    assert [m.name.tag for m in experiment.metric_infos] == ["final/acc"]
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["optim.lr"].number_value == 0.01
    assert start.hparams["name"].string_value == "run"
    assert _scalars(acc, "final/acc") == [(10, pytest.approx(0.9))]


def _synthetic(*overrides):
    return apply_overrides(load_experiment("synthetic"), ["data.n_train=64", *overrides])


def test_a_run_logs_scalars_histograms_config_and_hparams(tmp_path):
    cfg = _synthetic("train.epochs=2")
    summary = train_and_evaluate(cfg, tmp_path, progress=False, stream=io.StringIO())
    acc = _accumulator(tmp_path / "tensorboard")
    steps_per_epoch = 64 // cfg.data.batch_size
    epochs = read_metrics(tmp_path, kind="epoch")
    # Scalars: what metrics.jsonl holds, at the same steps (float32 in the event file).
    assert [s for s, _ in _scalars(acc, "step/loss")] == list(range(1, 2 * steps_per_epoch + 1))
    got = _scalars(acc, "epoch/val_accuracy")
    assert [s for s, _ in got] == [r["step"] for r in epochs]
    np.testing.assert_allclose([v for _, v in got], [r["val_accuracy"] for r in epochs])
    # Histograms of every SSM layer, every epoch; one entry per stored eigenvalue and Δ.
    P = cfg.model.ssm_size // 2 if cfg.model.conj_sym else cfg.model.ssm_size
    for layer in range(cfg.model.n_layers):
        for name in ("Lambda_re", "Lambda_im", "Delta"):
            events = acc.Histograms(f"ssm/layer{layer}/{name}")
            assert [e.step for e in events] == [r["step"] for r in epochs]
            assert all(e.histogram_value.num == P for e in events)
        delta = acc.Histograms(f"ssm/layer{layer}/Delta")[0].histogram_value
        assert delta.min > 0  # Δ = exp(log_step)
        lam = acc.Histograms(f"ssm/layer{layer}/Lambda_re")[0].histogram_value
        assert lam.max < 0  # a stable system
        for m in ("B", "C"):
            norms = _scalars(acc, f"ssm/layer{layer}/{m}_norm")
            assert len(norms) == 2 and all(v > 0 for _, v in norms)
    # The resolved config as TOML text that loads back to the same config.
    [text] = acc.Tensors("config/text_summary")
    body = text.tensor_proto.string_val[0].decode()
    assert body.startswith("```toml\n") and body.endswith("\n```")
    toml_path = tmp_path / "back.toml"
    toml_path.write_text(body[len("```toml\n") : -len("\n```")])
    assert load_experiment(toml_path) == cfg
    # HParams: the config and the final metrics.
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["optim.ssm_lr"].number_value == pytest.approx(cfg.optim.ssm_lr)
    assert start.hparams["model.n_layers"].number_value == cfg.model.n_layers
    [(step, value)] = _scalars(acc, "final/test_accuracy_at_best_val")
    assert step == 2 * steps_per_epoch
    assert value == pytest.approx(summary["test_at_best_val"])


def test_ssm_statistics_against_the_complex_matrices():
    """The histograms and norms TensorBoard shows, from numpy's own complex arithmetic:
    ‖B̃‖ and ‖C̃‖ are Frobenius norms of B_re + i·B_im and C_re + i·C_im (both parts count),
    Δ = exp(log_step), Λ as stored; one entry per layer in tree order."""
    import jax

    from s5jax.nn import S5SSM

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    layers = [S5SSM(4, 8, key=k1), S5SSM(4, 12, J=2, bidirectional=True, key=k2)]
    histograms, scalars = ssm_statistics({"stack": layers})
    assert sorted(scalars) == [f"ssm/layer{i}/{m}_norm" for i in (0, 1) for m in ("B", "C")]
    for i, layer in enumerate(layers):
        for m in ("B", "C"):
            full = np.asarray(getattr(layer, f"{m}_re"), np.float64) + 1j * np.asarray(
                getattr(layer, f"{m}_im"), np.float64
            )
            assert np.abs(full.imag).max() > 0  # the imaginary parts are there to count
            assert scalars[f"ssm/layer{i}/{m}_norm"] == pytest.approx(np.linalg.norm(full))
        np.testing.assert_allclose(
            histograms[f"ssm/layer{i}/Delta"], np.exp(np.asarray(layer.log_step, np.float64))
        )
        np.testing.assert_array_equal(histograms[f"ssm/layer{i}/Lambda_re"], layer.Lambda_re)
        np.testing.assert_array_equal(histograms[f"ssm/layer{i}/Lambda_im"], layer.Lambda_im)


def test_a_killed_and_resumed_run_shows_each_step_once(tmp_path, monkeypatch):
    cfg = _synthetic("train.epochs=4")
    steps_per_epoch = 64 // cfg.data.batch_size
    killed_at = 2 * steps_per_epoch + 3  # in epoch 3, after the checkpoint of epoch 2
    original = MetricsLogger.log_step

    def log_then_die(self, step, epoch, **metrics):
        record = original(self, step, epoch, **metrics)
        if step == killed_at:
            raise KeyboardInterrupt
        return record

    monkeypatch.setattr(MetricsLogger, "log_step", log_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(cfg, tmp_path, progress=False, stream=io.StringIO())
    killed = _accumulator(tmp_path / "tensorboard")
    assert _scalars(killed, "step/loss")[-1][0] == killed_at  # written before the kill
    monkeypatch.setattr(MetricsLogger, "log_step", original)
    train_and_evaluate(cfg, tmp_path, resume=True, progress=False, stream=io.StringIO())

    acc = _accumulator(tmp_path / "tensorboard")
    for tag in ("step/loss", "step/accuracy", "step/grad_norm"):
        steps = [s for s, _ in _scalars(acc, tag)]
        assert steps == list(range(1, 4 * steps_per_epoch + 1)), tag
    epoch_steps = [steps_per_epoch * e for e in range(1, 5)]
    assert [s for s, _ in _scalars(acc, "epoch/train_loss")] == epoch_steps
    assert [e.step for e in acc.Histograms("ssm/layer0/Delta")] == epoch_steps
    assert len(acc.Tensors("config/text_summary")) == 1  # not written again on resume
    # The event file and metrics.jsonl agree step by step.
    jsonl = read_metrics(tmp_path, kind="step")
    assert [r["step"] for r in jsonl] == list(range(1, 4 * steps_per_epoch + 1))
    np.testing.assert_allclose(
        [v for _, v in _scalars(acc, "step/loss")], [r["loss"] for r in jsonl], rtol=1e-6
    )


def test_importing_the_trainer_needs_no_torch_nor_tensorflow():
    code = (
        "import sys, s5jax.train; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'tensorflow', 'tensorboard', 'matplotlib.pyplot'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- metrics.jsonl


def test_metrics_logger_writes_jsonl_and_events(tmp_path):
    clock = Clock(10.0)
    with MetricsLogger(tmp_path, clock=clock) as log:
        rec = log.log_step(1, 0, loss=np.float32(0.5), lr=1e-3, note="x")
        clock.t = 11.0
        log.log_epoch(2, 0, val_accuracy=np.float64(0.75), n=np.int64(3), ok=True)
        # Each line is on disk before close.
        assert len((tmp_path / METRICS_FILE).read_text().splitlines()) == 2
    assert rec == {
        "kind": "step",
        "step": 1,
        "epoch": 0,
        "time": 10.0,
        "loss": 0.5,
        "lr": 1e-3,
        "note": "x",
    }
    records = read_metrics(tmp_path)
    assert records[0] == rec
    assert records[1] == {
        "kind": "epoch",
        "step": 2,
        "epoch": 0,
        "time": 11.0,
        "val_accuracy": 0.75,
        "n": 3,
        "ok": True,
    }
    assert read_metrics(tmp_path, kind="epoch") == [records[1]]
    acc = _accumulator(tmp_path / "tensorboard")
    assert _scalars(acc, "step/loss") == [(1, 0.5)]
    assert acc.Scalars("step/loss")[0].wall_time == 10.0
    assert acc.Scalars("step/lr")[0].value == pytest.approx(1e-3)
    assert _scalars(acc, "epoch/val_accuracy") == [(2, 0.75)]
    assert _scalars(acc, "epoch/n") == [(2, 3.0)]
    assert "step/note" not in acc.Tags()["scalars"] and "epoch/ok" not in acc.Tags()["scalars"]


def test_metrics_logger_rejects_reserved_names(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log, pytest.raises(ValueError):
        log.log_step(1, 0, time=3.0)


def test_read_metrics_missing_and_truncated(tmp_path):
    assert read_metrics(tmp_path) == []
    path = tmp_path / METRICS_FILE
    path.write_text('{"kind": "step", "step": 1}\n{"kind": "step", "st')
    assert read_metrics(tmp_path) == [{"kind": "step", "step": 1}]
    path.write_text('{"kind": "step", "step": 1}\nnot json\n{"kind": "step", "step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(tmp_path)


def test_resume_drops_truncated_line_and_later_steps(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for step in range(1, 6):
            log.log_step(step, 0, loss=1.0 / step)
    path = tmp_path / METRICS_FILE
    with open(path, "a") as f:
        f.write('{"kind": "step", "step": 6, "lo')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]

    with MetricsLogger(tmp_path, resume_step=3) as log:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
        log.log_step(4, 0, loss=0.2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert path.read_text().endswith("\n")
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed
    # The resumed event file starts with a SessionLog.START at step 4 (TensorBoard's schema,
    # read with its own reader), so TensorBoard drops the first run's steps 4 and 5.
    _, resumed = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    starts = [
        e.step
        for e in EventFileLoader(str(resumed)).Load()
        if e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START
    ]
    assert starts == [4]
    acc = _accumulator(tmp_path / "tensorboard")
    assert _scalars(acc, "step/loss") == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
        (4, pytest.approx(0.2)),
    ]


def test_reopen_without_resume_appends(tmp_path):
    for step in (1, 2):
        with MetricsLogger(tmp_path, tensorboard=False) as log:
            log.log_step(step, 0, loss=1.0)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_nonfinite_values_roundtrip(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log_step(1, 0, loss=math.nan, grad=math.inf)
    [rec] = read_metrics(tmp_path)
    assert math.isnan(rec["loss"]) and rec["grad"] == math.inf


# ---------------------------------------------------------------------------- progress bar


class TTYStringIO(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def test_progress_on_a_terminal_is_a_tqdm_bar():
    stream = TTYStringIO()
    bar = Progress(100, "epoch 1", stream, unit="step", min_interval=0)
    assert bar.tty and isinstance(bar.bar, tqdm)
    assert bar.bar.dynamic_ncols and bar.bar.smoothing == pytest.approx(0.3)
    for _ in range(10):
        bar.update(10, loss="0.1235")
    bar.close()
    bar.close()
    out = stream.getvalue()
    assert "\r" in out and out.endswith("\n")  # redrawn in place, one final newline
    last = out.rstrip("\n").split("\r")[-1]
    assert last.startswith("epoch 1: 100%") and "100/100" in last
    assert "step/s" in last and "loss=0.1235" in last


def test_progress_write_on_a_terminal_keeps_the_bar():
    stream = TTYStringIO()
    with Progress(4, stream=stream, unit="samples", min_interval=0) as bar:
        bar.update(2)
        bar.write("hello")
        bar.update(2)
    out = stream.getvalue()
    assert "hello\n" in out and "samples/s" in out and "4/4" in out


def test_progress_plain_every_ten_percent():
    clock, stream = Clock(), io.StringIO()
    bar = Progress(1000, "eval", stream=stream, clock=clock, plain_interval=0)
    assert not bar.tty and bar.bar is None
    for i in range(1000):
        clock.t = i * 0.01
        bar.update(1, acc=0.5)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10
    assert "\r" not in stream.getvalue()
    assert lines[0].startswith("eval:  10%|#") and "100/1000" in lines[0]
    assert "100%" in lines[-1] and "acc=0.5" in lines[-1]


def test_progress_plain_lines_are_at_least_plain_interval_apart():
    # A log file: a tenth prints only plain_interval (30 s) after the start or the last line;
    # the end always prints, once, with the whole count and the rate.
    clock, stream = Clock(), io.StringIO()
    with Progress(100, "epoch 1", stream=stream, clock=clock, unit="step") as bar:
        for i in range(100):
            clock.t = (i + 1) * 0.05  # a 5-second epoch
            bar.update(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("epoch 1: 100%") and "100/100" in lines[0]
    assert "20.00step/s" in lines[0]

    stream = io.StringIO()
    with Progress(100, stream=stream, clock=clock) as bar:
        start = clock.t
        for i in range(100):
            clock.t = start + (i + 1) * 1.0  # 100 s: a tenth every 10 s
            bar.update(1)
        bar.update(0)  # past the end: no second final line
    done = [line.split("|")[0].strip() for line in stream.getvalue().splitlines()]
    assert done == ["30%", "60%", "90%", "100%"]

    stream = io.StringIO()
    with Progress(100, stream=stream, clock=clock) as bar:
        clock.t += 40.0  # a slow first tenth (compilation) shows at once
        bar.update(10)
        clock.t += 1.0
        bar.update(10)  # 1 s later: too soon
    lines = stream.getvalue().splitlines()  # closed early: the count reached
    assert [line.split("|")[0].strip() for line in lines] == ["10%", "20%"]


def test_progress_plain_close_early_and_unknown_total():
    clock, stream = Clock(), io.StringIO()
    with Progress(100, stream=stream, clock=clock) as bar:
        clock.t = 1.0
        bar.update(5)
    assert stream.getvalue().splitlines() == ["  5%|5         | 5/100 [00:01<00:19,  5.00it/s]"]

    stream = io.StringIO()
    with Progress(None, "x", stream=stream, clock=clock, plain_interval=10) as bar:
        clock.t = 2.0
        bar.update(3)  # first line
        clock.t = 3.0
        bar.update(3)  # too soon
        bar.write("hello")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "x: 3it [00:01,  3.00it/s]"
    assert lines[1] == "hello"
    assert lines[2].startswith("x: 6it [") and len(lines) == 3


def test_training_progress_on_a_terminal(tmp_path):
    stream = TTYStringIO()
    cfg = _synthetic("train.epochs=1")
    train_and_evaluate(cfg, tmp_path, progress=True, stream=stream)
    bars = [line for line in stream.getvalue().split("\r") if line.startswith("epoch 1:")]
    assert len(bars) > 1 and "8/8" in bars[-1] and "loss=" in bars[-1]
    assert "s/step" in bars[-1] or "step/s" in bars[-1]


# ---------------------------------------------------------------------------- summary table


def test_summary_table():
    rows = [
        {"metric": "val_accuracy", "ours": 0.88123, "paper": 0.882, "difference": -0.00077},
        {"metric": "test_accuracy", "ours": 0.87, "paper": None, "difference": None},
    ]
    lines = summary_table(rows).splitlines()
    assert lines[0].split(" | ") == ["metric       ", "  ours", "paper", "difference"]
    assert set(lines[1]) <= {"-", "+"}
    assert lines[3].endswith("–")
    assert "–" in lines[3]
    assert len({line.index("|") for line in lines if "|" in line}) == 1  # aligned
    assert "0.8812" in lines[2] and "-0.00077" in lines[2]


def test_summary_table_sequences_and_headers():
    text = summary_table([["a", 1], ["bb", None]], ["name", "n"])
    assert text.splitlines() == ["name | n", "-----+--", "a    | 1", "bb   | –"]


# ---------------------------------------------------------------------------- plots


def _epoch_records(n=10, loss_offset=0.0):
    return [
        {
            "kind": "epoch",
            "step": 10 * e,
            "epoch": e,
            "time": 0.0,
            "accuracy": 0.1 * e,
            "loss": 1.0 / e + loss_offset,
            "val_loss": 1.2 / e + loss_offset,
            "val_accuracy": 0.08 * e,
        }
        for e in range(1, n + 1)
    ] + [{"kind": "step", "step": 1, "epoch": 1, "time": 0.0, "loss": 99.0}]


def _dashed_lines(ax):
    return [line for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_curves_figure_axes_reference_and_best_epoch():
    figure = curves_figure(
        _epoch_records(),
        metrics=("loss", "val_loss", "accuracy"),
        title="run",
        reference=("test_accuracy", 0.88),
        best_epoch=7,
    )
    loss, accuracy = figure.axes
    assert loss.get_title(loc="left") == "loss" and accuracy.get_title(loc="left") == "accuracy"
    assert loss.get_yscale() == "log"  # a positive loss
    assert accuracy.get_yscale() == "linear"  # accuracies never
    # The paper's figure: a dashed horizontal line at its value, on its metric's panel only.
    [paper] = _dashed_lines(accuracy)
    assert list(paper.get_ydata()) == [0.88, 0.88] and paper.get_label() == "paper"
    assert not _dashed_lines(loss)
    # The best-validation epoch: a dotted vertical line and a star on the val curve.
    for ax in (loss, accuracy):
        [best] = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert list(best.get_xdata()) == [7, 7]
        [star] = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert star.get_xdata()[0] == 7
    [star] = [line for line in loss.get_lines() if line.get_marker() == "*"]
    assert star.get_ydata()[0] == pytest.approx(1.2 / 7)  # on the val loss
    labels = [line.get_label() for line in loss.get_lines()]
    assert labels[:2] == ["train", "val"]
    assert figure._suptitle.get_text() == "run"


def test_a_loss_that_can_be_negative_is_linear():
    # A Gaussian NLL (the pendulum's loss) goes below zero: no log axis.
    figure = curves_figure(_epoch_records(loss_offset=-0.5), metrics=("loss",))
    assert figure.axes[0].get_yscale() == "linear"
    assert log_scale_for("val_mse", [1e-3, 2e-3]) and not log_scale_for("mse", [0.0, 1.0])
    assert not log_scale_for("val_accuracy", [0.5]) and not log_scale_for("loss", [math.nan])


def test_plot_curves_png(tmp_path):
    path = plot_curves(
        _epoch_records(),
        tmp_path / "sub" / "curves.png",
        metrics=("loss", "val_loss", "accuracy"),
        title="run",
        best_epoch=3,
    )
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (2 * PANEL_SIZE[0], PANEL_SIZE[1])
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 5  # not blank
    assert not list((tmp_path / "sub").glob(".*tmp"))


def test_plot_curves_degenerate_inputs(tmp_path):
    # a field that is not a number (a flag, text) is a gap, never a point at 0 or 1
    flags = [{"kind": "epoch", "epoch": e, "loss": 0.5, "val_loss": e == 2} for e in (1, 2)]
    [panel] = curves_figure(flags, metrics=("loss",)).axes
    assert [line.get_label() for line in panel.get_lines()] == ["train"]
    records = [{"kind": "epoch", "epoch": 1, "loss": 0.5, "val_loss": math.nan}]
    path = plot_curves(records, tmp_path / "one.png", metrics=("loss", "missing"))
    with Image.open(path) as image:
        assert image.size == PANEL_SIZE
    figure = curves_figure([])
    assert figure.axes[0].texts[0].get_text() == "no data"
    path = plot_curves([], tmp_path / "empty.png")
    with Image.open(path) as image:
        assert image.size == PANEL_SIZE
        assert len(np.unique(np.asarray(image.convert("L")))) > 1  # "no data" text


def test_plot_curves_overwrites(tmp_path):
    path = tmp_path / "c.png"
    path.write_bytes(b"old")
    plot_curves(_epoch_records(3), path)
    with Image.open(path) as image:
        image.verify()


def test_comparison_figure():
    runs = {"a": _epoch_records(5)[:-1], "b": _epoch_records(8)[:-1]}
    figure = comparison_figure(
        runs, "val_loss", reference=("test_loss", 0.1), best_epochs={"a": 5, "b": None}
    )
    [ax] = figure.axes
    assert ax.get_yscale() == "log"
    curves = [line for line in ax.get_lines() if line.get_label() in ("a", "b")]
    assert [len(line.get_xdata()) for line in curves] == [5, 8]
    [paper] = _dashed_lines(ax)
    assert list(paper.get_ydata()) == [0.1, 0.1]
    [star] = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (5, pytest.approx(1.2 / 5))
    assert comparison_figure(runs, "val_accuracy").axes[0].get_yscale() == "linear"


def _fake_run(run_dir, records):
    with MetricsLogger(run_dir, tensorboard=False) as log:
        for r in records:
            if r["kind"] == "epoch":
                extra = {k: v for k, v in r.items() if k not in ("kind", "step", "epoch", "time")}
                log.log_epoch(r["step"], r["epoch"], **extra)


def test_plot_runs(tmp_path):
    _fake_run(tmp_path / "a", _epoch_records(4))
    _fake_run(tmp_path / "b", _epoch_records(6))
    out = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp.png")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == COMPARISON_SIZE
    plot_runs([tmp_path / "a"], tmp_path / "loss.png", metric="val_loss")
    with pytest.raises(ValueError, match="no run has the metric 'nope'"):
        plot_runs([tmp_path / "a"], tmp_path / "x.png", metric="nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_runs([tmp_path / "missing"], tmp_path / "x.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl not found"):
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
