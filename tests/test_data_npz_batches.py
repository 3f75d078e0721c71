"""Your own data as one `.npz` file (`s5jax.data._npz`) and mini-batching (`_batches`).

Every fixture is a real `.npz` written in `tmp_path`; each validation failure is checked
against the words of its message (file, key and fix).
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from s5jax.data import DatasetError, PreparedDataset, Split, load_prepared, save_prepared
from s5jax.data import _npz as npz_mod
from s5jax.data._batches import epoch_order, iterate_batches, num_batches
from s5jax.data._npz import describe, load_user_npz

SIZES = {"train": 12, "val": 5, "test": 7}
L, D = 9, 3


def _classification(rng=None, n_classes=4):
    rng = np.random.default_rng(0) if rng is None else rng
    arrays = {}
    for s, n in SIZES.items():
        arrays[f"x_{s}"] = rng.normal(size=(n, L, D)).astype(np.float32)
        arrays[f"y_{s}"] = np.arange(n) % n_classes
    return arrays


def _write(tmp_path, arrays, name="data.npz"):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _fails(tmp_path, arrays, *patterns):
    path = _write(tmp_path, arrays)
    with pytest.raises(DatasetError) as info:
        load_user_npz(path)
    message = str(info.value)
    assert str(path) in message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    return message


# ---------------------------------------------------------------------------- valid files


def test_docstring_example_writes_a_valid_file(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", npz_mod.__doc__, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(textwrap.dedent(code), "example", "exec"), {})
    ds = load_user_npz(tmp_path / "mydata.npz")
    assert ds.task == "classification" and ds.n_classes == 4 and ds.name == "mydata"
    assert ds.splits["train"].x.shape == (800, 100, 3)


def test_valid_classification(tmp_path):
    arrays = _classification()
    arrays["lengths_train"] = np.full(SIZES["train"], L)
    arrays["lengths_train"][0] = 1
    ds = load_user_npz(_write(tmp_path, arrays), name="mine")
    assert ds.name == "mine"
    assert ds.task == "classification"
    assert ds.n_classes == 4
    assert ds.vocab_size is None
    assert set(ds.splits) == {"train", "val", "test"}
    train = ds.splits["train"]
    assert train.x.dtype == np.float32 and train.x.shape == (12, L, D)
    assert train.y.dtype == np.int32 and train.y.shape == (12,)
    assert train.lengths.dtype == np.int32 and ds.splits["val"].lengths is None
    np.testing.assert_array_equal(train.x, arrays["x_train"])
    assert ds.meta["in_dim"] == D and ds.meta["seq_len"] == L
    text = describe(ds)
    assert "classification into 4 classes" in text
    assert f"L = {L} steps x D = {D} features" in text
    assert "train N = 12, val N = 5, test N = 7" in text
    assert "valid lengths 1 .. 9" in text
    # it survives the prepared-folder round trip
    loaded = load_prepared(save_prepared(tmp_path / "cache", ds))
    np.testing.assert_array_equal(loaded.splits["test"].y, ds.splits["test"].y)


@pytest.mark.parametrize(
    "name, y_of, task, warned",
    [
        ("labels.npz", lambda y: y.astype(np.float64), None, True),  # 0., 1., 2., 3.
        ("ratings.npz", lambda y: (y + 1).astype(np.float32), "regression", False),  # says so
        ("real.npz", lambda y: y + 0.25, None, False),  # not whole numbers
        ("const.npz", lambda y: np.full(len(y), 3.0), None, False),  # one value: no classes
    ],
)
def test_float_targets_that_look_like_labels_warn_once(tmp_path, caplog, name, y_of, task,
                                                       warned):  # fmt: skip
    """Class labels saved as floats read as regression targets: a warning says so (once,
    though the file is read twice), naming the values, the fix, and how to keep regression."""
    arrays = _classification()
    arrays = {k: y_of(v) if k.startswith("y_") else v for k, v in arrays.items()}
    if task:
        arrays["task"] = np.array(task)
    path = _write(tmp_path, arrays, name)
    with caplog.at_level("WARNING", logger="s5jax"):
        assert load_user_npz(path).task == "regression"
        load_user_npz(path)
    records = [r.getMessage() for r in caplog.records if r.name == "s5jax.data._npz"]
    if not warned:
        assert records == []
        return
    assert records == [
        f"{path}: y_train is float but holds only 4 whole numbers (0, 1, 2, 3): read as "
        "regression targets; for class labels store integers (y.astype(int)) or add "
        "task='classification' (task='regression' keeps regression without this warning)"
    ]
    arrays["task"] = np.array("classification")  # the fix it names: the labels are classes
    fixed = load_user_npz(_write(tmp_path, arrays, "fixed.npz"))
    assert fixed.task == "classification" and fixed.n_classes == 4


def test_n_classes_from_all_splits_and_explicit_key(tmp_path, caplog):
    arrays = _classification(n_classes=2)
    arrays["y_test"][0] = 6  # a class seen only in test: counted, and warned about
    with caplog.at_level("WARNING", logger="s5jax"):
        assert load_user_npz(_write(tmp_path, arrays)).n_classes == 7
    unseen, unused = [r.getMessage() for r in caplog.records if r.name == "s5jax.data._npz"]
    assert unseen.startswith(
        f"{tmp_path / 'data.npz'}: class(es) 6 appear in y_val/y_test but never in y_train"
    )
    assert unused.startswith(  # labels 2 .. 5 are in no split: 4 of 7 outputs are spare
        f"{tmp_path / 'data.npz'}: no split has label(s) 2, 3, 4, 5 of 0 .. 6, so 4 of the "
        "model's 7 outputs are for classes without an example: map your classes"
    )
    caplog.clear()
    load_user_npz(_write(tmp_path, _classification(n_classes=2)))
    assert not [r for r in caplog.records if r.name == "s5jax.data._npz"]
    arrays["n_classes"] = np.array(10)
    assert load_user_npz(_write(tmp_path, arrays)).n_classes == 10


def _npz_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "s5jax.data._npz"]


def test_one_based_labels_warn_and_n_classes_keeps_them_quiet(tmp_path, caplog):
    """Labels 1 .. C (R, MATLAB) leave output 0 without an example: a warning names the fix."""
    arrays = {k: v + 1 if k.startswith("y_") else v for k, v in _classification().items()}
    with caplog.at_level("WARNING", logger="s5jax"):
        ds = load_user_npz(_write(tmp_path, arrays, "one.npz"))
    assert ds.n_classes == 5  # the labels as given: the file is not rewritten
    assert _npz_warnings(caplog) == [
        f"{tmp_path / 'one.npz'}: no split has label(s) 0 of 0 .. 4, so 1 of the model's 5 "
        "outputs are for classes without an example: labels start at 1: subtract 1 (y - 1) "
        "(or add n_classes to the file to keep them)"
    ]
    caplog.clear()
    # A label of 2e9 (a typo, refused later by model.max_classes) must not make the check
    # build 2e9 numbers: the warning names the first ten unused and counts the rest.
    huge = {k: np.where(v == 4, 2_000_000_000, v) if k.startswith("y_") else v
            for k, v in arrays.items()}  # fmt: skip
    with caplog.at_level("WARNING", logger="s5jax"):
        assert load_user_npz(_write(tmp_path, huge, "huge.npz")).n_classes == 2_000_000_001
    [warning] = _npz_warnings(caplog)
    assert warning.startswith(
        f"{tmp_path / 'huge.npz'}: no split has label(s) 0, 4, 5, 6, 7, 8, 9, 10, 11, 12 ... of "
        "0 .. 2000000000, so 1,999,999,997 of the model's 2,000,000,001 outputs"
    )
    caplog.clear()
    arrays["n_classes"] = np.array(5)  # said on purpose: no warning
    with caplog.at_level("WARNING", logger="s5jax"):
        load_user_npz(_write(tmp_path, arrays, "kept.npz"))
    assert _npz_warnings(caplog) == []


@pytest.mark.parametrize("kind", ["U", "S"])
def test_class_names_as_labels(tmp_path, caplog, kind):
    """Labels stored as names are numbered in sorted order over every split (numeric order
    when all are numbers, as for a .ts file); the names travel in `meta["classes"]`."""
    rng = np.random.default_rng(3)
    arrays = _classification(rng)
    names = np.array(["owl", "cat", " emu ", "dog"])  # spaces stripped, as in a .ts file
    for s in SIZES:
        arrays[f"y_{s}"] = names[arrays[f"y_{s}"]].astype(kind)
    arrays["y_test"][0] = "yak" if kind == "U" else b"yak"  # only in test: numbered, warned
    with caplog.at_level("WARNING", logger="s5jax"):
        ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.task == "classification" and ds.n_classes == 5
    assert ds.meta["classes"] == ["cat", "dog", "emu", "owl", "yak"]
    for s in SIZES:
        want = [str(v.decode() if kind == "S" else v).strip() for v in arrays[f"y_{s}"]]
        assert [ds.meta["classes"][i] for i in ds.splits[s].y] == want
        assert ds.splits[s].y.dtype == np.int32
    [warning] = _npz_warnings(caplog)
    assert "class(es) yak appear in y_val/y_test but never in y_train" in warning
    loaded = load_prepared(save_prepared(tmp_path / "cache", ds))
    assert loaded.meta["classes"] == ds.meta["classes"]
    # numbers as names: numeric order, so "10" is the last class, not the second
    for s in SIZES:
        arrays[f"y_{s}"] = np.array(["1", "2", "10"])[np.arange(SIZES[s]) % 3]
    assert load_user_npz(_write(tmp_path, arrays)).meta["classes"] == ["1", "2", "10"]


def test_the_data_line_names_the_classes(tmp_path):
    from s5jax.train._engine import _describe_data

    arrays = _classification()
    for s in SIZES:
        arrays[f"y_{s}"] = np.array(["b", "a", "c", "d"])[arrays[f"y_{s}"]]
    line = _describe_data(load_user_npz(_write(tmp_path, arrays)))
    assert line == (f"data: data (train 12, val 5, test 7) from {tmp_path / 'data.npz'}; "
                    "classes 0=a, 1=b, 2=c, 3=d")  # fmt: skip


def test_classes_key_names_integer_labels(tmp_path):
    arrays = _classification()
    arrays["classes"] = np.array(["a", "b", "c", "d", "e"])  # e has no example: allowed
    ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.n_classes == 5 and ds.meta["classes"] == ["a", "b", "c", "d", "e"]
    np.testing.assert_array_equal(ds.splits["train"].y, arrays["y_train"])
    arrays["classes"] = np.array(["a", "b", "c"])
    _fails(tmp_path, arrays, r"key 'y_train' has label 3 but classes names 3",
           r"name every class in classes or fix the labels")  # fmt: skip
    arrays["classes"] = np.array(["a", "b", "a", "d"])
    _fails(tmp_path, arrays, r"key 'classes' names class 'a' more than once")
    arrays["classes"], arrays["n_classes"] = np.array(["a", "b", "c", "d"]), np.array(6)
    _fails(tmp_path, arrays, r"key 'classes' names 4 classes but n_classes is 6")
    del arrays["n_classes"]
    arrays["classes"] = np.array([[1, 2], [3, 4]])
    _fails(tmp_path, arrays, r"key 'classes' has shape \(2, 2\) and dtype int64; give the "
           r"class names as a 1-d str array")  # fmt: skip
    reg = {k: v.astype(np.float32) if k.startswith("y_") else v for k, v in arrays.items()}
    reg["classes"], reg["task"] = np.array(["a", "b"]), np.array("regression")
    _fails(tmp_path, reg, r"key 'classes' is given but the task is regression")


@pytest.mark.parametrize(
    "change, patterns",
    [
        (
            lambda a: a.update(y_test=np.arange(7) % 2),
            [r"key 'y_test' holds numbers but y_train holds class names; store every split"],
        ),
        (
            lambda a: a["y_train"].__setitem__(4, ""),
            [r"key 'y_train' has an empty class name at index 4 \(a missing label\?\)"],
        ),
        (
            lambda a: a.update(n_classes=np.array(2)),
            [r"key 'n_classes' is given but the labels are class names", "drop n_classes"],
        ),
        (lambda a: a.update(classes=np.array(["x", "y"])), [r"key 'classes' is given but"]),
        (
            lambda a: a.update(task=np.array("regression")),
            [r"key 'y_train' holds class names but task is 'regression'"],
        ),
        (
            lambda a: a.update(y_val=np.array([["x"] * 2] * 5)),
            [r"key 'y_val' has shape \(5, 2\); classification labels must be \(N,\)"],
        ),
        (lambda a: a.update(y_train=np.array([b"\xff"] * 12)), [r"not UTF-8 text"]),
        (
            lambda a: a.update(y_train=np.array(["x"] * 12, dtype=object)),
            [r"key 'y_train' cannot be loaded", r"np.asarray\(y, dtype=str\)"],
        ),
    ],
)
def test_class_name_errors(tmp_path, change, patterns):
    arrays = _classification()
    for s in SIZES:
        arrays[f"y_{s}"] = np.array(["x", "y"])[arrays[f"y_{s}"] % 2]
    change(arrays)
    _fails(tmp_path, arrays, *patterns)


def test_float_labels_with_n_classes_are_classification(tmp_path):
    arrays = _classification()
    for s in SIZES:
        arrays[f"y_{s}"] = arrays[f"y_{s}"].astype(np.float64)
    assert load_user_npz(_write(tmp_path, arrays)).task == "regression"
    arrays["n_classes"] = np.array(4)
    ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.task == "classification" and ds.splits["val"].y.dtype == np.int32


def test_valid_tokens(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {}
    for s, n in SIZES.items():
        arrays[f"x_{s}"] = rng.integers(0, 20, size=(n, L)).astype(np.int64)
        arrays[f"y_{s}"] = rng.integers(0, 3, size=n)
    arrays["x_val"][0, 0] = 41
    ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.vocab_size == 42
    assert ds.splits["train"].x.dtype == np.int32 and ds.meta["in_dim"] is None
    assert "token sequences of length L = 9 (vocab 42)" in describe(ds)
    arrays["vocab_size"] = np.array(64)
    assert load_user_npz(_write(tmp_path, arrays)).vocab_size == 64


def test_valid_per_step_regression_with_times(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {}
    for s, n in SIZES.items():
        arrays[f"x_{s}"] = rng.normal(size=(n, L, D))
        arrays[f"y_{s}"] = rng.normal(size=(n, L))
        arrays[f"t_{s}"] = np.cumsum(rng.uniform(0.1, 1.0, size=(n, L)), axis=1)
        arrays[f"lengths_{s}"] = rng.integers(1, L + 1, size=n)
        # after the valid steps (padding) times need not increase
        arrays[f"t_{s}"][0, arrays[f"lengths_{s}"][0] :] = 0.0
    ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.task == "regression" and ds.n_classes == 0
    assert ds.meta["per_step"] is True and ds.meta["target_dim"] == 1
    train = ds.splits["train"]
    assert train.y.shape == (12, L, 1) and train.y.dtype == np.float32
    assert train.t.shape == (12, L) and train.t.dtype == np.float32
    text = describe(ds)
    assert "regression of a 1-dim target per step" in text
    assert "observation times" in text


@pytest.mark.parametrize(
    ("shape", "per_step", "stored", "per_step_out", "dim"),
    [
        ((), None, (), False, 1),
        ((2,), None, (2,), False, 2),
        ((L, 2), None, (L, 2), True, 2),
        ((L,), False, (L,), False, L),
    ],
)
def test_regression_target_shapes(tmp_path, shape, per_step, stored, per_step_out, dim):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.ones((n, *shape), np.float32)
    if per_step is not None:
        arrays["per_step"] = np.array(per_step)
    ds = load_user_npz(_write(tmp_path, arrays))
    assert ds.splits["val"].y.shape == (5, *stored)
    assert ds.meta["per_step"] is per_step_out and ds.meta["target_dim"] == dim
    assert ("per step" if per_step_out else "per sequence") in describe(ds)


def test_describe_a_prepared_dataset():
    split = Split(x=np.zeros((3, 2, 5), np.int32), y=np.zeros(3, np.int32))
    ds = PreparedDataset("pairs", "classification", {"train": split}, n_classes=2, vocab_size=7)
    assert "token inputs of shape (2, 5) each (vocab 7)" in describe(ds)


# ----------------------------------------------------------------------- validation errors


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.npz: file not found"):
        load_user_npz(tmp_path / "nope.npz")


def test_not_an_npz(tmp_path):
    bad = tmp_path / "data.npz"
    bad.write_text("x,y\n1,2\n")
    # The message shows the keys training needs (val is optional) and the other format.
    keys = r"np\.savez\(path, x_train=.*x_test=.*\(x_val, y_val optional\).*NAME_TRAIN\.ts"
    with pytest.raises(DatasetError, match=r"data\.npz: not an \.npz file.*" + keys):
        load_user_npz(bad)
    npy = tmp_path / "single.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(DatasetError, match=r"not an \.npz file"):
        load_user_npz(npy)


def _without_val(arrays):
    return {k: v for k, v in arrays.items() if not k.endswith("_val")}


def test_a_file_without_val_keys_gets_a_stratified_carve(tmp_path):
    """No val key: `val_fraction` of each class of the training split becomes val (as for a
    .ts file), seeded; train and val together are the file's training rows, lengths and
    times carved with them; `val_fraction = 0` leaves no val split."""
    rng = np.random.default_rng(3)
    n = 200
    arrays = {"x_train": rng.normal(size=(n, L, D)).astype(np.float32),
              "y_train": np.repeat([0, 1, 2, 3], [100, 60, 30, 10]),
              "lengths_train": rng.integers(1, L + 1, n),
              "t_train": np.cumsum(rng.uniform(0.5, 1.5, (n, L)), axis=1),
              "x_test": rng.normal(size=(8, L, D)).astype(np.float32),
              "y_test": np.arange(8) % 4}  # fmt: skip
    path = _write(tmp_path, arrays)
    data = load_user_npz(path, val_fraction=0.1, val_seed=5)
    train, val = data.splits["train"], data.splits["val"]
    assert list(data.splits) == ["train", "val", "test"] and data.meta["val_carved"]
    assert np.bincount(val.y).tolist() == [10, 6, 3, 1]  # round(0.1 * class size), >= 1
    assert len(train.x) + len(val.x) == n
    # every carved row is one of the file's training rows, with its own label, length, times
    rows = {arrays["x_train"][i].tobytes(): i for i in range(n)}
    for split in (train, val):
        idx = np.array([rows[x.tobytes()] for x in split.x])
        assert np.array_equal(split.y, arrays["y_train"][idx])
        assert np.array_equal(split.lengths, arrays["lengths_train"][idx])
        valid = np.arange(L)[None, :] < split.lengths[:, None]  # padding times are ours
        t = arrays["t_train"][idx].astype(np.float32)
        np.testing.assert_array_equal(split.t[valid], t[valid])
    assert len({rows[x.tobytes()] for s in (train, val) for x in s.x}) == n
    assert data.meta["val_split"].startswith(
        "val carved from the training split of data.npz: 20 of 200, stratified by class"
    )
    again = load_user_npz(path, val_fraction=0.1, val_seed=5)
    assert np.array_equal(again.splits["val"].x, val.x)
    other = load_user_npz(path, val_fraction=0.1, val_seed=6)
    assert not np.array_equal(other.splits["val"].x, val.x)
    none = load_user_npz(path, val_fraction=0.0)
    assert list(none.splits) == ["train", "test"] and len(none.splits["train"].x) == n
    assert "no val split" in none.meta["val_split"] and "val_carved" not in none.meta


def test_regression_carve_and_carve_errors(tmp_path):
    arrays = _without_val(_classification())
    arrays["y_train"] = arrays["y_train"].astype(np.float32) + 0.5
    arrays["y_test"] = arrays["y_test"].astype(np.float32)
    data = load_user_npz(_write(tmp_path, arrays), val_fraction=0.25)
    n = len(arrays["x_train"])
    assert data.task == "regression" and len(data.splits["val"].x) == round(0.25 * n)
    assert "drawn at random" in data.meta["val_split"]
    one = {**_without_val(_classification()), "x_train": arrays["x_train"][:1],
           "y_train": np.array([0])}  # fmt: skip
    _fails(tmp_path, one, r"too few training examples \(1\).*add x_val and y_val to the file")
    half = _classification()
    del half["y_val"]
    _fails(tmp_path, half, r"missing required key\(s\) 'y_val'.*or none of the val keys")
    with pytest.raises(DatasetError, match=r"val_fraction must be in \[0, 1\)"):
        load_user_npz(_write(tmp_path, arrays), val_fraction=1.0)


def test_missing_keys_are_listed(tmp_path):
    arrays = _classification()
    del arrays["y_val"], arrays["x_test"]
    _fails(tmp_path, arrays, r"missing required key\(s\) 'y_val', 'x_test'")


def test_unknown_key(tmp_path):
    arrays = _classification()
    arrays["length_train"] = np.ones(12, int)
    _fails(tmp_path, arrays, r"unknown key\(s\) 'length_train'.*lengths_train")


def test_object_array(tmp_path):
    arrays = _classification()
    arrays["x_val"] = np.array([np.zeros(3), np.zeros(4)], dtype=object)
    _fails(tmp_path, arrays, r"'x_val' cannot be loaded.*not Python objects")


@pytest.mark.parametrize("field", ["y", "lengths", "t"])
def test_mismatched_rows(tmp_path, field):
    arrays = _classification()
    arrays[f"{field}_val"] = {"y": np.zeros(4, int), "lengths": np.ones(4, int)}.get(
        field, np.tile(np.arange(L, dtype=float), (4, 1))
    )
    _fails(tmp_path, arrays, rf"key '{field}_val' has 4 rows but x_val has 5 examples")


def test_different_length_across_splits(tmp_path):
    arrays = _classification()
    arrays["x_test"] = np.zeros((7, L + 1, D), np.float32)
    _fails(tmp_path, arrays, r"'x_test' has sequence length L = 10 but x_train has L = 9.*pad")


def test_different_features_across_splits(tmp_path):
    arrays = _classification()
    arrays["x_val"] = np.zeros((5, L, D + 1), np.float32)
    _fails(tmp_path, arrays, r"'x_val' has D = 4 features per step but x_train has D = 3")


def test_tokens_and_features_mixed(tmp_path):
    arrays = _classification()
    arrays["x_val"] = np.zeros((5, L), np.int64)
    _fails(tmp_path, arrays, r"'x_val' has shape \(5, 9\) int64 but x_train holds features")


@pytest.mark.parametrize(
    ("x", "pattern"),
    [
        (np.zeros((12, L), np.float32), r"'x_train' is float of shape \(12, 9\).*x\[\.\.\., None"),
        (np.zeros((12, L, 2, 2)), r"'x_train' has shape \(12, 9, 2, 2\) \(rank 4\); inputs must"),
        (np.zeros(12), r"'x_train' has shape \(12,\) \(rank 1\)"),
    ],
)  # fmt: skip
def test_wrong_input_rank(tmp_path, x, pattern):
    arrays = _classification()
    arrays["x_train"] = x
    _fails(tmp_path, arrays, pattern)


def test_wrong_label_rank(tmp_path):
    arrays = _classification()
    arrays["y_train"] = np.zeros((12, L + 1), int)
    _fails(
        tmp_path,
        arrays,
        r"'y_train' has shape \(12, 10\); classification labels must be \(N,\), one per "
        r"example, or \(N, L\) = \(N, 9\), one per step",
    )
    arrays["y_train"] = np.zeros((12, 1), int)  # a column vector (pandas, sklearn)
    _fails(tmp_path, arrays, r"'y_train' has shape \(12, 1\); .* \(store y_train\.ravel\(\)\)")
    arrays["y_train"] = np.zeros((12, L), int)  # per step, but the other splits per example
    _fails(
        tmp_path,
        arrays,
        r"'y_val' has shape \(5,\) \(one label per example\) but y_train has one per step "
        r"\(12, 9\); store every split's labels the same way",
    )


def test_wrong_target_rank(tmp_path):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.zeros((n, L, 1, 1))
    _fails(tmp_path, arrays, r"'y_train' has shape \(12, 9, 1, 1\) \(rank 4\); regression")


def test_per_step_target_length(tmp_path):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.zeros((n, L - 1, 2))
    _fails(tmp_path, arrays, r"'y_train' has shape \(12, 8, 2\) but per-step targets need")


def test_target_shapes_differ_across_splits(tmp_path):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.zeros((n, 2))
    arrays["y_test"] = np.zeros((7, 3))
    _fails(tmp_path, arrays, r"'y_test' has target shape .* same target shape as y_train")


def test_labels_out_of_range(tmp_path):
    arrays = _classification()
    arrays["n_classes"] = np.array(4)
    arrays["y_val"][2] = 4
    _fails(tmp_path, arrays, r"'y_val' has label 4 but n_classes is 4; labels must be 0 \.\. 3")


def test_negative_label(tmp_path):
    arrays = _classification()
    arrays["y_test"][3] = -1
    _fails(tmp_path, arrays, r"'y_test' has negative label -1.*consecutive integers from 0")


def test_a_label_beyond_int32_is_named_not_wrapped(tmp_path):
    """10**12 wrapped to a negative int32 and the file was refused as having 1 class."""
    arrays = _classification()
    arrays["y_train"] = np.full(len(arrays["y_train"]), 10**12)
    _fails(tmp_path, arrays, r"'y_train' has label 1000000000000; labels must be 0 \.\. n_cl")


def test_non_integer_label(tmp_path):
    arrays = _classification()
    arrays["y_train"] = arrays["y_train"].astype(np.float32)
    arrays["y_train"][5] = 1.5
    arrays["task"] = np.array("classification")
    _fails(tmp_path, arrays, r"'y_train' has non-integer label 1\.5 at example 5.*regression")


@pytest.mark.parametrize("split", ["val", "test"])
def test_float_train_targets_beside_integer_labels(tmp_path, split):
    """The task follows y_train's dtype; an integer split beside float y_train is refused
    (class labels whose training split went through pandas) unless `task` says which."""
    arrays = _classification()
    arrays["y_train"] = arrays["y_train"].astype(np.float64)
    for s in SIZES:
        if s not in ("train", split):
            arrays[f"y_{s}"] = arrays[f"y_{s}"].astype(np.float32)
    _fails(tmp_path, arrays, rf"'y_{split}' is integer .* y_train is float .*task='regression'")
    for task in ("regression", "classification"):
        arrays["task"] = np.array(task)
        assert load_user_npz(_write(tmp_path, arrays)).task == task


def test_single_class(tmp_path):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.zeros(n, int)
    _fails(tmp_path, arrays, r"only 1 class; classification needs at least 2.*n_classes")


@pytest.mark.parametrize("key", ["x_val", "y_val", "t_val"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf(tmp_path, key, value):
    arrays = _classification()
    for s, n in SIZES.items():
        arrays[f"y_{s}"] = np.zeros((n, 2))
    arrays["t_val"] = np.tile(np.arange(L, dtype=float), (5, 1))
    arrays[key] = arrays[key].copy()
    arrays[key][1, 1] = value
    _fails(tmp_path, arrays, rf"'{key}' contains NaN or Inf \(first at index \(1, 1.*pad")


def _padded(rng, pad_value):
    """Per-step regression with lengths and times, every padding step holding `pad_value`
    in x, y and t; with the valid steps' arrays."""
    arrays, valid = {}, {}
    for s, n in SIZES.items():
        lengths = rng.integers(1, L + 1, size=n)
        lengths[0] = L  # one unpadded example
        keep = np.arange(L)[None, :] < lengths[:, None]
        x = rng.normal(size=(n, L, D)).astype(np.float32)
        y = rng.normal(size=(n, L)).astype(np.float32)
        t = np.cumsum(rng.uniform(0.5, 1.5, size=(n, L)), axis=1).astype(np.float32)
        arrays |= {f"x_{s}": np.where(keep[..., None], x, pad_value),
                   f"y_{s}": np.where(keep, y, pad_value), f"t_{s}": np.where(keep, t, pad_value),
                   f"lengths_{s}": lengths}  # fmt: skip
        valid[s] = (keep, x, y, t)
    return arrays, valid


