"""The UEA/UCR `.ts` reader (`s5jax.data._uea`): fixtures written here in the archives' real
format (header quirks seen in the archive files included: a BOM inside a comment, `%`
comments, lower-case keys, a repeated @problemName), read back into the arrays they were
written from; missing values, timestamps, regression targets, the val carve; malformed files
as one-line errors naming file and line; `s5jax train --data NAME_TRAIN.ts`, predict and
export of such a run, and `s5jax data prepare uea`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import DataConfig
from s5jax.data import DatasetError, load_user_npz
from s5jax.data._uea import convert_ts, load_ts, read_ts, ts_test_path
from s5jax.train import load_run, user_data_config
from s5jax.train._datasets import load_dataset

from ._fixtures import read_npz

TINY = ["model.n_layers=1", "model.d_model=8", "model.ssm_size=8", "model.blocks=2",
        "data.batch_size=4", "data.eval_batch_size=4"]  # fmt: skip


def fmt(v: float) -> str:
    return "?" if np.isnan(v) else repr(float(v))


def ts_text(examples, labels, header: str, times=None) -> str:
    """A `.ts` file: `examples[i]` is a list of channels (1-d arrays, NaN = missing)."""
    rows = []
    for i, (chans, label) in enumerate(zip(examples, labels, strict=True)):
        if times is None:
            parts = [",".join(fmt(v) for v in c) for c in chans]
        else:
            parts = [",".join(f"({t},{fmt(v)})" for t, v in zip(times[i], c, strict=True))
                     for c in chans]  # fmt: skip
        if label is not None:
            parts.append(str(label))
        rows.append(":".join(parts))
    return header + "@data\n" + "\n".join(rows) + "\n"


def write_pair(folder, name, train, test, header, times=(None, None)):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, (ex, lab), t in zip(("TRAIN", "TEST"), (train, test), times, strict=True):
        path = folder / f"{name}_{part}.ts"
        path.write_text(ts_text(ex, lab, header, t), encoding="utf-8")
        paths.append(path)
    return paths[0]


def univariate(rng, n, L, classes):
    ex = [[rng.standard_normal(L).round(6)] for _ in range(n)]
    labels = [classes[i % len(classes)] for i in range(n)]
    return ex, labels


HEADER_UNI = (
    "#\ufeff# A dataset (a BOM inside a comment, as in PLAID_TRAIN.ts)\n"
    "% an ARFF-style comment, as in UnitTestTimeStamps_TRAIN.ts\n\n"
    "@problemName Demo\n@problemname Demo again\n@timeStamps false\n@missing false\n"
    "@univariate true\n@equalLength true\n@seriesLength 12\n@classLabel true 1 2 10\n"
)


def test_univariate_equal_length_reads_back_the_values_and_numeric_class_order(tmp_path):
    rng = np.random.default_rng(0)
    train = univariate(rng, 30, 12, ["10", "2", "1"])
    test = univariate(rng, 9, 12, ["1", "10", "2"])
    path = write_pair(tmp_path, "Demo", train, test, HEADER_UNI)
    ds = load_ts(path)
    assert ds.task == "classification" and ds.n_classes == 3
    assert ds.meta["classes"] == ["1", "2", "10"]  # numeric order, not "1" "10" "2"
    index = {"1": 0, "2": 1, "10": 2}
    t = ds.splits["test"]
    want = np.array([e[0] for e in test[0]], np.float32)[..., None]
    np.testing.assert_array_equal(t.x, want)
    np.testing.assert_array_equal(t.y, [index[c] for c in test[1]])
    assert t.lengths is None and t.t is None
    # train + val are the training file, each example once
    x_all = np.array([e[0] for e in train[0]], np.float32)
    got = np.concatenate([ds.splits["train"].x, ds.splits["val"].x])[..., 0]
    assert sorted(map(tuple, got)) == sorted(map(tuple, x_all))
    assert ds.meta["problem_name"] == "Demo"  # the first of the repeated @problemName


def test_multivariate_string_labels_sorted_and_recorded(tmp_path):
    rng = np.random.default_rng(1)
    names = ["Walking", "Running", "Badminton"]
    train = ([[rng.standard_normal(5), rng.standard_normal(5)] for _ in range(12)],
             [names[i % 3] for i in range(12)])  # fmt: skip
    test = ([[rng.standard_normal(5), rng.standard_normal(5)] for _ in range(3)], names)
    header = ("@problemName M\n@timeStamps false\n@univariate false\n@dimensions 2\n"
              "@equalLength true\n@seriesLength 5\n"
              "@classLabel true Walking Running Badminton\n")  # fmt: skip
    ds = load_ts(write_pair(tmp_path, "M", train, test, header))
    assert ds.meta["classes"] == ["Badminton", "Running", "Walking"]
    x = ds.splits["test"].x
    assert x.shape == (3, 5, 2)
    for i, (a, b) in enumerate(test[0]):
        np.testing.assert_allclose(x[i, :, 0], a, rtol=1e-6)
        np.testing.assert_allclose(x[i, :, 1], b, rtol=1e-6)
    np.testing.assert_array_equal(ds.splits["test"].y, [2, 1, 0])


def test_variable_lengths_pad_with_zeros_and_give_lengths(tmp_path):
    header = ("@problemName V\n@univariate false\n@dimensions 2\n@equalLength false\n"
              "@classLabel true a b\n")  # fmt: skip
    train = ([[np.arange(1.0, 4), np.arange(1.0, 4)], [np.arange(1.0, 6), np.arange(1.0, 3)],
              [np.ones(2), np.ones(2)], [np.ones(4), np.ones(4)]],
             ["a", "b", "a", "b"])  # fmt: skip
    test = ([[np.arange(1.0, 8), np.arange(1.0, 8)]], ["a"])
    ds = load_ts(write_pair(tmp_path, "V", train, test, header), val_fraction=0.3)
    assert ds.splits["test"].x.shape == (1, 7, 2)  # L: the longest of both files
    assert ds.splits["test"].lengths.tolist() == [7]
    tr = load_ts(tmp_path / "V_TRAIN.ts", val_fraction=0.3)
    rows = {int(n): x for s in ("train", "val") for x, n in
            zip(tr.splits[s].x, tr.splits[s].lengths, strict=True)}  # fmt: skip
    # an example whose channels differ in length: padded to its longest channel (5)
    np.testing.assert_array_equal(rows[5][:, 0], [1, 2, 3, 4, 5, 0, 0])
    np.testing.assert_array_equal(rows[5][:, 1], [1, 2, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(rows[3][3:], 0)


MISSING_HEADER = "@problemName G\n@missing true\n@univariate true\n@classLabel true a b\n"


@pytest.mark.parametrize(
    ("how", "want"),
    [
        ("zero", [0.0, 1.0, 0.0, 0.0, 4.0, 0.0]),
        ("ffill", [1.0, 1.0, 1.0, 1.0, 4.0, 4.0]),  # leading gap takes the first observed
        ("interpolate", [1.0, 1.0, 2.0, 3.0, 4.0, 4.0]),  # ends take the nearest
    ],
)
def test_missing_value_choices(tmp_path, how, want):
    nan = np.nan
    gappy = np.array([nan, 1.0, nan, nan, 4.0, nan])
    train = ([[gappy]] + [[np.ones(6)]] * 3, ["a", "b", "a", "b"])
    path = write_pair(tmp_path, "G", train, ([[np.ones(6)]], ["a"]), MISSING_HEADER)
    ds = load_ts(path, missing=how, val_fraction=0.4)
    xs = np.concatenate([ds.splits["train"].x, ds.splits["val"].x])[..., 0]
    assert np.isfinite(xs).all()
    assert any(np.array_equal(row, want) for row in xs), xs


def test_missing_values_are_an_error_by_default_naming_file_and_line(tmp_path):
    train = ([[np.ones(3)], [np.array([1.0, np.nan, 2.0])]], ["a", "b"])
    path = write_pair(tmp_path, "G", train, ([[np.ones(3)]], ["a"]), MISSING_HEADER)
    with pytest.raises(DatasetError) as e:
        load_ts(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}, line 7: missing value (?) at dimension 1, step 2")
    assert "data.missing" in msg and "\n" not in msg


def test_timestamps_dates_become_steps_of_one_and_shared_times_are_required(tmp_path):
    header = "@problemName T\n@timeStamps true\n@univariate true\n@classLabel true 1 2\n"
    minute = ["2007-01-01 00:00:00", "2007-01-01 00:01:00", "2007-01-01 00:03:00"]
    times = [minute, ["2008-09-09 20:56:00", "2008-09-09 20:57:00", "2008-09-09 20:58:00"]]
    train = ([[np.array([1.0, 2, 3])], [np.array([4.0, 5, 6])]] * 2, ["1", "2"] * 2)
    path = write_pair(tmp_path, "T", train, ([[np.array([7.0, 8, 9])]], ["2"]), header,
                      times=(times * 2, times[:1]))  # fmt: skip
    f = read_ts(path)
    np.testing.assert_array_equal(f.times[0], [0, 60, 180])  # seconds for dates
    ds = load_ts(path, val_fraction=0.5)
    assert ds.meta["time_unit"] == 60.0  # the training file's median step
    np.testing.assert_array_equal(ds.splits["test"].t, [[0, 1, 3]])
    np.testing.assert_array_equal(ds.splits["test"].x[..., 0], [[7, 8, 9]])
    # numeric times, two channels that disagree
    bad = tmp_path / "B_TRAIN.ts"
    bad.write_text("@problemName B\n@timeStamps true\n@univariate false\n@classLabel true a\n"
                   "@data\n(0,1.0),(1,2.0):(0,1.0),(2,2.0):a\n")  # fmt: skip
    with pytest.raises(DatasetError, match=rf"^{bad}, line 6: dimension 2 has other times"):
        read_ts(bad)


@pytest.mark.parametrize("how", ["interpolate", "ffill", "zero"])
def test_timed_gaps_fill_by_time_and_times_start_at_zero(tmp_path, how):
    """Numeric times [10, 11, 14, 15]: interpolation is linear in time (1 + 3 * 1/4 at 11,
    not the index's 1 + 3 * 1/2), the stored times start at 0 (in units of the training
    file's median step, 1 here), and a channel with no observed value is all zeros."""
    header = ("@problemName T\n@timeStamps true\n@missing true\n@univariate false\n"
              "@dimensions 2\n@classLabel true a b\n")  # fmt: skip
    nan = np.nan
    gappy, empty = np.array([1.0, nan, 4.0, 5.0]), np.full(4, nan)
    train = ([[gappy, empty]] + [[np.ones(4), np.ones(4)]] * 3, ["a", "b", "a", "b"])
    times = [[10, 11, 14, 15]] * 4
    path = write_pair(tmp_path, "T", train, ([[np.ones(4), np.ones(4)]], ["a"]), header,
                      times=(times, times[:1]))  # fmt: skip
    ds = load_ts(path, missing=how, val_fraction=0.0)
    x, t = ds.splits["train"].x[0], ds.splits["train"].t[0]
    want = {"interpolate": 1.75, "ffill": 1.0, "zero": 0.0}[how]
    np.testing.assert_allclose(x[:, 0], [1.0, want, 4.0, 5.0])
    np.testing.assert_array_equal(x[:, 1], 0.0)
    assert ds.meta["time_unit"] == 1.0
    np.testing.assert_array_equal(t, [0, 1, 4, 5])
    np.testing.assert_array_equal(ds.splits["test"].t, [[0, 1, 4, 5]])


def test_regression_targets(tmp_path):
    header = "@problemName R\n@univariate true\n@equalLength true\n@targetLabel true\n"
    rng = np.random.default_rng(2)
    train = ([[rng.standard_normal(4)] for _ in range(10)], [0.5 * i for i in range(10)])
    path = write_pair(tmp_path, "R", train, ([[np.ones(4)]], [2.25]), header)
    ds = load_ts(path)
    assert ds.task == "regression" and ds.n_classes == 0
    assert ds.splits["test"].y.tolist() == [2.25] and ds.splits["test"].y.dtype == np.float32
    ys = np.concatenate([ds.splits["train"].y, ds.splits["val"].y])
    assert sorted(ys.tolist()) == [0.5 * i for i in range(10)]
    assert len(ds.splits["val"]) == 1


def test_val_is_stratified_seeded_and_stated(tmp_path):
    rng = np.random.default_rng(3)
    train = univariate(rng, 60, 12, ["1", "1", "2", "10"])  # 30 / 15 / 15
    train[1][-1] = "1"
    path = write_pair(tmp_path, "Demo", train, univariate(rng, 3, 12, ["1", "2", "10"]), HEADER_UNI)
    a, b, c = load_ts(path), load_ts(path), load_ts(path, val_seed=1)
    counts = np.bincount(a.splits["val"].y, minlength=3)
    assert counts.tolist() == [3, 2, 1]  # round(10 % of 31, 15, 14), at least one each
    np.testing.assert_array_equal(a.splits["val"].x, b.splits["val"].x)
    assert not np.array_equal(a.splits["val"].x, c.splits["val"].x)
    assert a.meta["val_split"] == (
        "val carved from Demo_TRAIN.ts: 6 of 60, stratified by class, seed 0, fraction 0.1"
    )


def test_a_large_val_fraction_leaves_every_class_a_training_example(tmp_path):
    """The carve takes round(fraction * n) of a class but never all of it; a class with one
    example gives none (and the regression carve leaves one training example)."""
    rng = np.random.default_rng(4)
    labels = ["a", "a", "b", "b", "b", "b", "b", "c"]  # 2 / 5 / 1 examples
    train = ([[rng.standard_normal(6).round(6)] for _ in labels], labels)
    header = "@problemName V\n@univariate true\n@classLabel true a b c\n"
    path = write_pair(tmp_path, "V", train, univariate(rng, 3, 6, ["a", "b", "c"]), header)
    ds = load_ts(path, val_fraction=0.9)
    # a: round(1.8) = 2 of 2, capped at 1; b: round(4.5) = 4 of 5; c: one example, none taken
    assert np.bincount(ds.splits["val"].y, minlength=3).tolist() == [1, 4, 0]
    assert np.bincount(ds.splits["train"].y, minlength=3).tolist() == [1, 1, 1]
    header = "@problemName R\n@univariate true\n@targetLabel true\n"
    reg = ([[rng.standard_normal(4)] for _ in range(3)], [1.0, 2.0, 3.0])
    ds = load_ts(write_pair(tmp_path, "R", reg, ([[np.ones(4)]], [0.0]), header), val_fraction=0.9)
    assert len(ds.splits["val"]) == 2 and len(ds.splits["train"]) == 1


def ok_file(body: str, header: str = "@problemName X\n@univariate true\n@classLabel true a b\n"):
    return header + body


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (ok_file("@data\n1,2,3:a\n1,x,3:b\n"), 6, "dimension 1: 'x' is not a number"),
        (ok_file("@data\n1,2,3:a\n1,2:3:4:b\n"), 6, "has 3 dimensions but @univariate true says 1"),
        (ok_file("@data\n1,2,3:c\n"), 5, "label 'c' is not in @classLabel (a b)"),
        (ok_file("@data\n1,2,3:a\n@missing false\n"), 6, "header line @missing after @data"),
        (ok_file("1,2,3:a\n"), 4, "before @data"),
        (ok_file("@data\n1,2,inf:a\n"), 5, "is not finite"),
        (ok_file("@data\n1,,3:a\n"), 5, "dimension 1: '' is not a number"),
        ("@problemName X\n@univariate maybe\n@data\n", 2, "@univariate must be true or false"),
        ("@classLabel true\n@data\n", 1, "@classLabel true must list the class names"),
        ("@seriesLength -3\n@data\n", 1, "@seriesLength must be a positive integer"),
        ("@data extra\n", 1, "@data takes no value"),
        (ok_file("@data\n1,2:a\n1,2,3:b\n", "@equalLength true\n@classLabel true a b\n"), 5,
         "has 3 steps but the first example has 2 and @equalLength is true"),
        (ok_file("@data\n1,2,3:a\n", "@seriesLength 4\n@classLabel true a b\n"), 4,
         "dimension 1 has 3 values but @seriesLength is 4"),
        (ok_file("@data\n1:2:a\n1:b\n", "@dimensions 2\n@classLabel true a b\n"), 5,
         "has 1 dimensions but @dimensions says 2 (is the label missing?)"),
        (ok_file("@data\n1,2:?\n", "@targetLabel true\n"), 3, "regression target is missing"),
        (ok_file("@data\n(0,1),(1,2):a\n(1,1),(0,2):b\n",
                 "@timeStamps true\n@classLabel true a b\n"), 5,
         "times are not strictly increasing (value 2 is not after value 1)"),
        (ok_file("@data\n(0,1),(0,2):a\n(0,1),(1,2):b\n",
                 "@timeStamps true\n@classLabel true a b\n"), 4,
         "times are not strictly increasing (value 2 is not after value 1)"),
        (ok_file("@data\n(0,1),(x,2):a\n", "@timeStamps true\n@classLabel true a b\n"), 4,
         "time 'x' is neither a number nor a date"),
    ],
)  # fmt: skip
def test_malformed_files_are_one_line_errors_naming_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "X_TRAIN.ts"
    path.write_text(text)
    with pytest.raises(DatasetError) as e:
        read_ts(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}, line {line}: ") and message in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@problemName X\n# no data line\n", "no @data line"),
        ("@problemName X\n@data\n\n", "no examples after @data"),
        (b"@data\n\xff\xfe1,2\n", "is not UTF-8 text"),
    ],
)
def test_file_level_errors_name_the_file(tmp_path, text, message):
    path = tmp_path / "X_TRAIN.ts"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DatasetError, match=rf"^{path}: .*{message}"):
        read_ts(path)


