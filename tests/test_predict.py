"""`s5jax predict` / `predict_run`: the predictions of a run's checkpoint on new data agree with
the model applied to each example alone, the printed metric with `s5jax eval`, and streamed
predictions with the offline ones; bad inputs are one-line errors and leave no file behind."""

import io
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from s5jax.cli import main
from s5jax.config import dump_json
from s5jax.data import DatasetError
from s5jax.train import evaluate_run, load_run, predict_run, user_data_config
from s5jax.train._checkpoint import Checkpoints
from s5jax.train._engine import _Run
from s5jax.train._predict import balanced_accuracy
from s5jax.train._steps import balanced_accuracy_of

from ._fixtures import read_npz

# The data-aware defaults' choices that matter here pinned to fixed values: unidirectional,
# LayerNorm, raw inputs (the tests compare with the model applied to the raw arrays).
TINY = ["model.n_layers=2", "model.d_model=8", "model.ssm_size=8", "model.blocks=2",
        "data.batch_size=8", "data.eval_batch_size=8", "model.bidirectional=false",
        "model.norm=layer", "data.normalize=none"]  # fmt: skip


def make_run(tmp_path, arrays, *overrides, name="run"):
    """A run directory as `s5jax train --data` leaves it, without the training: config.json
    and `best`/`latest` checkpoints of the initial model."""
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    config, dataset = user_data_config(path, [*TINY, *overrides])
    run_dir = tmp_path / name
    run = _Run(config, run_dir, dataset, io.StringIO())
    run.build()
    run_dir.mkdir()
    dump_json(config, run_dir / "config.json")
    ckpt = Checkpoints(run_dir)
    ckpt.save("best", 0, run.train_state(), {})
    ckpt.save("latest", 0, run.train_state(), {})
    ckpt.close()
    return run_dir, path


def features(rng, n=20, L=10, D=3, classes=3, lengths=False, times=False):
    arrays = {}
    for split, m in (("train", n), ("val", 8), ("test", n)):
        arrays[f"x_{split}"] = rng.standard_normal((m, L, D)).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, classes, m)
        if lengths:
            arrays[f"lengths_{split}"] = rng.integers(1, L + 1, m)
        if times:
            arrays[f"t_{split}"] = np.cumsum(rng.uniform(0.1, 2.0, (m, L)), axis=1)
    return arrays


def alone(run_dir, x, lengths=None, dt=None):
    """The run's model on one example at a time (no batching, no padding)."""
    run = load_run(run_dir)
    model = eqx.combine(run.params, run.static)
    outs = []
    for i in range(len(x)):
        out, _ = model(
            jnp.asarray(x[i]), run.model_state, inference=True,
            lengths=None if lengths is None else jnp.asarray(lengths[i]),
            dt=None if dt is None else jnp.asarray(dt[i]),
        )  # fmt: skip
        outs.append(out)
    return jax.tree.map(lambda *o: np.stack(o), *outs)