def test_nan_padding_reads_as_zero_padding(tmp_path):
    """NaN (or Inf) on the padding steps of a file with lengths is allowed: the loaded x and
    y equal those of the same file padded with zeros (padding 0), the valid steps are the
    file's; times go on after each example's last valid time in steps of the split's median
    valid step, whatever the padding held (zeros too: a reverse scan over times padded with
    zeros grows by exp(|Re λ|·Δ·t_last))."""
    loaded = {}
    for pad in (np.nan, np.inf, 0.0):
        arrays, valid = _padded(np.random.default_rng(3), pad)
        loaded[pad] = load_user_npz(_write(tmp_path, arrays, f"pad{pad}.npz"))
    for s in SIZES:
        keep, x, y, t = valid[s]
        got = {pad: ds.splits[s] for pad, ds in loaded.items()}
        for pad in (np.nan, np.inf):
            np.testing.assert_array_equal(got[pad].x, got[0.0].x)
            np.testing.assert_array_equal(got[pad].y, got[0.0].y)
            np.testing.assert_array_equal(got[pad].t, got[0.0].t)
        np.testing.assert_array_equal(got[0.0].x[keep], x[keep])
        np.testing.assert_array_equal(got[0.0].y[..., 0][keep], y[keep])
        assert np.all(got[0.0].x[~keep] == 0) and np.all(got[0.0].y[~keep] == 0)
        np.testing.assert_array_equal(got[0.0].t[keep], t[keep])
        step = np.median(np.diff(t, axis=1)[keep[:, 1:]])
        gaps = np.diff(got[0.0].t.astype(np.float64), axis=1)[~keep[:, 1:]]
        np.testing.assert_allclose(gaps, step, rtol=1e-4)


