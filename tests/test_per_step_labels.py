"""One class label per step (sequence labelling): an own `.npz` with labels `y` of shape
(N, L), integers or class names, whose padding steps (beyond `lengths_*`) may hold anything.

Views that must agree: the reader's labels with the file's on the valid steps; the figures
of `s5jax predict` and `s5jax eval` with numpy's mean, over examples, of each one's accuracy
on its valid steps, computed from the written `pred`; streamed with offline predictions;
labels by name with labels by number. (A training step whatever the padding's labels:
`tests/test_effects.py::test_padding_targets_do_not_move_a_training_step`.)"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score

from s5jax.cli import main
from s5jax.data import DatasetError, load_user_npz
from s5jax.train import evaluate_run, export_run, predict_run
from s5jax.train._runs import user_data_defaults

from ._fixtures import read_npz
from .test_predict import alone, make_run

L, CLASSES = 10, 3
NAMES = np.array(["high", "low", "mid"])  # sorted: the names' label order


def labelled(rng, n=20, lengths=True, pad_label=-1):
    """Features and per-step labels of three classes; padding labels `pad_label`."""
    arrays = {}
    for split, m in (("train", n), ("val", 8), ("test", n)):
        x = rng.standard_normal((m, L, 2)).astype(np.float32)
        y = rng.integers(0, CLASSES, (m, L))
        if lengths:
            n_valid = rng.integers(1, L + 1, m)
            n_valid[0] = L  # one full example
            pad = np.arange(L)[None, :] >= n_valid[:, None]
            arrays[f"lengths_{split}"] = n_valid
            x[pad] = np.nan
            y = np.where(pad, pad_label, y)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    return arrays


def valid_steps(arrays, split):
    n = arrays[f"lengths_{split}"]
    return np.arange(L)[None, :] < n[:, None]


def test_the_reader_keeps_valid_labels_and_reads_padding_as_zero(tmp_path):
    rng = np.random.default_rng(0)
    arrays = labelled(rng)
    np.savez(tmp_path / "a.npz", **arrays)
    data = load_user_npz(tmp_path / "a.npz")
    assert data.task == "classification" and data.n_classes == CLASSES
    assert data.meta["per_step"] is True
    for s in ("train", "val", "test"):
        y, valid = data.splits[s].y, valid_steps(arrays, s)
        assert y.shape == arrays[f"y_{s}"].shape and y.dtype == np.int32
        np.testing.assert_array_equal(y[valid], arrays[f"y_{s}"][valid])
        assert (y[~valid] == 0).all()  # the file's −1 on padding: never read
    # Float labels (pandas) with NaN on the padding read the same.
    floats = {f"y_{s}": np.where(valid_steps(arrays, s), arrays[f"y_{s}"], np.nan)
              for s in ("train", "val", "test")}  # fmt: skip
    np.savez(tmp_path / "f.npz", **{**arrays, **floats, "task": np.array("classification")})
    from_floats = load_user_npz(tmp_path / "f.npz")
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(from_floats.splits[s].y, data.splits[s].y)


def test_per_step_class_names_are_numbered_over_the_valid_steps(tmp_path):
    rng = np.random.default_rng(1)
    arrays = labelled(rng)
    np.savez(tmp_path / "n.npz", **arrays)
    named = dict(arrays)
    for s in ("train", "val", "test"):
        # names on the valid steps, "" (or anything) on the padding
        named[f"y_{s}"] = np.where(valid_steps(arrays, s), NAMES[arrays[f"y_{s}"] % 3], "")
    np.savez(tmp_path / "s.npz", **named)
    by_number, by_name = load_user_npz(tmp_path / "n.npz"), load_user_npz(tmp_path / "s.npz")
    assert by_name.meta["classes"] == NAMES.tolist() and by_name.meta["per_step"]
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(by_name.splits[s].y, by_number.splits[s].y)
    # an empty name on a valid step is a missing label
    named["y_test"] = named["y_test"].copy()
    named["y_test"][0, 2] = ""
    np.savez(tmp_path / "e.npz", **named)
    with pytest.raises(DatasetError, match=r"'y_test' has an empty class name at \(example, "
                       r"step\) \(0, 2\)"):  # fmt: skip
        load_user_npz(tmp_path / "e.npz")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a: a["y_train"].__setitem__((0, 4), -1),
            r"'y_train' has negative label -1 at "
            r"\(example, step\) \(0, 4\)",
        ),
        (
            lambda a: a.update(y_train=a["y_train"] + 0.5, task=np.array("classification")),
            r"'y_train' has non-integer label \d\.5 at \(example, step\) \(0, 0\)",
        ),
        (
            lambda a: a.update(y_val=a["y_val"][:, 0]),
            r"'y_val' has shape \(8,\) \(one label "
            r"per example\) but y_train has one per step",
        ),
        (
            lambda a: a.pop("lengths_train"),
            r"'y_train' has negative label -1 at \(example, "
            r"step\)",
        ),
    ],
    ids=["negative-valid", "not-whole", "mixed-ranks", "padding-without-lengths"],
)
def test_bad_per_step_labels_are_one_line_errors(tmp_path, change, message):
    arrays = labelled(np.random.default_rng(2))
    arrays["x_train"] = np.nan_to_num(arrays["x_train"])
    change(arrays)
    np.savez(tmp_path / "a.npz", **arrays)
    with pytest.raises(DatasetError, match=message):
        load_user_npz(tmp_path / "a.npz")


def test_classes_count_on_the_valid_steps_and_the_carve_is_random(tmp_path, caplog):
    rng = np.random.default_rng(3)
    arrays = labelled(rng, n=40, pad_label=0)
    for s in ("train", "val", "test"):  # labels 1 .. 3 on the valid steps, 0 on the padding
        arrays[f"y_{s}"] = np.where(valid_steps(arrays, s), arrays[f"y_{s}"] + 1, 0)
    np.savez(tmp_path / "a.npz", **arrays)
    caplog.set_level("WARNING", logger="s5jax")
    assert load_user_npz(tmp_path / "a.npz").n_classes == 4
    assert "labels start at 1: subtract 1" in caplog.text  # the padding's 0 is not a label
    without_val = {k: v for k, v in arrays.items() if not k.endswith("_val")}
    np.savez(tmp_path / "c.npz", **without_val)
    carved = load_user_npz(tmp_path / "c.npz")
    assert "4 of 40 drawn at random" in carved.meta["val_split"]  # no class per example


def test_defaults_choose_a_causal_per_step_classifier(tmp_path):
    arrays = labelled(np.random.default_rng(4))
    np.savez(tmp_path / "a.npz", **arrays)
    config, _, facts, chosen = user_data_defaults(tmp_path / "a.npz", [])
    assert facts.per_step and "per-step classification" in facts.describe()
    model = config.model
    assert (model.head, model.pooling) == ("classification", "none")
    assert model.causal and not model.bidirectional and model.norm == "layer"
    # the user's bidirectional layers, or model.causal = false, read whole sequences
    for setting in ("model.bidirectional=true", "model.causal=false"):
        config, _, _, chosen = user_data_defaults(tmp_path / "a.npz", [setting])
        assert not config.model.causal and config.model.bidirectional, setting
        assert config.model.norm == "batch"
        reasons = " ".join(c.reason for c in chosen)
        assert setting.replace("=", " = ") in reasons


def _accuracy(pred, y, n):
    """numpy: the mean over examples of each one's accuracy on its valid steps."""
    return float(np.mean([np.mean(pred[i, : n[i]] == y[i, : n[i]]) for i in range(len(n))]))