def test_classification_predictions_and_metric_equal_eval(tmp_path, capsys):
    rng = np.random.default_rng(0)
    arrays = features(rng, lengths=True)
    run_dir, path = make_run(tmp_path, arrays, "model.pooling=masked_mean")
    out = tmp_path / "pred.npz"
    # 20 examples in batches of 8: the last batch is padded.
    code = main(["predict", str(run_dir), "--data", str(path), "--out", str(out),
                 "--no-progress", "--batch-size", "8"])  # fmt: skip
    assert code == 0
    line = json.loads(capsys.readouterr().out)
    pred = read_npz(out)
    assert sorted(pred) == ["log_probs", "pred"]
    want = alone(run_dir, arrays["x_test"], arrays["lengths_test"].astype(np.int32))
    np.testing.assert_allclose(pred["log_probs"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pred["pred"], np.argmax(pred["log_probs"], -1))
    ev = evaluate_run(run_dir, split="test")
    assert line["split"] == "test" and line["n"] == 20 and line["out"] == str(out)
    assert line["loss"] == pytest.approx(ev["loss"], abs=1e-6)
    assert line["accuracy"] == pytest.approx(ev["accuracy"], abs=1e-6)
    # scikit-learn's definition, on the written predictions
    assert line["balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(arrays["y_test"], pred["pred"]), abs=1e-12
    )
    assert ev["balanced_accuracy"] == pytest.approx(line["balanced_accuracy"], abs=1e-6)
    # New inputs without lengths: every step is valid, so the masked mean pools all L steps.
    x = arrays["x_test"][:5]
    np.savez(tmp_path / "new.npz", x=x)
    predict_run(run_dir, out, data=tmp_path / "new.npz", progress=False)
    want = alone(run_dir, x, np.full(5, x.shape[1], np.int32))
    np.testing.assert_allclose(read_npz(out)["log_probs"], want, rtol=1e-5, atol=1e-6)
    short = alone(run_dir, x, np.full(5, x.shape[1] - 1, np.int32))
    assert not np.allclose(want, short, atol=1e-4)  # the last step matters to the mean


def test_x_only_file_without_targets_and_irregular_times(tmp_path, capsys):
    rng = np.random.default_rng(1)
    arrays = features(rng, times=True)
    # Per-step targets: a per-step regression run (no pooling).
    for s in ("train", "val", "test"):
        arrays[f"y_{s}"] = rng.standard_normal(arrays[f"x_{s}"].shape[:2]).astype(np.float32)
    run_dir, _ = make_run(tmp_path, arrays, "model.timestep_mode=irregular", name="reg")
    x, t = arrays["x_test"][:5], arrays["t_test"][:5]
    new = tmp_path / "new.npz"
    np.savez(new, x=x, t=t)
    out = tmp_path / "p.npz"
    result = predict_run(run_dir, out, data=new, progress=False)
    assert result == {"split": None, "n": 5, "out": str(out)}
    dt = np.concatenate([np.ones_like(t[:, :1]), np.diff(t, axis=1)], axis=1).astype(np.float32)
    want = alone(run_dir, x, dt=dt)
    got = read_npz(out)["pred"]
    assert got.shape == (5, 10)  # as the file gave the targets: one per step, (N, L)
    np.testing.assert_allclose(got, want[..., 0], rtol=1e-5, atol=1e-6)
    # The Δ multipliers matter: without t the predictions differ.
    np.savez(new, x=x)
    predict_run(run_dir, out, data=new, progress=False)
    assert not np.allclose(read_npz(out)["pred"], want[..., 0], atol=1e-4)


def test_labels_by_name_equal_labels_by_index(tmp_path, capsys):
    """A run trained on class names: predict reads labels by name (the metric equals that of
    the same labels as indices), names its classes, and refuses a name it was not trained on."""
    rng = np.random.default_rng(4)
    arrays = features(rng)
    names = np.array(["low", "mid", "high"])  # numbered in sorted order: high, low, mid
    named = {k: names[v] if k.startswith("y_") else v for k, v in arrays.items()}
    run_dir, _ = make_run(tmp_path, named)
    assert load_run(run_dir).dataset.meta["classes"] == ["high", "low", "mid"]
    index = {"high": 0, "low": 1, "mid": 2}
    x, y = arrays["x_test"], named["y_test"]
    np.savez(tmp_path / "by_name.npz", x=x, y=y)
    np.savez(tmp_path / "by_index.npz", x=x, y=np.array([index[c] for c in y]))
    got = {}
    for kind in ("by_name", "by_index"):
        out = tmp_path / f"{kind}-pred.npz"
        got[kind] = predict_run(run_dir, out, data=tmp_path / f"{kind}.npz", progress=False)
        assert read_npz(out)["classes"].tolist() == ["high", "low", "mid"]
    assert got["by_name"]["accuracy"] == got["by_index"]["accuracy"]
    assert got["by_name"]["loss"] == pytest.approx(got["by_index"]["loss"], rel=1e-6)
    np.savez(tmp_path / "new.npz", x=x[:3], y=np.array(["low", "top", "mid"]))
    out = tmp_path / "p.npz"
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "new.npz"),
                 "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err == (
        f"s5jax predict: error: {tmp_path / 'new.npz'}: 'y' has class name(s) 'top' that the "
        "run was not trained on (its classes: high, low, mid)"
    )
    assert not out.exists()


