"""Run-directory outputs of the trainer: metrics.jsonl, TensorBoard events, progress bar,
summary table and curve plots."""

import io
import math
import struct

import numpy as np
import pytest
from PIL import Image

from s5jax.train._logging import METRICS_FILE, MetricsLogger, read_metrics, summary_table
from s5jax.train._plots import PANEL_SIZE, SPLIT_COLORS, plot_curves
from s5jax.train._progress import Progress, format_duration
from s5jax.train._tensorboard import EventWriter, crc32c, masked_crc32c

# ---------------------------------------------------------------------------- helpers


class Clock:
    """A settable clock."""

    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def _crc32c_bitwise(data):
    """Independent bit-by-bit CRC-32C (no table)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc ^ 0xFFFFFFFF


def _mask(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_records(data):
    """Split TFRecord framing, checking both CRCs."""
    records, pos = [], 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        assert len_crc == _mask(_crc32c_bitwise(header))
        payload = data[pos + 12 : pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert data_crc == _mask(_crc32c_bitwise(payload))
        records.append(payload)
        pos += 16 + length
    assert pos == len(data)
    return records


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _fields(buf):
    """Parse a protobuf message into a list of (field number, value)."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((field, value))
    assert pos == len(buf)
    return out


def _decode_event(buf):
    event = {"scalars": {}}
    for field, value in _fields(buf):
        if field == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3:
            event["file_version"] = value.decode()
        elif field == 5:
            for f, v in _fields(value):
                assert f == 1
                entry = dict(_fields(v))
                event["scalars"][entry[1].decode()] = struct.unpack("<f", entry[2])[0]
        elif field == 6:
            event["session_log"] = dict(_fields(value))
        else:
            raise AssertionError(f"unexpected field {field}")
    return event


def _read_events(directory):
    files = sorted(directory.glob("events.out.tfevents.*"))
    return [[_decode_event(r) for r in _read_records(f.read_bytes())] for f in files]


# ---------------------------------------------------------------------------- TensorBoard


def test_crc32c_known_vectors():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    data = bytes(range(256)) * 3
    assert crc32c(data) == _crc32c_bitwise(data)
    assert masked_crc32c(data) == _mask(crc32c(data))


def test_event_writer_roundtrip(tmp_path):
    clock = Clock(1_700_000_000.5)
    with EventWriter(tmp_path, clock=clock) as w:
        w.add_scalars({"train/loss": 0.25, "lr": 1e-3}, step=7)
        w.add_scalars({"big": 1e300, "nan": math.nan}, step=2**40, wall_time=5.0)
        w.add_scalars({}, step=9)  # nothing written
        w.session_start(3)
    name = w.path.name
    assert name.startswith("events.out.tfevents.1700000000.")
    [events] = _read_events(tmp_path)
    assert events[0] == {
        "scalars": {},
        "wall_time": 1_700_000_000.5,
        "step": 0,
        "file_version": "brain.Event:2",
    }
    assert events[1]["step"] == 7
    assert events[1]["scalars"] == {"train/loss": 0.25, "lr": pytest.approx(1e-3)}
    assert events[2]["step"] == 2**40 and events[2]["wall_time"] == 5.0
    assert events[2]["scalars"]["big"] == math.inf
    assert math.isnan(events[2]["scalars"]["nan"])
    assert events[3]["step"] == 3 and events[3]["session_log"] == {1: 1}
    assert len(events) == 4


def test_event_writer_does_not_overwrite(tmp_path):
    clock = Clock(100.0)
    with EventWriter(tmp_path, clock=clock) as a, EventWriter(tmp_path, clock=clock) as b:
        assert a.path != b.path


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
    [events] = _read_events(tmp_path / "tensorboard")
    assert events[1]["scalars"] == {"step/loss": 0.5, "step/lr": pytest.approx(1e-3)}
    assert events[1]["step"] == 1 and events[1]["wall_time"] == 10.0
    assert events[2]["scalars"] == {"epoch/val_accuracy": 0.75, "epoch/n": 3.0}


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
    with MetricsLogger(tmp_path, tensorboard=False) as log:
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
    [events] = _read_events(tmp_path / "tensorboard")
    assert events[1]["session_log"] == {1: 1} and events[1]["step"] == 4


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
    def isatty(self):
        return True


def test_format_duration():
    assert format_duration(0) == "00:00"
    assert format_duration(75.4) == "01:15"
    assert format_duration(3725) == "1:02:05"
    assert format_duration(math.inf) == "?"