def test_predict_eval_stream_and_export_agree(tmp_path, capsys, user_facing):
    # (`user_facing`: the test-time jaxtyping checks reject the export's symbolic length.)
    rng = np.random.default_rng(6)
    arrays = labelled(rng)
    run_dir, path = make_run(tmp_path, arrays)
    x, y, n = arrays["x_test"], arrays["y_test"], arrays["lengths_test"]
    out = {}
    for mode in ("offline", "stream"):
        out[mode] = tmp_path / f"{mode}.npz"
        argv = ["predict", str(run_dir), "--data", str(path), "--out", str(out[mode]),
                "--no-progress"] + (["--stream"] if mode == "stream" else [])  # fmt: skip
        assert main(argv) == 0
        line = json.loads(capsys.readouterr().out)
        got = read_npz(out[mode])
        assert got["log_probs"].shape == (len(x), L, CLASSES) and got["pred"].shape == (len(x), L)
        assert line["accuracy"] == pytest.approx(_accuracy(got["pred"], y, n), abs=1e-6)
        # balanced accuracy pools the valid steps of all examples (scikit-learn's definition)
        valid = np.arange(L)[None, :] < n[:, None]
        want = balanced_accuracy_score(y[valid], got["pred"][valid])
        assert line["balanced_accuracy"] == pytest.approx(want, abs=1e-12)
    offline, streamed = read_npz(out["offline"]), read_npz(out["stream"])
    valid = valid_steps(arrays, "test")
    np.testing.assert_allclose(streamed["log_probs"][valid], offline["log_probs"][valid],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # the model on each example alone, its padding cut off
    for i in (0, 1, 5):
        want = alone(run_dir, np.nan_to_num(x[i : i + 1, : n[i]]))[0]
        np.testing.assert_allclose(offline["log_probs"][i, : n[i]], want, rtol=1e-5, atol=1e-5)
    evaluated = evaluate_run(run_dir)
    assert evaluated["accuracy"] == pytest.approx(line["accuracy"], abs=1e-6)
    # eval's balanced accuracy, summed per class on the device, = predict's (scikit-learn's)
    assert evaluated["balanced_accuracy"] == pytest.approx(line["balanced_accuracy"], abs=1e-6)
    # a new file (x, y, lengths), read by predict's own reader: the same figure
    np.savez(tmp_path / "new.npz", x=x, y=np.where(valid, y, -1), lengths=n)
    assert predict_run(run_dir, tmp_path / "p.npz", data=tmp_path / "new.npz",
                       progress=False)["accuracy"] == pytest.approx(line["accuracy"])  # fmt: skip
    # the exported forward: per-step log-probabilities of any length
    folder = export_run(run_dir, tmp_path / "exp")
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["forward"]["outputs"][0]["shape"] == ["b", "l", CLASSES]


def test_a_run_trained_on_names_predicts_names(tmp_path, capsys):
    rng = np.random.default_rng(7)
    arrays = labelled(rng)
    for s in ("train", "val", "test"):
        arrays[f"y_{s}"] = np.where(valid_steps(arrays, s), NAMES[arrays[f"y_{s}"] % 3], "")
    run_dir, _ = make_run(tmp_path, arrays)
    np.savez(tmp_path / "new.npz", x=arrays["x_test"], y=arrays["y_test"],
             lengths=arrays["lengths_test"])  # fmt: skip
    got = predict_run(run_dir, tmp_path / "p.npz", data=tmp_path / "new.npz", progress=False)
    pred = read_npz(tmp_path / "p.npz")
    assert pred["classes"].tolist() == NAMES.tolist()
    named = pred["classes"][pred["pred"]]
    n = arrays["lengths_test"]
    want = np.mean([np.mean(named[i, : n[i]] == arrays["y_test"][i, : n[i]])
                    for i in range(len(n))])  # fmt: skip
    assert got["accuracy"] == pytest.approx(float(want), abs=1e-6)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    kind=st.sampled_from(["int", "float", "str"]),
    n=st.integers(2, 6),
    length=st.integers(1, 7),
)
def test_any_padding_reads_as_label_zero(tmp_path, data, kind, n, length):
    """Random lengths, labels and padding content (any integer, NaN or infinity, any name or
    none): the labels read equal the file's on the valid steps (names numbered in sorted order)
    and 0 on the padding, whatever the padding held."""
    lengths = {s: np.array(data.draw(st.lists(st.integers(1, length), min_size=n, max_size=n)))
               for s in ("train", "test")}  # fmt: skip
    arrays, valid = {}, {}
    for s in ("train", "test"):
        valid[s] = np.arange(length)[None, :] < lengths[s][:, None]
        labels = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n * length,
                                             max_size=n * length))).reshape(n, length)  # fmt: skip
        labels[:, 0] = np.arange(n) % 3  # every class on a valid step of each split
        labels[0, 0], labels[1 % n, 0] = 0, 1
        if kind == "int":
            pad = data.draw(st.integers(-(2**40), 2**40))
            y = np.where(valid[s], labels, pad)
        elif kind == "float":
            pad = data.draw(st.sampled_from([np.nan, np.inf, -1.5, 1e30]))
            y = np.where(valid[s], labels.astype(float), pad)
        else:
            pad = data.draw(st.sampled_from(["", "pad", "zebra", "a"]))
            y = np.where(valid[s], NAMES[labels], pad)
        arrays |= {f"x_{s}": np.zeros((n, length, 1), np.float32), f"y_{s}": y,
                   f"lengths_{s}": lengths[s], f"_labels_{s}": labels}  # fmt: skip
    expected = {s: arrays.pop(f"_labels_{s}") for s in ("train", "test")}
    if kind == "float":
        arrays["task"] = np.array("classification")
    path = tmp_path / f"{kind}.npz"
    np.savez(path, **arrays)
    got = load_user_npz(path, val_fraction=0)
    classes = sorted(set(np.concatenate([expected[s][valid[s]] for s in expected]).tolist()))
    for s in ("train", "test"):
        y = got.splits[s].y
        assert (y[~valid[s]] == 0).all()
        want = expected[s][valid[s]]
        if kind == "str":  # numbered by the sorted names of the classes used
            names = sorted(NAMES[classes].tolist())
            want = np.array([names.index(c) for c in NAMES[want]])
        np.testing.assert_array_equal(y[valid[s]], want)
