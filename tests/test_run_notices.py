"""What a run tells its user about its data and setup: generated data is labelled as such,
from the folder to the results; remat on CPU warns about the scheduler flag."""

import dataclasses
import io
import json
import logging

import pytest

from s5jax.config import apply_overrides, load_experiment
from s5jax.data import (
    DatasetError,
    generate_listops,
    generate_pathfinder,
    prepare_listops,
    prepare_pathfinder,
)
from s5jax.train._datasets import synthetic_dataset
from s5jax.train._engine import train_and_evaluate


def test_generated_listops_is_labelled_and_the_release_is_not(tmp_path):
    folder = generate_listops(
        tmp_path / "gen", n_train=6, n_val=2, n_test=2, seed=3, min_length=5,
        max_length=60, progress=False,
    )  # fmt: skip
    record = json.loads((folder / "generator.json").read_text())
    assert record["generated"] is True and record["seed"] == 3
    assert record["sizes"] == {"train": 6, "val": 2, "test": 2}
    ds = prepare_listops(folder, tmp_path / "prepared", progress=False)
    assert ds.meta["generated"] == record
    # A copy without the provenance file (as the LRA release) is real data.
    (folder / "generator.json").unlink()
    real = prepare_listops(folder, tmp_path / "prepared-real", progress=False)
    assert "generated" not in real.meta


def test_generated_pathfinder_is_labelled(tmp_path):
    root = generate_pathfinder(tmp_path / "gen", resolution=32, n_images=20, seed=1,
                               progress=False)  # fmt: skip
    ds = prepare_pathfinder(root, out=tmp_path / "prepared")
    assert ds.meta["generated"]["generated"] is True
    assert ds.meta["generated"]["seed"] == 1


def test_unreadable_provenance_names_the_file(tmp_path):
    folder = generate_listops(
        tmp_path / "gen", n_train=2, n_val=1, n_test=1, seed=0, min_length=5,
        max_length=60, progress=False,
    )  # fmt: skip
    (folder / "generator.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"generator\.json"):
        prepare_listops(folder, tmp_path / "prepared", progress=False)


@pytest.mark.parametrize("generated", [False, True])
def test_results_say_when_the_data_was_generated(tmp_path, generated):
    data = synthetic_dataset(seq_len=16, n_train=32, n_eval=16)
    if generated:
        data = dataclasses.replace(data, meta={**data.meta, "generated": {"generated": True}})
    cfg = apply_overrides(load_experiment("synthetic"), ["train.epochs=1"])
    out = io.StringIO()
    summary = train_and_evaluate(cfg, tmp_path / "run", dataset=data, progress=False, stream=out)
    assert summary["generated_data"] is generated
    assert ("generated data" in out.getvalue()) is generated


def test_remat_on_cpu_warns_about_the_scheduler_flag(tmp_path, monkeypatch, caplog):
    """A warning through logging (so `s5jax -q` keeps it), not a line of the messages."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    data = synthetic_dataset(seq_len=16, n_train=32, n_eval=16)
    cfg = apply_overrides(load_experiment("synthetic"), ["train.epochs=1", "model.remat=layers"])
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="s5jax"):
        train_and_evaluate(cfg, tmp_path / "run", dataset=data, progress=False, stream=out)
    [warning] = [r for r in caplog.records if r.name == "s5jax.train._engine"]
    assert warning.levelno == logging.WARNING
    assert "xla_cpu_enable_concurrency_optimized_scheduler=false" in warning.getMessage()
    assert "xla_cpu_enable" not in out.getvalue()