def test_nan_on_valid_steps_or_unmarked_padding_is_refused(tmp_path):
    arrays, _ = _padded(np.random.default_rng(4), np.nan)
    lengths = arrays["lengths_train"]
    mid = dict(arrays, x_train=arrays["x_train"].copy())
    mid["x_train"][2, lengths[2] - 1, 1] = np.nan  # the last valid step
    _fails(tmp_path, mid, rf"'x_train' contains NaN or Inf \(first at index \(2, {lengths[2] - 1}, "
           rf"1\), a valid step of its {lengths[2]}\); replace them")  # fmt: skip
    bare = {k: v for k, v in arrays.items() if not k.startswith("lengths_")}
    first = int(np.argmax(lengths != L))
    _fails(tmp_path, bare, rf"'x_train' contains NaN or Inf \(first at index \({first}, "
           rf"{lengths[first]}, 0\)\); they end the sequences, as padding does: give "
           r"lengths_train, each example's valid steps \(lengths_train = "
           r"np\.isfinite\(x_train\)\.all\(axis=2\)\.sum\(axis=1\)\)")  # fmt: skip
    per_sequence = {**mid, "x_train": arrays["x_train"], "y_train": np.ones(len(lengths))}
    per_sequence["y_train"][2] = np.nan  # one target per example: no steps, no padding
    _fails(tmp_path, per_sequence, r"'y_train' contains NaN or Inf \(first at index \(2,\)\); "
           "replace them")  # fmt: skip
    formula = np.isfinite(arrays["x_train"]).all(axis=2).sum(axis=1)
    np.testing.assert_array_equal(formula, lengths)  # the formula the message gives
    bare |= {f"x_{s}": np.nan_to_num(bare[f"x_{s}"]) for s in SIZES}
    _fails(tmp_path, bare, r"'y_train' contains NaN.*give lengths_train.*"
           r"np\.isfinite\(y_train\)\.sum\(axis=1\)")  # fmt: skip


