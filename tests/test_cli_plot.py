"""`s5jax plot`: a comparison PNG of several runs, and one-line errors for what is missing."""

import json

import numpy as np
import pytest
from PIL import Image

from s5jax.cli import main
from s5jax.config import dump_json, load_experiment
from s5jax.train import MetricsLogger
from s5jax.train._plots import COMPARISON_SIZE, comparison_figure, curves_figure


def _run_dir(path, n_epochs, best_epoch):
    with MetricsLogger(path, tensorboard=False) as log:
        for e in range(1, n_epochs + 1):
            log.log_epoch(10 * e, e, train_loss=1.0 / e, val_accuracy=0.1 * e, val_loss=2.0 / e)
    dump_json(load_experiment("listops"), path / "config.json")
    (path / "results.json").write_text(json.dumps({"best_epoch": best_epoch}))
    return path


def test_plot_writes_a_png_of_several_runs(tmp_path, capsys):
    a = _run_dir(tmp_path / "a", 3, 3)
    b = _run_dir(tmp_path / "b", 5, 4)
    out = tmp_path / "cmp.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().err
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == COMPARISON_SIZE
        assert image.info["Software"] == "s5jax"  # the mark that lets a rerun replace it
    first = out.read_bytes()
    assert main(["plot", str(a), "--out", str(out), "--metric", "train_loss"]) == 0
    assert out.read_bytes() != first  # an earlier plot is replaced


def test_runs_of_different_kinds_plot_a_metric_they_share(tmp_path, capsys, monkeypatch):
    """A classifier beside a regression run: the default metric is the first default every
    run has (val_loss, not the first run's val_accuracy, which would leave the regression run
    a legend entry without a curve); a --metric one run lacks is an error naming that run
    and the metrics they share."""
    import s5jax.train._plots as plots

    a = _run_dir(tmp_path / "cls", 3, 3)
    b = tmp_path / "reg"
    with MetricsLogger(b, tensorboard=False) as log:
        for e in (1, 2):
            log.log_epoch(10 * e, e, train_loss=1.0 / e, val_mse=0.5 / e, val_loss=2.0 / e)
    drawn, curves, original = [], [], plots.comparison_figure

    def recording(runs, metric, **kwargs):
        drawn.append(metric)
        curves.append(runs)
        return original(runs, metric, **kwargs)

    monkeypatch.setattr(plots, "comparison_figure", recording)
    out = tmp_path / "mixed.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert drawn == ["val_loss"] and out.is_file()
    assert main(["plot", str(a), "--out", str(tmp_path / "one.png")]) == 0
    assert drawn[-1] == "val_accuracy"  # one classifier: its accuracy, as before
    (tmp_path / "sub").mkdir()
    assert main(["plot", str(a), str(tmp_path / "sub" / ".." / "cls"), "--out", str(out)]) == 0
    assert list(curves[-1]) == ["cls"]  # the same run given twice: drawn once
    capsys.readouterr()
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "x.png"),
                 "--metric", "val_accuracy"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err == ("s5jax plot: error: reg has no 'val_accuracy'; give --metric with one they "
                   "all have: step, train_loss, val_loss\n")  # fmt: skip
    assert not (tmp_path / "x.png").exists()


def _users_png(path):
    Image.new("RGB", (4, 4), "red").save(path, format="PNG")


