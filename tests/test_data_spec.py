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


def test_the_digest_follows_the_examples_not_their_memory_or_normalisation(tmp_path):
    """`data_digest`: the same for the same examples whatever their memory layout (a
    Fortran-order copy, a memory-mapped prepared folder) and normalisation; different when
    one value, the shape (same bytes), the dtype (same bytes) or a split's name changes."""
    from s5jax.data import load_prepared, save_prepared
    from s5jax.data._normalize import normalize_dataset
    from s5jax.data._prepared import DIGEST, data_digest, with_digest

    split = CASES["features"][0]
    ds = PreparedDataset("f", "classification", {"train": split, "test": split}, 4, None, {})
    digest = data_digest(ds)
    assert digest.startswith("crc32:") and len(digest) == len("crc32:") + 8

    def with_split(**fields):
        return PreparedDataset("f", "classification", {"train": Split(**{
            "x": split.x, "y": split.y, "lengths": split.lengths, "t": split.t, **fields,
        }), "test": split}, 4, None, {})  # fmt: skip

    assert data_digest(with_split(x=np.asfortranarray(split.x))) == digest
    mapped = load_prepared(save_prepared(tmp_path / "p", ds), mmap=True)
    assert data_digest(mapped) == digest
    normalized = normalize_dataset(with_digest(ds), "channel")
    assert normalized.meta[DIGEST] == digest and data_digest(normalized) != digest
    changed = split.x.copy()
    changed[3, 2, 1] = np.nextafter(changed[3, 2, 1], np.float32(np.inf))  # one ulp
    others = [
        with_split(x=changed),
        with_split(x=split.x.reshape(9, 3, 7)),
        with_split(x=split.x.view(np.int32)),
        with_split(lengths=None),
        PreparedDataset("f", "classification", {"train": split, "val": split}, 4, None, {}),
    ]
    assert len({digest, *(data_digest(d) for d in others)}) == 1 + len(others)


def test_a_resume_or_eval_on_changed_data_warns(tmp_path, capsys):
    """A run records its data's digest in data_spec.json; resuming it, or evaluating it, on
    data that changed since (one value of the file) warns, naming both digests; on the
    same data it says nothing."""
    from s5jax.cli import main

    rng = np.random.default_rng(3)
    arrays = {}
    for split, n in (("train", 16), ("val", 8), ("test", 8)):
        arrays[f"x_{split}"] = rng.normal(size=(n, 6, 2)).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, 2, n)
    path, run = tmp_path / "mine.npz", tmp_path / "run"
    np.savez(path, **arrays)
    tiny = ["model.n_layers=1", "model.d_model=8", "model.ssm_size=8", "model.blocks=2",
            "model.members=1", "data.batch_size=8", "optim.warmup_epochs=0"]  # fmt: skip

    def train(epochs, *flags):
        sets = [a for o in [*tiny, f"train.epochs={epochs}"] for a in ("--set", o)]
        return main(["-q", "train", "--data", str(path), "--workdir", str(run),
                     "--no-progress", *sets, *flags])  # fmt: skip

    def warnings():  # the one-line warnings on stderr
        err = capsys.readouterr().err
        return [line for line in err.splitlines() if "the data differ" in line]

    assert train(1) == 0
    first = json.loads((run / "data_spec.json").read_text())["meta"]["digest"]
    assert train(2, "--resume") == 0 and main(["eval", str(run)]) == 0
    assert warnings() == []
    arrays["x_train"][0, 0, 0] += 1.0
    np.savez(path, **arrays)
    assert train(3, "--resume") == 0
    now = json.loads((run / "data_spec.json").read_text())["meta"]["digest"]
    [message] = warnings()
    assert message.startswith(f"s5jax: warning: {run}: the data differ")
    assert now != first and f"records {first}, the data now give {now}" in message
    assert "the run continues on the data as they are now" in message
    assert main(["eval", str(run)]) == 0  # the spec now records the data resumed on
    assert warnings() == []
    arrays["y_test"][0] = 1 - arrays["y_test"][0]
    np.savez(path, **arrays)
    assert main(["eval", str(run)]) == 0
    [message] = warnings()
    assert f"records {now}" in message and "not of the data the run trained on" in message


def test_load_dataset_records_the_digest_of_the_data_as_read(tmp_path):
    """Through `load_dataset`, for a registered dataset and a user's file: `meta["digest"]`
    is the checksum of the data as read, the same whatever `data.normalize` does to them."""
    from dataclasses import replace

    from s5jax.config import load_experiment
    from s5jax.data._prepared import DIGEST, data_digest
    from s5jax.train._datasets import load_dataset

    rng = np.random.default_rng(5)
    path = tmp_path / "mine.npz"
    np.savez(path, **{f"{k}_{s}": v for s, n in (("train", 12), ("val", 6), ("test", 6))
                      for k, v in (("x", rng.normal(3.0, 2.0, (n, 5, 2)).astype(np.float32)),
                                   ("y", rng.integers(0, 2, n)))})  # fmt: skip
    data = load_experiment("synthetic").data
    for name in ("synthetic", str(path)):
        raw = load_dataset(replace(data, dataset=name, normalize="none"))
        assert raw.meta[DIGEST] == data_digest(raw)
        for mode in ("channel", "example"):
            normalized = load_dataset(replace(data, dataset=name, normalize=mode))
            assert normalized.meta[DIGEST] == raw.meta[DIGEST] != data_digest(normalized)