@pytest.mark.parametrize("bad", [0, L + 1])
def test_lengths_out_of_range(tmp_path, bad):
    arrays = _classification()
    arrays["lengths_test"] = np.full(7, L)
    arrays["lengths_test"][4] = bad
    _fails(tmp_path, arrays, rf"'lengths_test' has length {bad} at example 4.*between 1 and L = 9")


def test_lengths_not_integer(tmp_path):
    arrays = _classification()
    arrays["lengths_train"] = np.full(12, 3.0)
    _fails(tmp_path, arrays, r"'lengths_train' has dtype float64; lengths must be integers")
    arrays["lengths_train"] = np.ones(12, bool)  # a mask is not lengths (True would read as 1)
    _fails(tmp_path, arrays, r"'lengths_train' has dtype bool; lengths must be integers")


def test_times_not_increasing(tmp_path):
    arrays = _classification()
    t = np.tile(np.arange(L, dtype=float), (12, 1))
    t[3, 5] = t[3, 4]
    arrays["t_train"] = t
    _fails(tmp_path, arrays, r"'t_train' is not strictly increasing: example 3 has t\[4\] = 4\.0")
    # inside the valid steps given by lengths it still fails, outside it passes
    arrays["lengths_train"] = np.full(12, L)
    arrays["lengths_train"][3] = 6
    _fails(tmp_path, arrays, "not strictly increasing")
    arrays["lengths_train"][3] = 5
    assert load_user_npz(_write(tmp_path, arrays)).splits["train"].t is not None


