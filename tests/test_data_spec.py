"""s5jax.train._data_spec: the stand-in dataset written at a run's start gives the model the
same inputs as the data (width, vocabulary, classes, output width, normalisation) for every
kind of data: features, tokens, two-document retrieval, per-step targets, times."""

import json

import numpy as np
import pytest

from s5jax.data import DatasetError, PreparedDataset, Split
from s5jax.train._data_spec import SPEC_ONLY, dataset_from_spec, write_data_spec
from s5jax.train._engine import _model_inputs

rng = np.random.default_rng(0)
CASES = {
    "features": (Split(rng.normal(size=(9, 7, 3)).astype(np.float32), rng.integers(0, 4, 9),
                       rng.integers(1, 8, 9), np.cumsum(rng.uniform(size=(9, 7)), 1)),
                 "classification", 4, None, "classification"),
    "tokens": (Split(rng.integers(0, 20, (9, 11)).astype(np.int32), rng.integers(0, 10, 9),
                     rng.integers(1, 12, 9)), "classification", 10, 20, "classification"),
    "retrieval": (Split(rng.integers(0, 30, (9, 2, 13)).astype(np.int32), rng.integers(0, 2, 9),
                        rng.integers(1, 14, (9, 2))), "classification", 2, 30, "retrieval"),
    "per-step": (Split(rng.normal(size=(9, 5, 2)).astype(np.float32),
                       rng.normal(size=(9, 5, 3)).astype(np.float32)), "regression", 0, None,
                 "regression"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stand_in_gives_the_model_the_same_inputs(tmp_path, case):
    split, task, n_classes, vocab, head = CASES[case]
    meta = {"normalization": {"mode": "channel", "mean": [0.5], "std": [2.0]},
            "one_hot_width": 24 if vocab else 0}  # fmt: skip
    real = PreparedDataset(case, task, {"train": split, "val": split}, n_classes, vocab, meta)
    write_data_spec(tmp_path, real)
    stand_in = dataset_from_spec(tmp_path / "data_spec.json", rows=4)
    assert _model_inputs(stand_in, head) == _model_inputs(real, head)
    assert stand_in.meta == {**meta, SPEC_ONLY: True}
    assert (stand_in.name, stand_in.task, stand_in.n_classes, stand_in.vocab_size) == (
        case, task, n_classes, vocab)  # fmt: skip
    got, want = stand_in.splits["train"], split
    assert len(got) == 4
    for field in ("x", "y", "lengths", "t"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert (a.shape[1:], a.dtype) == (b.shape[1:], b.dtype), field
    if got.lengths is not None:  # full-length examples, valid for any pooling
        assert (got.lengths == (got.x.shape[-1] if vocab else got.x.shape[1])).all()


def test_an_unreadable_spec_is_one_dataset_error(tmp_path):
    path = tmp_path / "data_spec.json"
    for text in ("{bad", json.dumps({"format": 9}), json.dumps({"format": 1})):
        path.write_text(text)
        with pytest.raises(DatasetError, match=r"data_spec\.json is unreadable"):
            dataset_from_spec(path, rows=2)
