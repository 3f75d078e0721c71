"""Every paper experiment takes a training step through the `s5jax` command line, on a tiny copy
of its dataset written in the real on-disk format and read by the real reader.

For each experiment the fixture is written under a fresh data root (`$S5JAX_DATA`) where a user
unpacks the archive (`DATA_SOURCES`); then `s5jax data prepare NAME --source PATH` and
`s5jax train EXPERIMENT` run in process. Only the batch sizes, the number of epochs and the
logging interval are overridden: the model, optimiser and schedule are the paper's. The fixture
sizes make one epoch exactly one optimiser step (training drops the last partial batch).

The pendulum is the exception: its reader accepts only the published data (sizes and target
sums, `datasets.md` §1.6, §1.10), so `s5jax data prepare pendulum` generates it for real (about
10 s) and the run takes one epoch at the paper's batch size, 2000 // 32 = 62 steps.

These tests compile with all of XLA's optimisations, as the `s5jax` command does (the rest of
the suite compiles quickly, tests/conftest.py): the paper's models are where running costs
more than compiling (2 min 26 s against 2 min 53 s for this file, 2 workers, AVX2 EPYC).
"""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import load_experiment
from s5jax.data import evaluate_listops, load_prepared
from s5jax.train import read_metrics
from s5jax.train._checkpoint import Checkpoints
from s5jax.train._datasets import load_dataset
from s5jax.train._engine import _Run

from ._fixtures import (
    write_aan,
    write_cifar,
    write_imdb,
    write_listops,
    write_mnist,
    write_pathfinder,
    write_speech,
)

pytestmark = pytest.mark.full_optimisation

# ---------------------------------------------------------------------------------------
# Fixtures in the real formats, laid out under the data root as DATA_SOURCES says. Each
# writer returns the folder to pass as `--source` (where the user unpacked the archive).

# Train uses every operator and digit: the vocabulary is the release's 18 ids (§2.1).
LISTOPS_ROWS = {
    "train": [
        ("( ( ( ( ( [MAX 0 ) 1 ) ( ( ( [MIN 2 ) 3 ) ] ) ) 4 ) ] )", 4),
        ("( ( ( ( [SM 5 ) 6 ) ( ( ( ( [MED 7 ) 8 ) 9 ) ] ) ) ] )", 9),
    ],
    "val": [("( ( ( [MED 2 ) 8 ) ] )", 5)],
    "test": [("( ( ( [MIN 6 ) ( ( ( [SM 3 ) 9 ) ] ) ) ] )", 2)],
}

IMDB_REVIEWS = {
    ("train", "neg"): {"0_3.txt": "A dull film.<br /><br />Never again."},
    ("train", "pos"): {"1_9.txt": "Wonderful acting, a joy from start to end."},
    ("test", "neg"): {"2_2.txt": "Boring and too long."},
    ("test", "pos"): {"3_10.txt": "Great fun!"},
}

# Text fields are Python bytes literals, read character by character (§2.4). Train holds all
# 95 printable ASCII characters: the vocabulary is the release's 3 + 95 = 98 ids (S5's IN_DIM).
_ASCII = "".join(map(chr, range(0x20, 0x7F)))
AAN_ROWS = {
    "train": [
        ("1", "P00-1001", "P00-1002", f"b'{_ASCII}'", "b'A grammar parser.'"),
        ("0.0", "P00-1003", "P00-1004", "b'Speech recognition.'", "b'Machine translation\\n'"),
    ],
    "val": [("1", "P00-1005", "P00-1006", "b'Tagging text.'", "b'Part of speech tags.'")],
    "test": [("0", "P00-1007", "P00-1008", "b'Word senses.'", "b'Discourse.'")],
}


def _listops(root: Path) -> Path:
    for rows in LISTOPS_ROWS.values():
        assert all(evaluate_listops(src) == label for src, label in rows)
    write_listops(root / "lra_release" / "lra_release", LISTOPS_ROWS)
    return root


def _imdb(root: Path) -> Path:
    write_imdb(root, IMDB_REVIEWS)
    return root


