"""Loading a configured dataset: the prepared cache is found wherever it was prepared from,
`data.n_train` / `data.n_eval` truncate, `data.seq_len` is checked on every split, `s5jax list`
sees it; a prepared folder of another format version or with a file missing is refused."""

import json

import numpy as np
import pytest

from s5jax.config import DataConfig
from s5jax.data import DatasetError, PreparedDataset, Split, load_prepared, save_prepared
from s5jax.train._datasets import limit_and_check, load_dataset, prepare_named, sequence_length
from s5jax.train._runs import data_status, prepared_note

from ._fixtures import write_listops, write_speech

ROWS = {
    "train": [("[MAX 2 9 ( [MIN 4 7 ] ) 0 ]", 9), ("[SM 1 2 ]", 3), ("[MED 5 1 8 ]", 5)],
    "val": [("[MIN 3 4 ]", 3), ("[MAX 1 6 ]", 6)],
    "test": [("[SM 2 2 ]", 4), ("[MIN 9 8 ]", 8)],
}


@pytest.fixture
def listops_elsewhere(tmp_path, monkeypatch):
    """ListOps prepared with --source from a folder outside the data root."""
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    write_listops(tmp_path / "elsewhere", ROWS)
    return prepare_named("listops", tmp_path / "elsewhere")


def test_training_finds_data_prepared_from_another_folder(listops_elsewhere, tmp_path):
    assert data_status("listops") == "ready"
    assert prepared_note("listops", 2048) == ""  # read from a release-like copy, at 2048
    assert prepared_note("listops", 1000) == "L 2048, not 1000"
    ds = load_dataset(DataConfig(dataset="listops"))
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 3, "val": 2, "test": 2}
    assert ds.meta["source"] == listops_elsewhere.meta["source"]
    assert str(tmp_path / "elsewhere") in ds.meta["source"]


def test_n_train_and_n_eval_keep_the_first_examples(listops_elsewhere):
    full = load_dataset(DataConfig(dataset="listops"))
    ds = load_dataset(DataConfig(dataset="listops", n_train=2, n_eval=1))
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 2, "val": 1, "test": 1}
    for name, split in ds.splits.items():
        n = len(split)
        assert (split.x == full.splits[name].x[:n]).all()
        assert (split.y == full.splits[name].y[:n]).all()
        assert (split.lengths == full.splits[name].lengths[:n]).all()
    assert ds.meta["limited"] == {"train": 2, "val": 1, "test": 1}
    # Limits larger than a split leave it whole.
    big = load_dataset(DataConfig(dataset="listops", n_train=100, n_eval=100))
    assert {k: len(v) for k, v in big.splits.items()} == {"train": 3, "val": 2, "test": 2}


def test_seq_len_is_checked(listops_elsewhere):
    ds = load_dataset(DataConfig(dataset="listops", seq_len=2048))
    assert ds.splits["train"].x.shape[1] == 2048
    # The message names the override that trains at the data's length.
    with pytest.raises(DatasetError, match=r"data\.seq_len = 1000 .* length 2048.*"
                       r"--set data\.seq_len=2048"):  # fmt: skip
        load_dataset(DataConfig(dataset="listops", seq_len=1000))


def test_list_sees_prepared_speech(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    assert data_status("speech35") == "missing"
    write_speech(tmp_path / "root" / "speech_commands")
    prepare_named("speech35")
    assert data_status("speech35") == "ready"


def _dataset(lengths: dict[str, int], tokens: bool = False, pairs: bool = False):
    rng = np.random.default_rng(0)
    splits = {}
    for name, L in lengths.items():
        if pairs:
            x = rng.integers(0, 9, (3, 2, L)).astype(np.int32)
        elif tokens:
            x = rng.integers(0, 9, (3, L)).astype(np.int32)
        else:
            x = rng.standard_normal((3, L, 2)).astype(np.float32)
        splits[name] = Split(x=x, y=np.arange(3, dtype=np.int32) % 2)
    return PreparedDataset(name="d", task="classification", splits=splits, n_classes=2,
                           vocab_size=9 if tokens or pairs else None)  # fmt: skip


@pytest.mark.parametrize("kind", ["features", "tokens", "pairs"])
def test_sequence_length_of_features_tokens_and_pairs(kind):
    ds = _dataset({"train": 7}, tokens=kind == "tokens", pairs=kind == "pairs")
    assert sequence_length(ds.splits["train"]) == 7  # (N, L, d), (N, L), (N, 2, L)
    assert limit_and_check(ds, DataConfig(seq_len=7)) is ds


@pytest.mark.parametrize("split", ["val", "test"])
def test_seq_len_is_checked_on_every_split(split):
    lengths = {"train": 8, "val": 8, "test": 8} | {split: 6}
    with pytest.raises(DatasetError, match=rf"data\.seq_len = 8 but the {split} split .* 6"):
        limit_and_check(_dataset(lengths, pairs=True), DataConfig(seq_len=8))


def test_prepared_round_trip_and_refusals(tmp_path):
    ds = _dataset({"train": 5, "test": 5}, tokens=True)
    folder = save_prepared(tmp_path / "prep", ds)
    back = load_prepared(folder)
    assert back.name == "d" and back.vocab_size == 9 and sorted(back.splits) == ["test", "train"]
    np.testing.assert_array_equal(back.splits["train"].x, ds.splits["train"].x)
    assert back.splits["train"].lengths is None
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "format_version": 0}))
    with pytest.raises(DatasetError, match="format_version 0 is not 1; prepare the dataset again"):
        load_prepared(folder)
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "test_y.npy").unlink()
    with pytest.raises(DatasetError, match=r"test_y\.npy is missing; prepare the dataset again"):
        load_prepared(folder)
    with pytest.raises(DatasetError, match="is not a prepared dataset"):
        load_prepared(tmp_path / "nothing")
    # a file cut short, or a record that is not JSON: DatasetError naming the file (which
    # lets the trainer prepare the cache again), under both ways of loading
    ds_folder = save_prepared(tmp_path / "cut", ds)
    x = ds_folder / "train_x.npy"
    x.write_bytes(x.read_bytes()[:100])
    for mmap in (True, False):
        with pytest.raises(DatasetError, match=r"train_x\.npy cannot be read .*prepare the data"):
            load_prepared(ds_folder, mmap=mmap)
    (ds_folder / "meta.json").write_text('{"name": "d", ')
    with pytest.raises(DatasetError, match=r"meta\.json cannot be read"):
        load_prepared(ds_folder)
    (ds_folder / "meta.json").write_text("[1, 2]")
    with pytest.raises(DatasetError, match=r"meta\.json is not a prepared dataset's record"):
        load_prepared(ds_folder)
    record = {k: v for k, v in meta.items() if k != "n_classes"}
    (ds_folder / "meta.json").write_text(json.dumps(record))
    with pytest.raises(DatasetError, match=r"meta\.json lacks n_classes; prepare the dataset"):
        load_prepared(ds_folder)