def test_class_names_that_are_numbers_are_not_taken_for_indices(tmp_path, caplog, capsys):
    """Classes named 1, 2, 10 (a .ts file's labels): integer labels are indices, said when
    they could be names; names beyond the indices get an error naming both ways."""
    rng = np.random.default_rng(6)
    arrays = features(rng) | {"classes": np.array(["1", "2", "10"])}
    run_dir, _ = make_run(tmp_path, arrays)
    x = arrays["x_test"][:4]
    out = tmp_path / "p.npz"
    results = {}
    for name, y in {"names": np.array(["10", "1", "2", "2"]), "indices": np.array([2, 0, 1, 1]),
                    "ambiguous": np.array([2, 1, 1, 2])}.items():  # fmt: skip
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
        caplog.clear()
        with caplog.at_level("WARNING", logger="s5jax"):
            results[name] = predict_run(run_dir, out, data=tmp_path / f"{name}.npz",
                                        progress=False)  # fmt: skip
        warned = [r.getMessage() for r in caplog.records if "class indices" in r.getMessage()]
        assert len(warned) == (name == "ambiguous"), (name, warned)
    assert results["names"]["loss"] == pytest.approx(results["indices"]["loss"], rel=1e-6)
    assert warned[0] == (
        f"{tmp_path / 'ambiguous.npz'}: 'y' holds integer labels, read as class indices (0 is "
        "class '1', 1 is '2', ...), but they are also names of the run's classes (1, 2, 10); "
        "to give names, store them as strings (np.asarray(y).astype(str))"
    )
    np.savez(tmp_path / "beyond.npz", x=x, y=np.array([10, 1, 2, 2]))
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "beyond.npz"),
                 "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "'y' has label 10; the run has 3 classes (labels 0 .. 2); its classes are named 1, 2, "
        "10: give a class by its index, or labels as names (np.asarray(y).astype(str))"
    )


@pytest.mark.parametrize(
    "shape, per_step",
    [((), False), ((2,), False), ((10,), True), ((10, 2), True)],
    ids=["(N,)", "(N,K)", "(N,L)", "(N,L,K)"],
)
def test_regression_predictions_have_the_targets_shape(tmp_path, capsys, shape, per_step):
    """`pred` has the shape of the file's `y`, so that the user's own `pred - y` is the
    elementwise error whose mean square is the printed mse (with `pred` (N, 1) against
    `y` (N,) it would broadcast to (N, N) without a word)."""
    rng = np.random.default_rng(5)
    arrays = features(rng)
    for s in ("train", "val", "test"):
        n = len(arrays[f"x_{s}"])
        arrays[f"y_{s}"] = rng.standard_normal((n, *shape)).astype(np.float32)
    run_dir, path = make_run(tmp_path, arrays)
    out = tmp_path / "pred.npz"
    for argv in (["--data", str(path)], []):  # the file, and the run's own data
        assert main(["predict", str(run_dir), *argv, "--out", str(out), "--no-progress"]) == 0
        line = json.loads(capsys.readouterr().out)
        pred, y = read_npz(out)["pred"], arrays["y_test"]
        assert pred.shape == y.shape
        assert line["mse"] == pytest.approx(float(np.mean((pred - y) ** 2)), rel=1e-5)
    if per_step:  # a new file of another length keeps the per-step layout
        np.savez(tmp_path / "new.npz", x=arrays["x_test"][:3, :7])
        predict_run(run_dir, out, data=tmp_path / "new.npz", progress=False)
        assert read_npz(out)["pred"].shape == (3, 7, *shape[1:])