def test_test_file_is_found_beside_the_training_file(tmp_path):
    assert ts_test_path(tmp_path / "A_TRAIN.ts") == tmp_path / "A_TEST.ts"
    assert ts_test_path(tmp_path / "a_train.ts") == tmp_path / "a_test.ts"
    with pytest.raises(DatasetError, match=r"give the training file NAME_TRAIN\.ts"):
        ts_test_path(tmp_path / "A.ts")
    (tmp_path / "A_TRAIN.ts").write_text(ok_file("@data\n1,2:a\n1,2:b\n"))
    with pytest.raises(DatasetError, match=rf"^{tmp_path / 'A_TEST.ts'}: test file not found"):
        load_ts(tmp_path / "A_TRAIN.ts")


def gappy_pair(tmp_path):
    rng = np.random.default_rng(4)
    ex = [[np.where(rng.random(6) < 0.2, np.nan, rng.standard_normal(6))] for _ in range(16)]
    ex[0][0][2] = np.nan
    train = (ex, ["a", "b"] * 8)
    test = ([[rng.standard_normal(6)] for _ in range(5)], ["a", "b", "a", "b", "a"])
    return write_pair(tmp_path / "data", "Gap", train, test, MISSING_HEADER)


def test_load_dataset_and_user_data_config_read_ts_with_the_data_settings(tmp_path):
    path = gappy_pair(tmp_path)
    with pytest.raises(DatasetError, match="missing value"):
        load_dataset(DataConfig(dataset=str(path)))
    ds = load_dataset(DataConfig(dataset=str(path), missing="zero", val_fraction=0.25,
                                 val_seed=3))  # fmt: skip
    assert len(ds.splits["val"]) == 4 and ds.meta["missing"] == "zero"
    config, ds2 = user_data_config(path, [*TINY, "data.missing=zero", "data.val_fraction=0.25",
                                          "data.val_seed=3"])  # fmt: skip
    assert config.data.missing == "zero" and config.data.val_seed == 3
    np.testing.assert_array_equal(ds2.splits["val"].y, ds.splits["val"].y)


