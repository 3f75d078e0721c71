"""Settings chosen from the data (`s5jax train --data FILE` with nothing set) and
`data.normalize`: the rules on synthetic arrays, the user's `--set` winning, the reasons
printed and recorded, and one normalisation across training, eval, predict and export."""

import json
import math

import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import ConfigError, apply_overrides, load_experiment
from s5jax.data import PreparedDataset, Split
from s5jax.data._normalize import normalize_dataset
from s5jax.train import evaluate_run, export_run, predict_run
from s5jax.train._defaults import (
    SPREAD_EXAMPLE,
    DataFacts,
    choose_defaults,
    inspect_data,
    uncarved,
)
from s5jax.train._runs import user_data_defaults

from ._fixtures import read_npz

TINY = ["model.n_layers=1", "model.d_model=8", "model.ssm_size=8", "model.blocks=2",
        "train.epochs=1", "optim.warmup_epochs=0"]  # fmt: skip


def save(path, rng, *, n=24, L=16, D=2, spread=False, lengths=False, per_step=False):
    """An own-data .npz; `spread`: each example's scale drawn over five orders of magnitude."""
    arrays = {}
    for split, m in (("train", n), ("val", 8), ("test", 12)):
        x = rng.standard_normal((m, L, D)) + 0.5
        if spread:
            x *= 10.0 ** rng.uniform(-3, 2, (m, 1, 1))
        if lengths:
            ln = rng.integers(L // 2, L + 1, m)
            x[np.arange(L)[None, :] >= ln[:, None]] = 0.0
            arrays[f"lengths_{split}"] = ln
        arrays[f"x_{split}"] = x.astype(np.float32)
        arrays[f"y_{split}"] = (
            rng.standard_normal((m, L)).astype(np.float32) if per_step else rng.integers(0, 3, m)
        )
    np.savez(path, **arrays)
    return path


def chosen_of(path, overrides=()):
    config, dataset, _, chosen = user_data_defaults(path, overrides)
    return config, dataset, {c.key: c for c in chosen}


def test_scale_spread_chooses_example_normalisation(tmp_path):
    rng = np.random.default_rng(0)
    config, dataset, chosen = chosen_of(save(tmp_path / "a.npz", rng, spread=True))
    assert chosen["data.normalize"].value == "example"
    assert "differ by" in chosen["data.normalize"].reason
    assert config.data.normalize == "example"
    assert dataset.meta["normalization"] == {"mode": "example"}
    # whole-sequence classification: the paper's LRA recipe
    assert config.model.bidirectional and config.model.norm == "batch"
    assert not config.model.causal


def test_equal_scales_choose_channel_normalisation(tmp_path):
    rng = np.random.default_rng(1)
    _, dataset, chosen = chosen_of(save(tmp_path / "a.npz", rng))
    assert chosen["data.normalize"].value == "channel"
    assert dataset.meta["normalization"]["mode"] == "channel"


def test_per_step_targets_choose_causal_layernorm(tmp_path):
    rng = np.random.default_rng(2)
    config, _, chosen = chosen_of(save(tmp_path / "a.npz", rng, spread=True, per_step=True))
    assert config.model.causal and not config.model.bidirectional
    assert config.model.norm == "layer" and config.model.pooling == "none"
    # example statistics need the whole sequence: not for a causal model, whatever the spread
    assert chosen["data.normalize"].value == "channel"
    assert "causal" in chosen["data.normalize"].reason


def test_user_causal_forces_unidirectional_and_refuses_example(tmp_path):
    rng = np.random.default_rng(3)
    path = save(tmp_path / "a.npz", rng, spread=True)
    config, _, chosen = chosen_of(path, ["model.causal=true"])
    assert not config.model.bidirectional and config.model.norm == "layer"
    assert config.data.normalize == "channel" and "model.causal" not in chosen
    with pytest.raises(ConfigError, match=r"data.normalize = 'example' with model.causal"):
        user_data_defaults(path, ["model.causal=true", "data.normalize=example"])
    with pytest.raises(ConfigError, match=r"model.causal = true and model.bidirectional"):
        user_data_defaults(path, ["model.causal=true", "model.bidirectional=true"])


def test_user_settings_win_and_are_not_chosen(tmp_path):
    rng = np.random.default_rng(4)
    path = save(tmp_path / "a.npz", rng, spread=True)
    sets = ["data.normalize=none", "model.d_model=16", "train.epochs=7", "data.batch_size=4",
            "model.bidirectional=false", "model.dt_min=0.002"]  # fmt: skip
    config, dataset, chosen = chosen_of(path, sets)
    for key in ("data.normalize", "model.d_model", "train.epochs", "data.batch_size",
                "model.bidirectional", "model.dt_min", "model.dt_max"):  # fmt: skip
        assert key not in chosen
    assert config.data.normalize == "none" and "normalization" not in dataset.meta
    assert (config.model.d_model, config.train.epochs, config.data.batch_size) == (16, 7, 4)
    assert (config.model.dt_min, config.model.dt_max) == (0.002, 0.1)  # dt_max: schema default
    assert not config.model.bidirectional
    assert config.model.ssm_size == 16  # P follows the user's H
    assert chosen["optim.warmup_epochs"].value == 1  # from the user's 7 epochs
    raw = read_npz(path)["x_train"]
    np.testing.assert_array_equal(dataset.splits["train"].x, raw)


def test_rule_values_for_a_long_padded_dataset():
    # PLAID's shape: 428 examples, lengths 100-1344, amplitudes over five decades
    facts = DataFacts(task="classification", per_step=False, tokens=False, n_train=428,
                      seq_len=1344, max_length=1344, min_length=100, padded_fraction=0.76,
                      channels=1, spread=1.5e5, n_val=55)  # fmt: skip
    c = {x.key: x for x in choose_defaults(facts, {})}
    values = {k: v.value for k, v in c.items()}
    assert values == {
        "data.normalize": "example", "model.bidirectional": True, "model.norm": "batch",
        "model.dt_min": 0.000744, "model.dt_max": 0.1, "model.d_model": 64,
        "model.ssm_size": 64, "model.blocks": 4, "data.batch_size": 32, "train.epochs": 18,
        "optim.warmup_epochs": 2, "train.best_ties": "lower_loss",
    }  # fmt: skip
    # 10^7 sequence steps / (32 x 1344) = 232 steps, 13 per epoch (the partial batch dropped)
    assert "capped at 1e+07 sequence steps" in c["train.epochs"].reason
    assert "428 examples // batch 32 = 13 steps per epoch" in c["train.epochs"].reason
    # a tiny short one: 30 examples of 24 steps -> small model, small batches, 1,000 steps
    # (3 per epoch: 334 epochs)
    small = DataFacts("classification", False, False, 30, 24, 24, 24, 0.0, 1, 1.0)
    values = {x.key: x.value for x in choose_defaults(small, {})}
    assert (values["model.d_model"], values["data.batch_size"], values["train.epochs"]) == (
        32, 8, 334)  # fmt: skip
    assert values["model.dt_min"] == 0.01 and values["data.normalize"] == "channel"
    # regression keeps the paper's rule: a continuous val loss does not tie
    regression = DataFacts("regression", False, False, 30, 24, 24, 24, 0.0, 1, 1.0)
    assert "train.best_ties" not in {x.key for x in choose_defaults(regression, {})}
    assert "train.best_ties" not in {
        x.key for x in choose_defaults(small, {"train.best_ties": "earliest"})
    }


def test_small_val_splits_report_the_last_epoch():
    def keys(n_val, per_step=False, task="classification", user=None):
        facts = DataFacts(task, per_step, False, 90, 1460, 1460, 1460, 0.0, 1, 1.0, n_val)
        return {x.key: x for x in choose_defaults(facts, user or {})}

    small = keys(10)  # ACSF1's carve: 10 val examples, accuracy in steps of 0.1
    assert small["train.select"].value == "last" and "train.best_ties" not in small
    assert "10 val examples < 50" in small["train.select"].reason
    assert "16%" in small["train.select"].reason  # 0.5 / sqrt(10)
    for n_val in (49, 1):
        assert keys(n_val)["train.select"].value == "last"
    assert keys(8, task="regression")["train.select"].value == "last"
    # enough val examples, or per-step targets (L targets each): the paper's rule
    for chosen in (keys(50), keys(55), keys(3, per_step=True, task="regression")):
        assert "train.select" not in chosen
    # no val split: nothing to select with
    assert keys(None)["train.select"].value == "last"
    assert "no val split" in keys(None)["train.select"].reason
    assert keys(50)["train.best_ties"].value == "lower_loss"
    # the user's choice stands, and then ties are still broken by the val loss
    user = keys(10, user={"train.select": "best_val"})
    assert "train.select" not in user and user["train.best_ties"].value == "lower_loss"


def test_tiny_training_sets_train_an_ensemble():
    def chosen(n_train, per_step=False, task="classification", user=None):
        facts = DataFacts(task, per_step, False, n_train, 251, 251, 251, 0.0, 1, 1.0, 3)
        return {x.key: x for x in choose_defaults(facts, user or {})}

    arrowhead = chosen(33)  # ArrowHead's carve: 33 training examples
    assert arrowhead["model.members"].value == 5
    assert "33 training examples < 100" in arrowhead["model.members"].reason
    assert chosen(99, task="regression")["model.members"].value == 5
    # enough data, a causal model (per-step targets or asked for), or the user's own choice
    for c in (
        chosen(100),
        chosen(30, per_step=True, task="regression"),
        chosen(30, user={"model.causal": True}),
        chosen(30, user={"model.bidirectional": False}),
        chosen(30, user={"model.members": 1}),
    ):
        assert "model.members" not in c


def _facts(**kw):
    base = dict(task="classification", per_step=False, tokens=False, n_train=428, seq_len=1344,
                max_length=1344, min_length=100, padded_fraction=0.5, channels=1, spread=1.0,
                n_val=55)  # fmt: skip
    return DataFacts(**{**base, **kw})


def _values(facts, user=None):
    return {c.key: c.value for c in choose_defaults(facts, user or {})}


def test_spread_is_measured_on_valid_steps_against_numpy():
    """`inspect_data`'s spread equals numpy's q90/q10 of each example's own std over its
    valid steps, the largest over channels: a wild channel beside a calm one decides."""
    rng = np.random.default_rng(8)
    n, L = 40, 12
    lengths = rng.integers(3, L + 1, n).astype(np.int32)
    x = rng.standard_normal((n, L, 2))
    x[:, :, 1] *= 10.0 ** rng.uniform(-3, 2, (n, 1))  # channel 1: five decades of scale
    x[np.arange(L)[None, :] >= lengths[:, None]] = 0.0  # padding is zeros, as stored
    x = x.astype(np.float32)
    facts = inspect_data(_dataset(x, x, lengths, lengths))
    std = np.stack([x[i, : lengths[i]].astype(np.float64).std(axis=0) for i in range(n)])
    q10, q90 = np.quantile(std, [0.1, 0.9], axis=0)
    assert facts.spread == pytest.approx(float(np.max(q90 / q10)), rel=1e-9)
    assert q90[0] / q10[0] < 10 < SPREAD_EXAMPLE < q90[1] / q10[1]  # calm, wild
    assert (facts.max_length, facts.min_length) == (lengths.max(), lengths.min())
    assert _values(facts)["data.normalize"] == "example"


def test_per_sequence_regression_is_not_per_step():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((10, 6, 1)).astype(np.float32)
    for y in (rng.standard_normal(10), rng.standard_normal((10, 3)),
              rng.standard_normal((10, 6, 1))):  # fmt: skip
        data = PreparedDataset("r", "regression", {"train": Split(x, y.astype(np.float32))})
        facts = inspect_data(data)
        assert facts.per_step == (y.ndim == 3)
        values = _values(facts)
        assert ("model.causal" in values) == (y.ndim == 3)
        assert values["model.bidirectional"] == (y.ndim != 3)


def test_timescales_batches_and_warm_up_at_their_boundaries():
    # dt_min follows the longest valid length, not the padded one
    assert _values(_facts(seq_len=1344, max_length=500))["model.dt_min"] == 0.002
    sizes = (1, 7, 8, 63, 64, 255, 256)
    batches = {n: _values(_facts(n_train=n))["data.batch_size"] for n in sizes}
    # below 8 examples the batch is all of them (a batch of 8 would be refused by the trainer)
    assert batches == {1: 1, 7: 7, 8: 8, 63: 8, 64: 16, 255: 16, 256: 32}
    # a one-epoch budget (the user's, or the cap's) has no warm-up; two epochs have one
    assert _values(_facts(), {"train.epochs": 1})["optim.warmup_epochs"] == 0
    assert _values(_facts(), {"train.epochs": 2})["optim.warmup_epochs"] == 1
    capped = _facts(n_train=64, seq_len=100_000, max_length=100_000)
    values = _values(capped, {"data.batch_size": 64})  # 1 step per epoch, 200 capped steps
    assert (values["train.epochs"], values["optim.warmup_epochs"]) == (200, 20)


def test_long_series_halve_the_batch_to_the_memory_budget():
    """Rule 5's memory model: batch x L x H x layers x members x STEP_BYTES within
    MEMORY_BUDGET, the batch halved until it fits; the members, width and layers the user
    sets count; a batch the user sets is kept; the reason says when batch 1 is still over."""
    from s5jax.train._defaults import MEMORY_BUDGET, N_LAYERS, STEP_BYTES

    def batch(user=None, **kw):
        facts = _facts(**{"n_val": None, **kw})
        chosen = {c.key: c for c in choose_defaults(facts, user or {})}
        return chosen["data.batch_size"].value, chosen["data.batch_size"].reason

    def need(b, L, H, members):
        return b * L * H * N_LAYERS * members * STEP_BYTES

    # 64 series of 20,000 steps (H 32, an ensemble of 5): 16 halved to 2, as measured
    assert batch(n_train=64, seq_len=20_000, max_length=20_000)[0] == 2
    assert need(2, 20_000, 32, 5) <= MEMORY_BUDGET < need(4, 20_000, 32, 5)
    # one member (asked for) needs 5x less: the size rule's 16 fits
    assert batch({"model.members": 1}, n_train=64, seq_len=20_000, max_length=20_000)[0] == 16
    assert need(16, 20_000, 32, 1) <= MEMORY_BUDGET
    # the width the user asks for counts too: H 128 at one member needs 4x more: 4
    assert batch({"model.members": 1, "model.d_model": 128}, n_train=64, seq_len=20_000,
                 max_length=20_000)[0] == 4  # fmt: skip
    assert need(4, 20_000, 128, 1) <= MEMORY_BUDGET < need(8, 20_000, 128, 1)
    # short series keep the size rule's batch; a batch the user sets is never halved
    assert batch(n_train=428)[0] == 32
    kept = _values(_facts(n_train=428, seq_len=10**6, max_length=10**6), {"data.batch_size": 64})
    assert "data.batch_size" not in kept and kept["train.epochs"] == 34  # 200 steps, 6 an epoch
    b, why = batch(n_train=64, seq_len=20_000, max_length=20_000)
    assert why.endswith("halved from 16 to 2 so that the training step's activations fit "
                        "about 4 GiB (~96 bytes per step, channel, layer and member: 2 x L "
                        "20000 x H 32 x 4 layers x 5 members ~ 2.3 GiB)")  # fmt: skip
    b, why = batch(n_train=64, seq_len=2_000_000, max_length=2_000_000)
    assert b == 1 and "over 4 GiB even at batch 1: lower model.d_model or model.members" in why


def test_counts_are_worded_in_the_singular_for_one():
    one = _facts(n_train=1, channels=1)
    assert one.describe().startswith("1 training example (+55 val)")
    assert ", 1 channel, " in one.describe()
    assert (
        "1 training example, all in one batch"
        in {c.key: c.reason for c in choose_defaults(one, {})}["data.batch_size"]
    )
    assert ", 3 channels, " in _facts(n_train=2, channels=3).describe()
    assert ", token ids (vocabulary 1,000), " in _facts(tokens=True, vocab=1000).describe()


def test_epochs_count_steps_of_the_users_batch():
    # 428 examples: the chosen batch 32 takes 13 steps per epoch (232 capped steps: 18
    # epochs); the user's batch 4 takes 107 per epoch, and its cap is 10^7 / (4 x 1344)
    assert _values(_facts())["train.epochs"] == 18
    values = _values(_facts(), {"data.batch_size": 4})
    assert values["train.epochs"] == math.ceil(min(4000, 10**7 // (4 * 1344)) / 107) == 18
    short = _facts(seq_len=24, max_length=24, min_length=24, padded_fraction=0.0)
    assert _values(short)["train.epochs"] == math.ceil(1300 / 13)  # 100 epochs' worth
    assert _values(short, {"data.batch_size": 100})["train.epochs"] == 250  # 1000 steps / 4


def test_example_normalisation_keeps_per_step_targets_bidirectional():
    """Per-step targets with the user's `data.normalize = example`: example statistics need
    the whole sequence, so the model reads it whole (not causal, bidirectional)."""
    facts = _facts(task="regression", per_step=True, n_train=300)
    values = _values(facts, {"data.normalize": "example"})
    assert values["model.causal"] is False and values["model.bidirectional"] is True
    assert values["model.norm"] == "batch"
    assert _values(facts)["model.causal"] is True


def test_a_carve_of_fifty_val_examples_is_kept():
    carve = dict(val_carved=True, n_train=200)
    assert uncarved(_facts(n_val=50, **carve), {}) is None
    dropped = uncarved(_facts(n_val=49, **carve), {})
    assert dropped.key == "data.val_fraction" and dropped.value == 0.0
    assert "all 249 examples of the training file train" in dropped.reason
    assert uncarved(_facts(n_val=49, val_carved=False), {}) is None
    for user in ({"train.early_stop_patience": 5}, {"optim.reduce_on_plateau": True},
                 {"train.select": "best_val"}, {"data.val_fraction": 0.1}):  # fmt: skip
        assert uncarved(_facts(n_val=49, **carve), user) is None


def test_an_npz_without_val_is_carved_or_not_as_a_ts_file(tmp_path):
    """Own .npz without val keys: the carve of a large file is kept (and recorded in the
    config: val_fraction 0.1), that of a small one dropped by the same rule as for .ts files;
    `--set data.val_fraction=...` chooses."""
    rng = np.random.default_rng(11)
    for n, kept in ((600, True), (100, False)):
        path = tmp_path / f"noval{n}.npz"
        np.savez(path, x_train=rng.standard_normal((n, 12, 2)).astype(np.float32),
                 y_train=rng.integers(0, 3, n), x_test=rng.standard_normal((9, 12, 2)),
                 y_test=rng.integers(0, 3, 9))  # fmt: skip
        config, dataset, chosen = chosen_of(path)
        assert ("val" in dataset.splits) == kept
        assert ("data.val_fraction" in chosen) == (not kept)
        assert config.data.val_fraction == (0.1 if kept else 0.0)
        if kept:  # round(0.1 * each class's count), stratified
            counts = np.bincount(read_npz(path)["y_train"])
            assert len(dataset.splits["val"].x) == sum(round(0.1 * c) for c in counts)
            assert len(dataset.splits["val"].x) + len(dataset.splits["train"].x) == n
        else:
            assert len(dataset.splits["train"].x) == n
            assert config.train.select == "last"
    config, dataset, chosen = chosen_of(tmp_path / "noval100.npz", ["data.val_fraction=0.5"])
    counts = np.bincount(read_npz(tmp_path / "noval100.npz")["y_train"])
    assert len(dataset.splits["val"].x) == sum(round(0.5 * c) for c in counts)
    assert "data.val_fraction" not in chosen and config.data.val_fraction == 0.5


def _dataset(train_x, other_x, lengths=None, other_lengths=None):
    y = np.zeros(len(train_x), np.int32)
    return PreparedDataset(
        "d", "classification",
        {"train": Split(train_x, y, lengths),
         "test": Split(other_x, np.zeros(len(other_x), np.int32), other_lengths)},
        n_classes=2,
    )  # fmt: skip


def test_channel_statistics_come_from_the_train_split_only():
    rng = np.random.default_rng(5)
    train = (rng.standard_normal((6, 5, 2)) * [1.0, 10.0] + [3.0, -2.0]).astype(np.float32)
    lengths = np.array([5, 3, 4, 5, 2, 5], np.int32)
    train[np.arange(5)[None, :] >= lengths[:, None]] = 0.0
    test = (100 + rng.standard_normal((4, 5, 2))).astype(np.float32)  # far from train
    out = normalize_dataset(_dataset(train, test, lengths), "channel")
    valid = np.concatenate([train[i, : lengths[i]] for i in range(6)])  # padding excluded
    mean, std = valid.mean(0), valid.std(0)
    assert np.allclose(out.meta["normalization"]["mean"], mean, atol=1e-5)
    assert np.allclose(out.meta["normalization"]["std"], std, atol=1e-5)
    np.testing.assert_allclose(out.splits["test"].x, (test - mean) / std, rtol=1e-5, atol=1e-5)
    got = out.splits["train"].x
    assert np.all(got[np.arange(5)[None, :] >= lengths[:, None]] == 0.0)  # padding stays zero


def test_example_normalisation_standardises_each_valid_part():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 8, 1)) * [[[1e-3]], [[1.0]], [[50.0]], [[1e4]]]).astype(np.float32)
    lengths = np.array([8, 3, 5, 8], np.int32)
    x[np.arange(8)[None, :] >= lengths[:, None]] = 0.0
    out = normalize_dataset(_dataset(x, x, lengths, lengths), "example").splits["test"].x
    for i, n in enumerate(lengths):
        assert abs(out[i, :n].mean()) < 1e-5 and abs(out[i, :n].std() - 1) < 1e-4
        assert np.all(out[i, n:] == 0.0)