def _users_jpeg(path):
    Image.new("RGB", (4, 4), "red").save(path, format="JPEG")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_users_png, "exists and is not a plot written by s5jax"),
        (_users_jpeg, "exists and is not a plot written by s5jax"),
        (lambda p: p.write_text("notes"), "exists and is not a plot written by s5jax"),
        (lambda p: (p.mkdir(), (p / "keep.txt").write_text("x")), "is a folder"),
    ],
)
def test_an_existing_out_that_s5jax_did_not_write_is_kept(tmp_path, capsys, make, message):
    """`--out` replaces an earlier plot (its PNG carries s5jax's Software mark), never a
    user's image, file or folder of that name."""
    run = _run_dir(tmp_path / "run", 2, 1)
    out = tmp_path / "figure.png"
    make(out)
    before = out.read_bytes() if out.is_file() else sorted(out.iterdir())
    assert main(["plot", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"s5jax plot: error: --out {out}") and message in err
    assert err.count("\n") == 1
    assert (out.read_bytes() if out.is_file() else sorted(out.iterdir())) == before


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.mkdir(), "metrics.jsonl not found"),
        (lambda d: _run_dir(d, 2, 1), "no run has the metric 'nope'"),
    ],
)
def test_plot_errors_are_one_line(tmp_path, capsys, setup, message):
    run = tmp_path / "run"
    setup(run)
    code = main(["plot", str(run), "--out", str(tmp_path / "x.png"), "--metric", "nope"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("s5jax plot: error: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def _damage_metrics(d):
    _run_dir(d, 2, 1)
    (d / "metrics.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n")


def _damage_results(d):
    _run_dir(d, 2, 1)
    (d / "results.json").write_text("{bad")


@pytest.mark.parametrize(
    ("damage", "message"),
    [(_damage_metrics, "metrics.jsonl is not a metrics file"), (_damage_results, "results.json")],
)
def test_a_damaged_run_file_is_named(tmp_path, capsys, damage, message):
    run = tmp_path / "run"
    damage(run)
    assert main(["plot", str(run), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"s5jax plot: error: {run}") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["run/metrics.jsonl", "run/curves.png", "cmp.jpg"])
def test_an_out_that_would_replace_a_run_file_is_refused_first(tmp_path, capsys, name):
    """--out must be a .png outside the runs: `--out RUN/metrics.jsonl` replaced the run's
    metrics with a PNG."""
    run = _run_dir(tmp_path / "run", 2, 1)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["plot", str(run), "--out", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("s5jax plot: error: --out ") and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_seeds_or_sweep_directory_plots_its_runs(tmp_path, capsys):
    """`s5jax plot runs/x-seeds` draws every `seed-N/` run in it (numeric order), a sweep
    directory its `trial-NNN/` runs; other folders inside are not runs and are left out."""
    from s5jax.train._plots import _runs_in

    seeds = tmp_path / "seeds"
    for n in (10, 2, 0):
        _run_dir(seeds / f"seed-{n}", 2, 1)
    (seeds / "seed-5").mkdir()  # not started: no metrics
    (seeds / "notes").mkdir()
    assert _runs_in(seeds) == [seeds / "seed-0", seeds / "seed-2", seeds / "seed-10"]
    assert _runs_in(seeds / "seed-2") == [seeds / "seed-2"]
    out = tmp_path / "seeds.png"
    assert main(["plot", str(seeds), "--out", str(out)]) == 0
    with Image.open(out) as image:
        assert image.format == "PNG"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plot", str(empty), "--out", str(tmp_path / "e.png")]) == 2
    assert "empty/metrics.jsonl not found" in capsys.readouterr().err
    # --out may not go into the seeds directory either
    assert main(["plot", str(seeds), "--out", str(seeds / "cmp.png")]) == 2
    assert "is inside the run directory" in capsys.readouterr().err


def test_plot_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plot", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "s5jax plot runs/" in out and "--metric NAME" in out


@pytest.mark.parametrize(
    "lo, hi", [(3.1e-3, 3.8e-3), (0.97, 2.05), (1e-3, 0.5), (1e-6, 1.0)],
    ids=["a pendulum's val mse", "a factor of 2", "2.7 decades", "6 decades"],
)  # fmt: skip
def test_log_axes_label_several_plain_ticks_and_epochs_are_whole(lo, hi):
    """A positive loss of any span gets at least three labelled ticks within the axis, as
    plain numbers (0.0035, not mathtext powers), and no more than ten; the epoch axis has
    whole numbers only (matplotlib's own: one or no label under a decade, 1.25 epochs)."""
    records = [{"kind": "epoch", "epoch": e, "val_mse": float(v)}
               for e, v in enumerate(np.geomspace(hi, lo, 4), start=1)]  # fmt: skip
    for figure in (comparison_figure({"a": records}, "val_mse"),
                   curves_figure(records, metrics=("mse",))):  # fmt: skip
        figure.canvas.draw()
        ax = figure.axes[0]
        assert ax.get_yscale() == "log"
        y0, y1 = ax.get_ylim()
        shown = [(loc, t.get_text()) for loc, t in zip(ax.get_yticks(), ax.get_yticklabels(),
                                                      strict=True) if y0 <= loc <= y1]  # fmt: skip
        labels = [(loc, text) for loc, text in shown if text]
        assert 3 <= len(labels) <= 10, labels
        for loc, text in labels:
            assert float(text) == pytest.approx(loc, rel=1e-6), text
        x0, x1 = ax.get_xlim()
        assert all(float(x).is_integer() for x in ax.get_xticks() if x0 <= x <= x1)