def test_train_predict_and_export_of_a_ts_file(tmp_path, capsys):
    """`s5jax train --data NAME_TRAIN.ts`; predict and export reload the data from
    config.json (the .ts pair, read with the run's data.missing and val split)."""
    path = gappy_pair(tmp_path)
    run_dir = tmp_path / "run"
    # a carve of 2 would not be made by the defaults (test below): asked for here
    sets = [*TINY, "train.epochs=1", "data.missing=ffill", "data.val_seed=5",
            "data.val_fraction=0.1"]  # fmt: skip
    argv = ["train", "--data", str(path), "--workdir", str(run_dir), "--no-progress",
            *[a for o in sets for a in ("--set", o)]]  # fmt: skip
    assert main(argv) == 0
    assert "Gap: val carved from Gap_TRAIN.ts: 2 of 16, stratified by class, seed 5" in (
        capsys.readouterr().err
    )
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["data"]["dataset"] == str(path.resolve())
    assert cfg["data"]["missing"] == "ffill" and cfg["data"]["val_seed"] == 5
    _config, dataset = user_data_config(path, sets)
    reloaded = load_run(run_dir).dataset
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(reloaded.splits[s].x, dataset.splits[s].x)
    out = tmp_path / "pred.npz"
    argv = ["predict", str(run_dir), "--split", "val", "--out", str(out), "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    line = json.loads(captured.out)
    assert line["n"] == 2 and read_npz(out)["pred"].shape == (2,)
    assert "val carved" not in captured.err  # said when the run trained, not again
    pytest.importorskip("flatbuffers")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "exp")]) == 0
    assert (tmp_path / "exp" / "forward.jax").is_file()
    spec = json.loads((tmp_path / "exp" / "spec.json").read_text())
    assert spec["classes"] == dataset.meta["classes"] and len(spec["classes"]) == spec["n_classes"]