@pytest.mark.parametrize("mode", ["channel", "example"])
def test_a_constant_channel_normalises_to_zeros(mode):
    """A channel whose std is 0 (below EPS) is centred and divided by 1, not by 0."""
    rng = np.random.default_rng(10)
    x = np.stack([rng.standard_normal((4, 6)), np.full((4, 6), 3.5)], axis=-1).astype(np.float32)
    out = normalize_dataset(_dataset(x, x), mode).splits["test"].x
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[..., 1], 0.0)
    assert abs(out[..., 0].std() - 1) < 0.5  # the varying channel is standardised


def test_registered_experiments_are_not_normalised():
    config = load_experiment("synthetic")
    assert config.data.normalize == "none"
    assert apply_overrides(config, ["data.normalize=channel"]).data.normalize == "channel"


def test_train_eval_predict_export_use_one_normalisation(tmp_path, capsys):
    """Example normalisation chosen and applied in training; `s5jax eval` (data reloaded
    from config.json), `predict` on the raw file (the new-data path) and the exported
    forward on raw arrays give the same test loss."""
    rng = np.random.default_rng(7)
    path = save(tmp_path / "mine.npz", rng, n=16, L=12, spread=True, lengths=True)
    run = tmp_path / "run"
    args = ["train", "--data", str(path), "--workdir", str(run), "--no-progress"]
    assert main([*args, *[a for s in TINY for a in ("--set", s)]]) == 0
    err = capsys.readouterr().err
    # the first line, after the native kernel's one-time notice on a host with an empty cache
    first = next(ln for ln in err.splitlines() if not ln.startswith("s5jax: compiling"))
    assert first.startswith("defaults chosen from the data (16 training examples")
    assert "data.normalize = 'example' (the examples' scales differ by" in err
    info = json.loads((run / "run_info.json").read_text())["defaults"]
    assert info["chosen"]["data.normalize"]["value"] == "example"
    assert "model.d_model" not in info["chosen"]  # set by the user
    assert json.loads((run / "config.json").read_text())["data"]["normalize"] == "example"

    results = json.loads((run / "results.json").read_text())
    ev = evaluate_run(run, split="test")
    assert ev["accuracy"] == pytest.approx(results["test_at_best_val"], abs=1e-6)
    pred = predict_run(run, tmp_path / "p.npz", data=str(path), progress=False)
    assert pred["loss"] == pytest.approx(ev["loss"], rel=1e-5)

    from jax import export

    folder = export_run(run, tmp_path / "exp")
    forward = export.deserialize(bytearray((folder / "forward.jax").read_bytes()))
    raw = read_npz(path)
    x, n = raw["x_test"], raw["lengths_test"].astype(np.int32)
    log_probs = np.asarray(forward.call(x, n, np.ones(x.shape[:2], np.float32)))  # unit steps
    np.testing.assert_allclose(log_probs, read_npz(tmp_path / "p.npz")["log_probs"], atol=1e-4)
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["normalization"] == {"mode": "example"} and spec["step"] is None