def test_times_wrong_shape(tmp_path):
    arrays = _classification()
    arrays["t_val"] = np.zeros((5, L, 1))
    _fails(tmp_path, arrays, r"'t_val' has shape \(5, 9, 1\); observation times must be \(N, L\)")


def test_negative_tokens(tmp_path):
    arrays = {}
    for s, n in SIZES.items():
        arrays[f"x_{s}"] = np.ones((n, L), np.int32)
        arrays[f"y_{s}"] = np.arange(n) % 2
    arrays["x_test"][0, 0] = -3
    _fails(tmp_path, arrays, r"'x_test' has negative token id -3.*non-negative")


def test_tokens_beyond_vocab_size(tmp_path):
    arrays = {}
    for s, n in SIZES.items():
        arrays[f"x_{s}"] = np.ones((n, L), np.int32)
        arrays[f"y_{s}"] = np.arange(n) % 2
    arrays["x_val"][0, 0] = 8
    arrays["vocab_size"] = np.array(8)
    _fails(tmp_path, arrays, r"'x_val' has token id 8 but vocab_size is 8")


def test_bad_scalar_keys(tmp_path):
    arrays = _classification()
    arrays["n_classes"] = np.array([4, 5])
    _fails(tmp_path, arrays, r"'n_classes' must be a single value")
    arrays["n_classes"] = np.array(2.5)
    _fails(tmp_path, arrays, r"'n_classes' must be a positive integer")
    arrays["n_classes"] = np.array(True)
    _fails(tmp_path, arrays, r"'n_classes' must be a positive integer, got True")
    del arrays["n_classes"]
    arrays["task"] = np.array("segmentation")
    _fails(tmp_path, arrays, r"'task' must be 'classification' or 'regression'")
    arrays["task"] = np.array("regression")
    arrays["n_classes"] = np.array(4)
    _fails(tmp_path, arrays, r"'n_classes' is given but task is 'regression'")
    del arrays["task"], arrays["n_classes"]
    arrays["vocab_size"] = np.array(4)
    _fails(tmp_path, arrays, r"'vocab_size' is given but the inputs are float features")