def test_progress_tty_redraw_throttled():
    clock, stream = Clock(), TTYStringIO()
    bar = Progress(100, "train", stream=stream, clock=clock)
    assert bar.tty
    clock.t = 1.0
    bar.update(10, loss=0.123456)
    first = stream.getvalue()
    assert first.startswith("\r")
    assert "train:  10%" in first and "10/100" in first
    assert "00:01<00:09" in first and "10 it/s" in first and "loss=0.1235" in first
    clock.t = 1.05  # under 0.1 s: no redraw
    bar.update(10)
    assert stream.getvalue() == first
    clock.t = 2.0
    bar.update(10, loss=0.5)
    assert stream.getvalue().count("\r") == 2 and "30/100" in stream.getvalue()
    bar.close()
    bar.close()
    out = stream.getvalue()
    assert out.endswith("\n") and out.count("\n") == 1
    assert "\n" not in out[:-1]


def test_progress_tty_always_draws_completion():
    clock, stream = Clock(), TTYStringIO()
    with Progress(4, stream=stream, clock=clock, unit="samples") as bar:
        clock.t = 1.0
        bar.update(2)
        bar.update(2)  # same instant, but complete
    assert "100%" in stream.getvalue() and "samples/s" in stream.getvalue()


def test_progress_plain_every_ten_percent():
    clock, stream = Clock(), io.StringIO()
    bar = Progress(1000, "eval", stream=stream, clock=clock)
    assert not bar.tty
    for i in range(1000):
        clock.t = i * 0.01
        bar.update(1, acc=0.5)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10
    assert "\r" not in stream.getvalue()
    assert lines[0].startswith("eval:  10%") and "100/1000" in lines[0]
    assert "100%" in lines[-1] and "acc=0.5" in lines[-1]


def test_progress_plain_close_early_and_unknown_total():
    clock, stream = Clock(), io.StringIO()
    with Progress(100, stream=stream, clock=clock) as bar:
        clock.t = 1.0
        bar.update(5)
    assert stream.getvalue().splitlines() == [
        "  5%|#                   | 5/100 [00:01<00:19, 5 it/s]"
    ]

    stream = io.StringIO()
    with Progress(None, "x", stream=stream, clock=clock, plain_interval=10) as bar:
        clock.t = 2.0
        bar.update(3)  # first line
        clock.t = 3.0
        bar.update(3)  # too soon
        bar.write("hello")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "x: 3 [00:01, 3 it/s]"
    assert lines[1] == "hello"
    assert lines[2].startswith("x: 6 [") and len(lines) == 3


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


def _epoch_records(n=10):
    return [
        {
            "kind": "epoch",
            "step": 10 * e,
            "epoch": e,
            "time": 0.0,
            "accuracy": 0.1 * e,
            "loss": 1.0 / e,
            "val_loss": 1.2 / e,
        }
        for e in range(1, n + 1)
    ] + [{"kind": "step", "step": 1, "epoch": 1, "time": 0.0, "loss": 99.0}]


def test_plot_curves_png(tmp_path):
    path = plot_curves(
        _epoch_records(),
        tmp_path / "sub" / "curves.png",
        metrics=("loss", "val_loss", "accuracy"),
        title="run",
    )
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (2 * PANEL_SIZE[0], PANEL_SIZE[1] + 30)
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 5  # not blank
    assert not list((tmp_path / "sub").glob(".*tmp"))

    # The accuracy panel (right): train only, increasing from lower-left to upper-right.
    panel = pixels[30 + 32 :, PANEL_SIZE[0] :]  # below the title and the panel header
    ys, xs = np.nonzero(np.all(panel == SPLIT_COLORS["train"], axis=-1))
    assert len(xs) > 100
    plot_h = PANEL_SIZE[1] - 32
    left_ys = ys[xs <= xs.min() + 2]
    right_ys = ys[xs >= xs.max() - 2]
    assert left_ys.min() > 0.6 * plot_h  # first point low
    assert right_ys.max() < 0.4 * plot_h  # last point high
    assert xs.min() < 0.3 * PANEL_SIZE[0] and xs.max() > 0.7 * PANEL_SIZE[0]
    assert not np.any(np.all(panel == SPLIT_COLORS["val"], axis=-1))  # no val accuracy

    # The loss panel (left) has the val curve too.
    left = pixels[30 + 32 :, : PANEL_SIZE[0]]
    assert np.any(np.all(left == SPLIT_COLORS["val"], axis=-1))


def test_plot_curves_degenerate_inputs(tmp_path):
    records = [{"kind": "epoch", "epoch": 1, "loss": 0.5, "val_loss": math.nan}]
    path = plot_curves(records, tmp_path / "one.png", metrics=("loss", "missing"))
    with Image.open(path) as image:
        assert image.size == PANEL_SIZE
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