def _aan(root: Path) -> Path:
    write_aan(root / "lra_release", AAN_ROWS)  # lra_release/lra_release/tsv_data
    return root


def _cifar(root: Path) -> Path:
    # 10 training images: the 90/10 split gives train 9, val 1
    write_cifar(root / "cifar" / "cifar-10-batches-py", per_batch=2, n_test=2)
    return root / "cifar"


def _mnist(root: Path) -> Path:
    write_mnist(root / "mnist" / "MNIST" / "raw", gz=True, n_train=10, n_test=2)
    return root / "mnist"


def _pathfinder(resolution: int) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        # 10 images: the 80/10/10 split gives train 8, val 1, test 1
        write_pathfinder(root / "lra_release" / "lra_release", resolution=resolution, n=10)
        return root

    return write


def _speech(root: Path) -> Path:
    # clips spk0 (12,345 samples) and spk1 (16,000) of "yes" and "no": train holds both spk0
    write_speech(
        root / "speech_commands",
        words=("yes", "no"),
        per_word=2,
        validation=("yes/spk1_nohash_0.wav",),
        testing=("no/spk1_nohash_0.wav",),
    )
    return root / "speech_commands"


@dataclass(frozen=True)
class Case:
    dataset: str  # the name for `s5jax data prepare` (the config's data.dataset)
    write: Callable[[Path], Path] | None  # None: generated by `data prepare`
    sizes: dict[str, int]  # split sizes the reader makes of the fixture
    shape: tuple[int, ...]  # x per example: the paper's input shape (retrieval: 2 documents)
    batch: tuple[int, int] | None = None  # (data.batch_size, data.eval_batch_size); None: paper's
    steps: int = 1  # optimiser steps in the one epoch
    in_dim: int | None = None  # token tasks: the one-hot input width of S5 (its IN_DIM)


# CIFAR and MNIST: 10 training images, split 90/10 (9 and 1), and 2 test images. Pathfinder:
# 10 images split 80/10/10. Batch 5 is the smallest that makes 8 or 9 examples one step.
_SPLIT_90_10 = {"train": 9, "val": 1, "test": 2}
_PATHFINDER_SIZES = {"train": 8, "val": 1, "test": 1}

