"""Loading a configured dataset: the prepared cache is found wherever it was prepared from,
`data.n_train` / `data.n_eval` truncate, `data.seq_len` is checked, `s5jax list` sees it."""

import pytest

from s5jax.config import DataConfig
from s5jax.data import DatasetError
from s5jax.train._datasets import load_dataset, prepare_named
from s5jax.train._runs import data_status

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
    with pytest.raises(DatasetError, match=r"data\.seq_len = 1000 .* length 2048"):
        load_dataset(DataConfig(dataset="listops", seq_len=1000))


def test_list_sees_prepared_speech(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    assert data_status("speech35") == "missing"
    write_speech(tmp_path / "root" / "speech_commands")
    prepare_named("speech35")
    assert data_status("speech35") == "ready"
