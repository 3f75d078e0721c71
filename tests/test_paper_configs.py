"""Every paper experiment builds from its config and takes a training step on a tiny fixture
with the real input shape of its dataset (the datasets themselves are the data readers' job)."""

import io

import numpy as np
import pytest

from s5jax.config import apply_overrides, load_experiment
from s5jax.data import PreparedDataset, Split
from s5jax.train import read_metrics, train_and_evaluate

# dataset name -> (x shape per example, kind, extra) of the real prepared data
INPUTS = {
    "listops": ((2048,), "tokens", {"vocab": 18, "classes": 10, "lengths": True, "width": 20}),
    "text": ((4096,), "tokens", {"vocab": 100, "classes": 2, "lengths": True, "width": 135}),
    "retrieval": ((2, 4000), "tokens", {"vocab": 98, "classes": 2, "lengths": True}),
    "image": ((1024, 1), "features", {"classes": 10}),
    "pathfinder": ((1024, 1), "features", {"classes": 2}),
    "pathx": ((16384, 1), "features", {"classes": 2}),
    "speech35": ((16000, 1), "features", {"classes": 35}),
    "pendulum": ((50, 576), "features", {"targets": (50, 2), "times": True}),
    "smnist": ((784, 1), "features", {"classes": 10}),
    "psmnist": ((784, 1), "features", {"classes": 10}),
    "scifar": ((1024, 3), "features", {"classes": 10}),
}
PAPER = [
    "listops",
    "text",
    "retrieval",
    "image",
    "pathfinder",
    "pathx",
    "speech",
    "pendulum",
    "smnist",
    "psmnist",
    "scifar",
]


def _fixture(dataset: str, n: int = 2) -> PreparedDataset:
    shape, kind, extra = INPUTS[dataset]
    rng = np.random.default_rng(0)

    def split():
        if kind == "tokens":
            x = rng.integers(3, extra["vocab"], (n, *shape)).astype(np.int32)
        else:
            x = rng.standard_normal((n, *shape)).astype(np.float32)
        if "classes" in extra:
            y = rng.integers(0, extra["classes"], n).astype(np.int32)
        else:
            y = rng.standard_normal((n, *extra["targets"])).astype(np.float32)
        lengths = t = None
        if extra.get("lengths"):
            lengths = np.full((n, *shape[:-1]), shape[-1] // 2, np.int32)
        if extra.get("times"):
            t = np.sort(rng.choice(100, (n, shape[0]), replace=True), axis=1).astype(np.float32)
            t = t + np.arange(shape[0], dtype=np.float32)  # strictly increasing
        return Split(x=x, y=y, lengths=lengths, t=t)

    return PreparedDataset(
        name=dataset,
        task="classification" if "classes" in extra else "regression",
        splits={"train": split(), "val": split(), "test": split()},
        n_classes=extra.get("classes", 0),
        vocab_size=extra.get("vocab"),
        meta={"one_hot_width": extra["width"]} if "width" in extra else {},
    )


@pytest.mark.parametrize("name", PAPER)
def test_paper_experiment_takes_a_step(tmp_path, name):
    cfg = apply_overrides(
        load_experiment(name),
        ["train.epochs=1", "train.log_every=1", "data.batch_size=2", "data.eval_batch_size=2"],
    )
    summary = train_and_evaluate(
        cfg, tmp_path, dataset=_fixture(cfg.data.dataset), progress=False, stream=io.StringIO()
    )
    losses = [r["loss"] for r in read_metrics(tmp_path, kind="step")]
    assert len(losses) == 1 and np.isfinite(losses[0])
    assert summary["epochs_run"] == 1