def test_config_data_prints_the_config_train_data_trains(tmp_path, capsys):
    """`s5jax config --data FILE > mine.toml` then `s5jax train mine.toml` is
    `s5jax train --data FILE`: the same resolved config and the same training (losses
    equal); the data-chosen settings and their reasons head the file as TOML comments."""
    from s5jax.config import load_experiment

    path = gappy_pair(tmp_path)
    sets = [*TINY, "train.epochs=2", "data.missing=ffill", "data.val_fraction=0.1"]
    flags = [a for o in sets for a in ("--set", o)]
    assert main(["config", "--data", str(path), *flags]) == 0
    text = capsys.readouterr().out
    head = text.split("\nname = ", 1)[0].splitlines()
    assert head[0] == f"# s5jax config --data {path}" and all(h.startswith("#") for h in head)
    assert any(h.startswith("#   data.normalize = ") for h in head)  # a choice, with why
    toml = tmp_path / "mine.toml"
    toml.write_text(text)
    runs = tmp_path / "from-data", tmp_path / "from-toml"
    assert main(["train", "--data", str(path), "--workdir", str(runs[0]), "--no-progress",
                 *flags]) == 0  # fmt: skip
    assert main(["train", str(toml), "--workdir", str(runs[1]), "--no-progress"]) == 0
    a, b = (load_experiment(r / "config.json") for r in runs)
    assert a == b == load_experiment(toml)

    def losses(run):
        return [json.loads(line)["train_loss"]
                for line in (run / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["kind"] == "epoch"]  # fmt: skip

    assert losses(runs[0]) == pytest.approx(losses(runs[1]), rel=1e-6)
    assert main(["config", "synthetic", "--data", str(path)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["config"]) == 2
    assert "name an EXPERIMENT" in capsys.readouterr().err


def test_a_val_carve_too_small_to_select_with_is_not_made(tmp_path, capsys):
    """16 examples: a 10% carve holds 2, too few to select with; the defaults train on all 16
    and report the last epoch, and eval/predict reload the same uncarved data. A sweep ranks
    trials by val, so it keeps the carve; so does a setting that needs val figures."""
    path = gappy_pair(tmp_path)
    run_dir = tmp_path / "run"
    sets = [*TINY, "train.epochs=2", "data.missing=ffill"]
    argv = ["train", "--data", str(path), "--workdir", str(run_dir), "--no-progress",
            *[a for o in sets for a in ("--set", o)]]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Gap: no val split: all 16 examples of Gap_TRAIN.ts train" in err
    assert "data.val_fraction = 0.0 (the carve would hold 2 val examples < 50" in err
    assert "train.select = 'last' (no val split" in err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["best_val"] is None and results["select"] == "last"
    assert results["best_epoch"] == results["epochs_run"] == 2
    assert json.loads((run_dir / "config.json").read_text())["data"]["val_fraction"] == 0.0
    run = load_run(run_dir)
    assert (
        sorted(run.dataset.splits) == ["test", "train"] and len(run.dataset.splits["train"]) == 16
    )
    assert run.evaluate("test")["accuracy"] == pytest.approx(results["test_at_best_val"])
    from s5jax.train._runs import user_data_defaults

    def n_val(overrides, **kw):
        dataset = user_data_defaults(path, [*TINY, "data.missing=ffill", *overrides], **kw)[1]
        return len(dataset.splits["val"]) if "val" in dataset.splits else None

    assert n_val([]) is None
    assert n_val([], selects_by_val=True) == 2
    assert n_val(["train.select=best_val"]) == n_val(["train.early_stop_patience=3"]) == 2
    assert n_val(["data.val_fraction=0.25"]) == 4
    # without a val split, a setting that needs one is a one-line error naming it
    argv = ["train", "--data", str(path), "--workdir", str(tmp_path / "r2"), "--no-progress",
            "--set", "data.missing=ffill", "--set", "data.val_fraction=0",
            "--set", "train.select=best_val"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    info, err = capsys.readouterr().err.strip().splitlines()  # how the data was read; the error
    assert (
        info
        == "s5jax: Gap: no val split: all 16 examples of Gap_TRAIN.ts train (data.val_fraction = 0)"
    )
    assert err.startswith("s5jax train: error: Gap has no val split, but train.select = ")
    assert "needs one: set train.select = last, or give a val split" in err
    assert not (tmp_path / "r2").exists()


def test_prepare_uea_writes_npz_that_load_user_npz_reads_the_same(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(6)
    src = tmp_path / "archive"
    write_pair(src / "Demo", "Demo", univariate(rng, 20, 12, ["1", "2", "10"]),
               univariate(rng, 6, 12, ["1", "2", "10"]), HEADER_UNI)  # fmt: skip
    gap = gappy_pair(tmp_path)
    gap.rename(src / gap.name)
    gap.with_name("Gap_TEST.ts").rename(src / "Gap_TEST.ts")
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    # Gap has missing values: an error, and nothing is written
    assert main(["data", "prepare", "uea", "--source", str(src)]) == 2
    assert "missing value" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()
    argv = ["data", "prepare", "uea", "--source", str(src), "--missing", "interpolate"]
    assert main([*argv, "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert f"train with: s5jax train --data {tmp_path / 'root' / 'uea' / 'Demo.npz'}" in out
    assert "labels: 0=1, 1=2, 2=10" in out
    for name in ("Demo", "Gap"):
        want = load_ts(next(src.rglob(f"{name}_TRAIN.ts")), missing="interpolate", val_seed=2)
        got = load_user_npz(tmp_path / "root" / "uea" / f"{name}.npz")
        assert got.n_classes == want.n_classes and got.task == want.task
        # the .ts file's class names travel in the .npz (`classes`), label i naming classes[i]
        assert got.meta.get("classes") == want.meta.get("classes")
        for s in ("train", "val", "test"):
            np.testing.assert_array_equal(got.splits[s].x, want.splits[s].x)
            np.testing.assert_array_equal(got.splits[s].y, want.splits[s].y)
    assert [p.name for p, _ in convert_ts(src / "Demo", tmp_path / "o")] == ["Demo.npz"]
    assert read_npz(tmp_path / "o" / "Demo.npz")["classes"].tolist() == ["1", "2", "10"]
    assert main(["data", "prepare", "pendulum", "--missing", "zero"]) == 2
    assert "--missing applies to `s5jax data prepare uea` only" in capsys.readouterr().err


def timed_pair(tmp_path):
    """Two channels with gaps, variable lengths, numeric times of median step 2, string
    classes: every conversion `predict --data NEW.ts` must repeat as training did."""
    rng = np.random.default_rng(21)
    header = ("@problemName Tm\n@timeStamps true\n@missing true\n@univariate false\n"
              "@dimensions 2\n@equalLength false\n@classLabel true up down\n")  # fmt: skip

    def part(n):
        ex, times = [], []
        for _ in range(n):
            L = int(rng.integers(4, 9))
            t = np.cumsum(rng.choice([1, 2, 2, 3], L)) + 100
            chans = [np.where(rng.random(L) < 0.15, np.nan, rng.standard_normal(L).round(5))
                     for _ in range(2)]  # fmt: skip
            chans[0][0] = 0.5  # a first value to fill forward from
            ex.append(chans)
            times.append(list(t))
        return ex, times

    (train, t_train), (test, t_test) = part(24), part(7)
    lab_train = ["up", "down"] * 12
    lab_test = ["down", "up", "up", "down", "up", "down", "down"]
    return write_pair(tmp_path / "data", "Tm", (train, lab_train), (test, lab_test), header,
                      times=(t_train, t_test))  # fmt: skip


def test_predict_on_a_ts_file_equals_the_runs_own_test_split(tmp_path, capsys):
    """Two views of the same examples: `predict RUN --data Tm_TEST.ts` reads the file as
    training read it (missing values filled by data.missing, times in the training file's
    unit, labels by class name), so its predictions and metrics are the run's own test
    split's; the same file without labels gives the same predictions and no metrics."""
    path = timed_pair(tmp_path)
    run = tmp_path / "run"
    sets = [*TINY, "train.epochs=1", "data.missing=ffill", "data.val_fraction=0"]
    argv = ["train", "--data", str(path), "--workdir", str(run), "--no-progress",
            *[a for o in sets for a in ("--set", o)]]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    own, new, bare = (tmp_path / f"{n}.npz" for n in ("own", "new", "bare"))
    assert main(["predict", str(run), "--split", "test", "--out", str(own), "--no-progress"]) == 0
    own_line = json.loads(capsys.readouterr().out)
    test_file = path.with_name("Tm_TEST.ts")
    assert main(["predict", str(run), "--data", str(test_file), "--out", str(new),
                 "--no-progress"]) == 0  # fmt: skip
    new_line = json.loads(capsys.readouterr().out)
    assert new_line["n"] == own_line["n"] == 7
    assert new_line["loss"] == pytest.approx(own_line["loss"], rel=1e-6)
    assert new_line["accuracy"] == own_line["accuracy"]
    a, b = read_npz(own), read_npz(new)
    np.testing.assert_allclose(b["log_probs"], a["log_probs"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(b["pred"], a["pred"])
    # The class names travel with the predictions (label i is classes[i], as training
    # encoded them): naming each prediction and comparing with the file's own labels
    # gives the run's accuracy (reversed names would give 1 - accuracy: 7 examples, never 0.5).
    head, body = test_file.read_text().split("@data\n")
    labels = [row.rsplit(":", 1)[1] for row in body.splitlines()]
    with np.load(new, allow_pickle=False) as f:
        assert sorted(f["classes"].tolist()) == ["down", "up"]
        named = f["classes"][f["pred"]]
    assert np.mean(named == np.array(labels)) == pytest.approx(new_line["accuracy"])
    unlabelled = tmp_path / "Unlabelled.ts"
    unlabelled.write_text(head.replace("@classLabel true up down", "@classLabel false")
                          + "@data\n" + "".join(row.rsplit(":", 1)[0] + "\n"
                                                for row in body.splitlines()))  # fmt: skip
    assert main(["predict", str(run), "--data", str(unlabelled), "--out", str(bare),
                 "--no-progress"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == "" and "wrote 7 predictions" in captured.err  # no targets: no metric
    np.testing.assert_array_equal(read_npz(bare)["pred"], a["pred"])


_TM = "@problemName N\n@missing false\n@equalLength true\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (_TM + "@timeStamps true\n@univariate false\n@dimensions 2\n"
         "@classLabel true up down sideways\n@data\n(100,1.0),(102,2.0):(100,1.0),(102,2.0):"
         "sideways\n", "class label(s) sideways that the run was not trained on (its classes: "),
        (_TM + "@timeStamps false\n@univariate false\n@dimensions 2\n@classLabel true up down"
         "\n@data\n1.0,2.0:1.0,2.0:up\n",
         "has no timestamps (@timeStamps) but the run was trained with times"),
        (_TM + "@timeStamps true\n@univariate true\n@classLabel true up down\n@data\n"
         "(100,1.0),(102,2.0):up\n", "has 1 dimension per step; this run's model reads 2"),
        (_TM + "@timeStamps true\n@univariate false\n@dimensions 2\n@targetLabel true\n"
         "@data\n(100,1.0),(102,2.0):(100,1.0),(102,2.0):0.5\n",
         "holds regression labels but the run's model does classification"),
    ],
)  # fmt: skip
def test_predict_on_a_ts_file_refuses_what_the_run_cannot_read(tmp_path, capsys, text, message):
    path = timed_pair(tmp_path)
    run = tmp_path / "run"
    sets = [*TINY, "train.epochs=1", "data.missing=ffill", "data.val_fraction=0"]
    argv = ["train", "--data", str(path), "--workdir", str(run), "--no-progress",
            *[a for o in sets for a in ("--set", o)]]  # fmt: skip
    assert main(argv) == 0
    new = tmp_path / "New_TEST.ts"
    new.write_text(text)
    capsys.readouterr()
    out = tmp_path / "p.npz"
    assert main(["predict", str(run), "--data", str(new), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"s5jax predict: error: {new}: ") and err.count("\n") == 1
    assert message in err, err
    assert not out.exists()


def test_predict_on_a_ts_file_of_an_equal_length_run_is_not_padded(tmp_path, capsys):
    """A run trained on series of one length (no padding, plain mean pooling) predicts on a
    file of shorter series at their own length: the same predictions as the `.npz` form of
    the same values. Series of several lengths are padded, with a warning (the mean pools
    the padding)."""
    rng = np.random.default_rng(22)
    path = write_pair(tmp_path / "data", "Demo", univariate(rng, 24, 12, ["1", "2", "10"]),
                      univariate(rng, 6, 12, ["1", "2", "10"]), HEADER_UNI)  # fmt: skip
    run = tmp_path / "run"
    sets = [*TINY, "train.epochs=1", "data.val_fraction=0"]
    argv = ["train", "--data", str(path), "--workdir", str(run), "--no-progress",
            *[a for o in sets for a in ("--set", o)]]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((run / "config.json").read_text())["model"]["pooling"] == "mean"
    header = "@problemName Demo\n@univariate true\n@classLabel true 1 2 10\n"
    values = [rng.standard_normal(8).round(6) for _ in range(5)]
    short = tmp_path / "Short.ts"
    short.write_text(ts_text([[v] for v in values], ["2"] * 5, header))
    as_npz = tmp_path / "short.npz"
    np.savez(as_npz, x=np.stack(values)[..., None].astype(np.float32))
    outs = {}
    for name, data in (("ts", short), ("npz", as_npz)):
        outs[name] = tmp_path / f"{name}-pred.npz"
        assert main(["predict", str(run), "--data", str(data), "--out", str(outs[name]),
                     "--no-progress"]) == 0  # fmt: skip
    np.testing.assert_allclose(read_npz(outs["ts"])["log_probs"],
                               read_npz(outs["npz"])["log_probs"],
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    capsys.readouterr()
    mixed = tmp_path / "Mixed.ts"
    mixed.write_text(ts_text([[values[0][:6]], [values[1]]], ["1", "2"], header))
    assert main(["predict", str(run), "--data", str(mixed), "--out", str(tmp_path / "m.npz"),
                 "--no-progress"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "series of 6 to 8 steps are padded to 8" in err and "plain mean" in err