def test_time_step_is_the_median_of_valid_increments_against_numpy():
    """The padding's times (zeros, or anything) and repeated times do not count; without `t`
    there is no time step."""
    rng = np.random.default_rng(11)
    n, L = 30, 20
    lengths = rng.integers(2, L + 1, n)
    t = np.cumsum(rng.exponential(0.3, (n, L)), axis=1)
    pad = np.arange(L)[None, :] >= lengths[:, None]
    t = np.where(pad, t + 7.0 * np.arange(L), t)  # padding's times: increasing, never counted
    t[0, 1] = t[0, 0]  # a repeated time: a zero step, not counted
    x = rng.standard_normal((n, L, 1)).astype(np.float32)
    data = PreparedDataset("d", "classification", {"train": Split(x, np.zeros(n, int), lengths, t)},
                           n_classes=2)  # fmt: skip
    steps = np.concatenate([np.diff(t[i, : lengths[i]]) for i in range(n)])
    assert inspect_data(data).time_step == pytest.approx(float(np.median(steps[steps > 0])))
    data.splits["train"] = Split(x, np.zeros(n, int), lengths)
    assert inspect_data(data).time_step is None


def test_timescales_count_steps_in_the_times_own_unit():
    """Δ_k = Δ·(t_k − t_(k−1)): dt_min and dt_max are the step rule's divided by the median
    time step, so the same data with times in s, ms or h starts from the same per-step Δ."""
    steps = _values(_facts(max_length=200))
    assert (steps["model.dt_min"], steps["model.dt_max"]) == (0.005, 0.1)
    for time_step in (0.25, 250.0, 0.25 / 3600):
        v = _values(_facts(max_length=200, time_step=time_step))
        # the per-step values, to the 3 significant digits the choices are rounded to
        assert v["model.dt_min"] * time_step == pytest.approx(0.005, rel=5e-3)
        assert v["model.dt_max"] * time_step == pytest.approx(0.1, rel=5e-3)
    assert _values(_facts(max_length=200, time_step=1.0)) == steps  # regular times: unchanged
    for mode in ("drop", "append"):  # the SSMs do not read the times' steps: unchanged
        v = _values(_facts(max_length=200, time_step=0.25), {"model.timestep_mode": mode})
        assert (v["model.dt_min"], v["model.dt_max"]) == (0.005, 0.1)


def test_an_npz_with_times_describes_them_and_trains_from_the_scaled_timescales(tmp_path):
    rng = np.random.default_rng(12)
    path = save(tmp_path / "t.npz", rng, n=24, L=16)
    arrays = dict(read_npz(path))
    for split in ("train", "val", "test"):
        m = len(arrays[f"x_{split}"])
        arrays[f"t_{split}"] = np.cumsum(np.full((m, 16), 250.0), axis=1)  # milliseconds
    np.savez(path, **arrays)
    config, _, chosen = chosen_of(path)
    facts, _ = user_data_defaults(path)[2:]
    assert facts.time_step == 250.0 and "times (median step 250)" in facts.describe()
    assert (config.model.dt_min, config.model.dt_max) == (0.01 / 250, 0.1 / 250)
    assert "/ the median time step 250" in chosen["model.dt_min"].reason