PAPER = {
    "listops": Case("listops", _listops, {"train": 2, "val": 1, "test": 1}, (2048,), (2, 2),
                    in_dim=20),
    "text": Case("text", _imdb, {"train": 2, "val": 2, "test": 2}, (4096,), (2, 2), in_dim=135),
    "retrieval": Case("retrieval", _aan, {"train": 2, "val": 1, "test": 1}, (2, 4000), (2, 2),
                      in_dim=98),
    "image": Case("image", _cifar, _SPLIT_90_10, (1024, 1), (5, 2)),
    "pathfinder": Case("pathfinder", _pathfinder(32), _PATHFINDER_SIZES, (1024, 1), (5, 1)),
    "pathx": Case("pathx", _pathfinder(128), _PATHFINDER_SIZES, (16384, 1), (5, 1)),
    "speech": Case("speech35", _speech,
                   {"train": 2, "val": 1, "test": 1, "val_8khz": 1, "test_8khz": 1},
                   (16000, 1), (2, 1)),
    "pendulum": Case("pendulum", None, {"train": 2000, "val": 1000, "test": 1000}, (50, 576),
                     steps=2000 // 32),
    "smnist": Case("smnist", _mnist, _SPLIT_90_10, (784, 1), (5, 2)),
    "psmnist": Case("psmnist", _mnist, _SPLIT_90_10, (784, 1), (5, 2)),
    "scifar": Case("scifar", _cifar, _SPLIT_90_10, (1024, 3), (5, 2)),
}  # fmt: skip


def _trained_and_initial_params(run_dir: Path, dataset):
    """The parameters in the run's latest checkpoint, and those the run started from (the
    model is built from the seed, so building the run again gives its initial state)."""
    config = load_experiment(run_dir / "config.json")
    run = _Run(config, run_dir, dataset, io.StringIO())
    run.build()
    ckpt = Checkpoints(run_dir)
    try:
        tree, meta = ckpt.restore("latest", run.train_state())
    finally:
        ckpt.close()
    return tree["params"], run.params, meta


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A fresh, empty $S5JAX_DATA; removed afterwards (the pendulum data takes 180 MB)."""
    root = tmp_path / "data"
    monkeypatch.setenv("S5JAX_DATA", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("experiment", list(PAPER))
def test_paper_experiment_trains_on_data_read_from_its_real_format(
    experiment, data_root, tmp_path, capsys
):
    case = PAPER[experiment]
    config = load_experiment(experiment)
    assert config.data.dataset == case.dataset

    # s5jax data prepare NAME --source PATH
    prepare = ["data", "prepare", case.dataset]
    if case.write is not None:
        prepare += ["--source", str(case.write(data_root))]
    assert main(prepare) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{case.dataset}: ")  # the dataset's description
    if case.write is not None:
        cache = data_root / "prepared" / case.dataset / "meta.json"
        dataset = load_prepared(cache.parent)
    else:  # the pendulum file; each load sub-samples it
        cache = data_root / "pendulum" / "pend_regression.npz"
        dataset = load_dataset(config.data)
    stamp = cache.stat().st_mtime_ns
    assert {k: len(v) for k, v in dataset.splits.items()} == case.sizes
    assert config.data.seq_len == case.shape[1 if experiment == "retrieval" else 0]
    for name, split in dataset.splits.items():
        shape = (case.shape[0] // 2, *case.shape[1:]) if name.endswith("_8khz") else case.shape
        assert split.x.shape[1:] == shape, name

    # s5jax train EXPERIMENT: one epoch of the paper's model
    run = tmp_path / "run"
    args = ["train", experiment, "--workdir", str(run), "--no-progress"]
    overrides = ["train.epochs=1", "train.log_every=1"]
    if case.batch is not None:
        overrides += [f"data.batch_size={case.batch[0]}", f"data.eval_batch_size={case.batch[1]}"]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0, capsys.readouterr().err
    assert f"{case.steps} steps per epoch" in capsys.readouterr().err
    assert cache.stat().st_mtime_ns == stamp  # train read the prepared data, not the source

    for name in ("config.json", "run_info.json", "metrics.jsonl", "results.json", "curves.png"):
        assert (run / name).is_file(), name
    summary = json.loads((run / "results.json").read_text())
    assert summary["experiment"] == experiment
    assert summary["epochs_run"] == 1 and summary["best_epoch"] == 1
    assert math.isfinite(summary["test_at_best_val"])
    assert summary["n_params"] == json.loads((run / "run_info.json").read_text())["n_params"]

    steps = read_metrics(run, kind="step")
    assert [r["step"] for r in steps] == list(range(1, case.steps + 1))
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps)
    (epoch,) = read_metrics(run, kind="epoch")
    assert epoch["step"] == case.steps and epoch["epoch"] == 1
    assert all(math.isfinite(epoch[k]) for k in ("train_loss", "val_loss", "test_loss"))
    if config.data.zero_shot_8khz:  # speech: the 8 kHz sets, evaluated at step_rescale 2
        assert math.isfinite(epoch["val_8khz_accuracy"] + epoch["test_8khz_accuracy"])

    trained, initial, meta = _trained_and_initial_params(run, dataset)
    assert meta["step"] == case.steps
    if case.in_dim is not None:
        assert initial.encoder.vocab == case.in_dim
    after = jax.tree_util.tree_leaves(trained)
    before = jax.tree_util.tree_leaves(initial)
    assert len(after) == len(before)
    assert all(np.isfinite(np.asarray(a)).all() for a in after)
    changed = [not np.array_equal(a, b) for a, b in zip(after, before, strict=True)]
    assert sum(changed) > len(changed) // 2, f"{sum(changed)} of {len(changed)} arrays changed"
    shutil.rmtree(run)  # checkpoints of the larger models take 100 MB; pytest keeps tmp_path