def test_empty_split(tmp_path):
    arrays = _classification()
    arrays["x_val"] = np.zeros((0, L, D), np.float32)
    arrays["y_val"] = np.zeros(0, int)
    _fails(tmp_path, arrays, r"'x_val' has no examples")


# ----------------------------------------------------------------------------- batching


def _split(n=23, with_extras=True):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)
    y = np.arange(n, dtype=np.int32)
    if not with_extras:
        return Split(x=x, y=y)
    lengths = (np.arange(n) % 2 + 1).astype(np.int32)
    t = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    return Split(x=x, y=y, lengths=lengths, t=t)


def _seen(batches):
    return np.concatenate([b["y"][b["mask"]] for b in batches])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n", [1, 7, 8, 23])
def test_each_example_once_per_epoch_with_static_shapes(shuffle, n):
    split = _split(n)
    batches = list(iterate_batches(split, 8, shuffle=shuffle, seed=3, epoch=1))
    assert len(batches) == num_batches(n, 8, True) == -(-n // 8)
    seen = _seen(batches)
    assert sorted(seen.tolist()) == list(range(n))
    if not shuffle:
        np.testing.assert_array_equal(seen, np.arange(n))
    for b in batches:
        assert set(b) == {"x", "y", "lengths", "t", "mask"}
        assert b["x"].shape == (8, 2, 2) and b["y"].shape == (8,) and b["mask"].shape == (8,)
        assert b["lengths"].shape == (8,) and b["t"].shape == (8, 2)
        assert b["mask"].dtype == np.bool_
        # every field stays aligned with its row
        rows = b["y"]
        np.testing.assert_array_equal(b["x"], split.x[rows])
        np.testing.assert_array_equal(b["lengths"], split.lengths[rows])
        np.testing.assert_array_equal(b["t"], split.t[rows])
    # padding repeats the batch's first row, masked out, at the end
    last = batches[-1]
    real = n - 8 * (len(batches) - 1)
    assert last["mask"].tolist() == [True] * real + [False] * (8 - real)
    assert (last["y"][real:] == last["y"][0]).all()


def test_optional_fields_absent():
    batches = list(iterate_batches(_split(5, with_extras=False), 4, shuffle=False))
    assert all(set(b) == {"x", "y", "mask"} for b in batches)


def test_short_or_dropped_last_batch():
    split = _split(10)
    short = list(iterate_batches(split, 4, shuffle=True, pad_last=False))
    assert [len(b["y"]) for b in short] == [4, 4, 2] and all(b["mask"].all() for b in short)
    assert sorted(_seen(short).tolist()) == list(range(10))
    dropped = list(iterate_batches(split, 4, shuffle=True, drop_last=True))
    assert len(dropped) == num_batches(10, 4, drop_last=True) == 2
    np.testing.assert_array_equal(_seen(dropped), _seen(short)[:8])
    assert num_batches(10, 4, False) == 3 and num_batches(0, 4) == 0


def test_shuffle_is_deterministic_per_seed_and_epoch():
    split = _split(40)

    def order(seed, epoch):
        return _seen(iterate_batches(split, 8, shuffle=True, seed=seed, epoch=epoch))

    np.testing.assert_array_equal(order(0, 2), order(0, 2))
    np.testing.assert_array_equal(order(0, 2), epoch_order(40, shuffle=True, seed=0, epoch=2))
    assert not np.array_equal(order(0, 2), order(0, 3))
    assert not np.array_equal(order(0, 2), order(1, 2))
    assert not np.array_equal(order(0, 0), np.arange(40))


@pytest.mark.parametrize("shuffle", [False, True])
def test_skip_equals_dropping_first_batches(shuffle):
    split = _split(29)
    full = list(iterate_batches(split, 6, shuffle=shuffle, seed=5, epoch=4))
    for k in range(len(full) + 1):
        resumed = list(iterate_batches(split, 6, shuffle=shuffle, seed=5, epoch=4, skip=k))
        assert len(resumed) == len(full) - k
        for a, b in zip(full[k:], resumed):
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def test_bad_arguments():
    split = _split(10)
    with pytest.raises(ValueError, match="past the end"):
        next(iterate_batches(split, 4, shuffle=False, skip=4))
    with pytest.raises(ValueError, match="skip must be"):
        next(iterate_batches(split, 4, shuffle=False, skip=-1))
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        num_batches(10, 0)
    with pytest.raises(ValueError, match="non-negative"):
        epoch_order(10, shuffle=True, seed=-1)


@pytest.mark.parametrize("shuffle", [False, True])
def test_memmap_split(tmp_path, shuffle):
    split = _split(50)
    ds = PreparedDataset("mm", "classification", {"train": split}, n_classes=50)
    loaded = load_prepared(save_prepared(tmp_path / "mm", ds)).splits["train"]
    assert isinstance(loaded.x, np.memmap)
    batches = list(iterate_batches(loaded, 16, shuffle=shuffle, seed=1))
    expected = list(iterate_batches(split, 16, shuffle=shuffle, seed=1))
    for a, b in zip(batches, expected):
        for key in a:
            assert type(a[key]) is np.ndarray  # copied rows, not views of the map
            np.testing.assert_array_equal(a[key], b[key])
    assert sorted(_seen(batches).tolist()) == list(range(50))