def test_per_step_figures_read_only_the_valid_steps(tmp_path, capsys):
    """Per-step targets of padded sequences: the mse of predict and eval is the mean over
    examples of each one's mean square error over its valid steps (numpy, from `pred`), and
    the padding (targets of 0, 100 or NaN, inputs of 0 or NaN) changes nothing. Padding
    targets entered the loss and the figures before (a run fitted its padding)."""
    rng = np.random.default_rng(7)
    arrays = features(rng, lengths=True)
    for s in ("train", "val", "test"):
        arrays[f"y_{s}"] = rng.standard_normal(arrays[f"x_{s}"].shape[:2]).astype(np.float32)
    x, y, n = arrays["x_test"], arrays["y_test"], arrays["lengths_test"]
    valid = np.arange(y.shape[1])[None, :] < n[:, None]
    figures, preds = [], []
    for name, x_pad, y_pad in (("zero", 0.0, 0.0), ("hundred", 0.0, 100.0),
                               ("nan", np.nan, np.nan)):  # fmt: skip
        padded = {**arrays, "x_test": np.where(valid[..., None], x, x_pad).astype(np.float32),
                  "y_test": np.where(valid, y, y_pad).astype(np.float32)}  # fmt: skip
        run_dir, path = make_run(tmp_path, padded, name=name)
        out = tmp_path / f"{name}.pred.npz"
        assert main(["predict", str(run_dir), "--data", str(path), "--out", str(out),
                     "--no-progress"]) == 0  # fmt: skip
        line = json.loads(capsys.readouterr().out)
        pred = read_npz(out)["pred"]
        assert np.isfinite(pred).all()  # NaN inputs on the padding read as zeros
        per_example = np.sum(np.where(valid, (pred - y) ** 2, 0), axis=1) / n
        assert line["mse"] == pytest.approx(float(np.mean(per_example)), rel=1e-5)
        figures.append((line["mse"], evaluate_run(run_dir)["mse"]))
        preds.append(pred)
        if name == "nan":  # a new file (x, y, lengths): read by predict's own reader
            new = tmp_path / "new.npz"
            np.savez(new, x=padded["x_test"], y=padded["y_test"], lengths=n)
            got = predict_run(run_dir, out, data=new, progress=False)
            assert got["mse"] == pytest.approx(line["mse"], rel=1e-6)
    assert figures[0][0] == pytest.approx(figures[0][1], rel=1e-5)  # predict = eval
    for other, pred in zip(figures[1:], preds[1:], strict=True):
        assert other == pytest.approx(figures[0], rel=1e-6)
        np.testing.assert_allclose(pred[valid], preds[0][valid], rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One small classification run (3 features, 3 classes, L = 10) shared by a module."""
    tmp = tmp_path_factory.mktemp("small")
    return make_run(tmp, features(np.random.default_rng(2), n=8))[0]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"x": np.zeros((4, 10, 2), np.float32)}, "D = 3"),
        ({"x": np.zeros((4, 10), np.int64)}, "integer token ids"),
        ({"x": np.full((4, 10, 3), np.nan, np.float32)}, "NaN"),
        ({"x": np.zeros((4, 10, 3), np.float32), "lengths": np.full(4, 11)}, "'lengths'"),
        ({"x": np.zeros((4, 10, 3), np.float32), "t": np.zeros((4, 9))}, "'t'"),
        ({"x": np.zeros((4, 10, 3), np.float32), "y": np.full(4, 3)}, "3 classes"),
        (
            {"x": np.zeros((4, 10, 3), np.float32), "y": np.array(["a"] * 4)},
            "holds class names but this run was trained on unnamed labels 0 .. 2",
        ),
        ({"x_val": np.zeros((4, 10, 3), np.float32)}, "--split"),
    ],
)
def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, capsys, bad, message, small):
    run_dir = small
    path = tmp_path / "bad.npz"
    np.savez(path, **bad)
    out = tmp_path / "pred.npz"
    assert main(["predict", str(run_dir), "--data", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("s5jax predict: error: ") and "\n" not in err
    assert message in err
    assert list(tmp_path.glob("pred.npz*")) == []


def test_data_that_is_not_an_npz_shows_the_keys_predict_reads(tmp_path, capsys, small):
    path = tmp_path / "new.npz"
    path.write_text("x,y\n1,2\n")
    out = tmp_path / "pred.npz"
    assert main(["predict", str(small), "--data", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("s5jax predict: error: ") and err.count("\n") == 1
    assert "not an .npz file; write your arrays with np.savez(path, x=...)" in err
    assert "x_train" not in err and not out.exists()


def test_an_out_that_is_a_folder_or_the_data_is_refused_first(tmp_path, capsys, small):
    """`--out` naming a folder, or the `--data` file itself (through another spelling of its
    path), is a one-line error before any work, and the data file is left as it was."""
    data = tmp_path / "new.npz"
    np.savez(data, x=np.zeros((4, 10, 3), np.float32))
    before = data.read_bytes()
    (tmp_path / "preds").mkdir()
    cases = ((tmp_path / "preds", "is a folder"), (tmp_path / "." / "new.npz", "the --data file"),
             (small / "config.json", "ending in .npz"))  # fmt: skip
    run_files = {p.name: p.read_bytes() for p in small.iterdir() if p.is_file()}
    for out, words in cases:
        assert main(["predict", str(small), "--data", str(data), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("s5jax predict: error: --out ") and words in err, err
    assert data.read_bytes() == before
    assert {p.name: p.read_bytes() for p in small.iterdir() if p.is_file()} == run_files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.npz", "preds"]
    assert list((tmp_path / "preds").iterdir()) == []


def test_an_existing_out_is_replaced_only_when_it_holds_predictions(tmp_path, capsys, small):
    """An earlier predictions file is replaced; a user's other data file, or a file numpy
    cannot read, under the `--out` name is kept and the command refused before any work."""
    data = tmp_path / "new.npz"
    np.savez(data, x=np.zeros((4, 10, 3), np.float32))
    other = tmp_path / "other.npz"
    np.savez(other, x=np.ones((2, 10, 3), np.float32), pred=np.zeros(2))
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    for out in (other, text):
        before = out.read_bytes()
        assert main(["predict", str(small), "--data", str(data), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"s5jax predict: error: --out {out} exists and is not an s5jax")
        assert err.count("\n") == 1 and out.read_bytes() == before
    earlier = tmp_path / "pred.npz"
    np.savez(earlier, log_probs=np.zeros((1, 3)), pred=np.zeros(1, np.int32))
    assert main(["predict", str(small), "--data", str(data), "--out", str(earlier)]) == 0
    with np.load(earlier) as f:
        assert sorted(f.files) == ["log_probs", "pred"] and f["pred"].shape == (4,)


def test_val_of_a_file_without_val_keys_points_at_the_carve(tmp_path, capsys, small):
    data = tmp_path / "noval.npz"
    np.savez(data, x_train=np.zeros((4, 10, 3), np.float32), x_test=np.zeros((2, 10, 3)))
    argv = ["predict", str(small), "--data", str(data), "--split", "val", "--out", "p.npz"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has no key 'x_val' (splits in the file: test, train)" in err
    assert "`s5jax predict RUN --split val` without --data" in err and err.count("\n") == 1


def test_an_unknown_split_names_the_splits(capsys, small):
    assert main(["eval", str(small), "--split", "nope"]) == 2
    err = capsys.readouterr().err
    want = "--split 'nope': the run's data has the splits test, train, val"
    assert err == f"s5jax eval: error: {want}\n"


def test_a_named_dataset_of_another_width_is_a_one_line_error(tmp_path, capsys):
    """`--data synthetic` (D = 1) on a run trained on D = 3 with per-channel statistics: the
    width is checked before the run's normalisation (it failed inside numpy's broadcasting)."""
    run_dir, _ = make_run(tmp_path, features(np.random.default_rng(5), n=8),
                          "data.normalize=channel")  # fmt: skip
    assert json.loads((run_dir / "config.json").read_text())["data"]["normalize"] == "channel"
    out = tmp_path / "p.npz"
    for split, words in (
        ("test", "this run's model reads (N, L, D) float features with D = 3"),
        ("nope", "--split 'nope': synthetic has the splits test, train, val"),
    ):
        argv = ["predict", str(run_dir), "--data", "synthetic", "--split", split, "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("s5jax predict: error: ") and words in err and err.count("\n") == 1
    assert not out.exists()


def test_a_run_whose_training_file_moved_says_so(tmp_path, capsys):
    run_dir, path = make_run(tmp_path, features(np.random.default_rng(4), n=8))
    new = tmp_path / "new.npz"
    np.savez(new, x=np.zeros((2, 10, 3), np.float32))
    path.rename(tmp_path / "moved.npz")
    for argv in (["eval", str(run_dir)],
                 ["predict", str(run_dir), "--data", str(new), "--out", str(tmp_path / "p.npz")],
                 ["export", str(run_dir), "--out", str(tmp_path / "exp")]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"was trained on {path}, which is not there any more: put the file back" in err
        assert "\n" not in err
    assert not (tmp_path / "p.npz").exists() and not (tmp_path / "exp").exists()


def test_tokens_outside_the_vocabulary_and_floats_for_tokens(tmp_path):
    rng = np.random.default_rng(3)
    arrays = {}
    for s in ("train", "val", "test"):
        arrays[f"x_{s}"] = rng.integers(0, 7, (8, 6))
        arrays[f"y_{s}"] = rng.integers(0, 2, 8)
    arrays["vocab_size"] = 7
    run_dir, _ = make_run(tmp_path, arrays)
    path = tmp_path / "tok.npz"
    np.savez(path, x=np.full((2, 6), 7))
    with pytest.raises(DatasetError, match=r"token id 7 outside the run.s vocabulary 0 \.\. 6"):
        predict_run(run_dir, tmp_path / "p.npz", data=path, progress=False)
    np.savez(path, x=np.zeros((2, 6, 1), np.float32))
    with pytest.raises(DatasetError, match=r"reads token ids \(N, L\) integer"):
        predict_run(run_dir, tmp_path / "p.npz", data=path, progress=False)
    np.savez(path, x=arrays["x_test"][:3])
    predict_run(run_dir, tmp_path / "p.npz", data=path, progress=False)
    want = alone(run_dir, arrays["x_test"][:3].astype(np.int32))
    np.testing.assert_allclose(read_npz(tmp_path / "p.npz")["log_probs"], want, rtol=1e-5,
                               atol=1e-6)  # fmt: skip


# Streamed (one recurrent step at a time) against offline (the scan over the whole sequence):
# the same float32 recurrence summed in another order, a few ulps per step over 10 steps and
# two layers on outputs of order 1, so 1e-5 relative and absolute.
STREAM_TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("per_step", [False, True])
def test_streamed_predictions_equal_offline(tmp_path, capsys, per_step):
    rng = np.random.default_rng(4)
    arrays = features(rng, lengths=not per_step, times=True)
    overrides = ["model.timestep_mode=irregular"]
    if per_step:
        for s in ("train", "val", "test"):
            arrays[f"y_{s}"] = rng.standard_normal(arrays[f"x_{s}"].shape[:2]).astype(np.float32)
    else:
        overrides.append("model.pooling=masked_mean")
    run_dir, path = make_run(tmp_path, arrays, *overrides)
    lines = {}
    for mode in ("offline", "stream"):
        out = tmp_path / f"{mode}.npz"
        argv = ["predict", str(run_dir), "--data", str(path), "--out", str(out), "--no-progress"]
        assert main(argv + (["--stream"] if mode == "stream" else [])) == 0
        lines[mode] = json.loads(capsys.readouterr().out)
    offline, streamed = read_npz(tmp_path / "offline.npz"), read_npz(tmp_path / "stream.npz")
    key = "pred" if per_step else "log_probs"
    assert streamed[key].shape == offline[key].shape == ((20, 10) if per_step else (20, 3))
    np.testing.assert_allclose(streamed[key], offline[key], **STREAM_TOL)
    metric = "mse" if per_step else "accuracy"
    assert lines["stream"][metric] == pytest.approx(lines["offline"][metric], abs=1e-5)


def test_stream_of_a_bidirectional_model_is_a_one_line_error(tmp_path, capsys):
    rng = np.random.default_rng(5)
    run_dir, _ = make_run(tmp_path, features(rng, n=8), "model.bidirectional=true")
    out = tmp_path / "p.npz"
    assert main(["predict", str(run_dir), "--out", str(out), "--stream"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("s5jax predict: error: ") and "bidirectional" in err and "\n" not in err
    assert not out.exists()


def test_help_of_predict_and_export(capsys):
    for command in ("predict", "export"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "s5jax predict runs/mine --data new.npz --out pred.npz" in out
    assert "s5jax export runs/mine --out exported/mine" in out


def test_balanced_accuracy_is_scikit_learns():
    rng = np.random.default_rng(5)
    for _ in range(20):
        C = int(rng.integers(2, 6))
        y = rng.choice(C, 60, p=rng.dirichlet(np.ones(C)))
        y[:C] = np.arange(C)  # every class present in y
        pred = rng.integers(0, C, 60)
        assert balanced_accuracy(pred, y) == pytest.approx(balanced_accuracy_score(y, pred))
    # a constant majority prediction: the majority's share in accuracy, 1 / C here
    y = np.array([0] * 9 + [1])
    assert balanced_accuracy(np.zeros(10, int), y) == 0.5
    # per step: the valid steps of all examples, pooled by class (padding never read)
    y = np.array([[0, 0, 1, 9], [1, 1, 9, 9]])
    pred = np.array([[0, 1, 1, 0], [0, 1, 0, 0]])
    got = balanced_accuracy(pred, y, np.array([3, 2]))
    assert got == pytest.approx(balanced_accuracy_score([0, 0, 1, 1, 1], [0, 1, 1, 0, 1]))
    # eval's form, from per-class sums: a class without items (1) does not count
    assert balanced_accuracy_of([1.0, 0.0, 3.0], [2.0, 0.0, 4.0]) == pytest.approx(0.625)
