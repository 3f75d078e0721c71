"""Optimiser groups, schedules, weight decay, clipping, reduce-on-plateau, early stopping (§5)."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax import train
from s5jax.config import OptimConfig
from s5jax.nn import S5SSM

H = 4


class Tiny(eqx.Module):
    """Encoder, S5 layer, norm, decoder: every kind of leaf the groups distinguish."""

    enc: eqx.nn.Linear
    ssm: S5SSM
    norm: eqx.nn.LayerNorm
    dec: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.enc = eqx.nn.Linear(2, H, key=k1)
        self.ssm = S5SSM(H, 4, key=k2)
        self.norm = eqx.nn.LayerNorm(H)
        self.dec = eqx.nn.Linear(H, 3, key=k3)


@pytest.fixture
def model():
    return Tiny(jax.random.PRNGKey(0))


def _params(model):
    return eqx.filter(model, eqx.is_inexact_array)


def _by_path(tree):
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


# --- groups ------------------------------------------------------------------------------------

# The spec table (reference semantics §5), column by column: Λ (re, im), log Δ, B (re, im),
# C (re, im), D. Everything else (encoder, decoder, norm) is "regular" in every partition.
SSM_FIELDS = ("Lambda_re", "Lambda_im", "log_step", "B_re", "B_im", "C_re", "C_im", "D")
S, SD, R = "ssm", "ssm_decay", "regular"
EXPECTED = {
    # (partition, dt_global): groups of SSM_FIELDS
    ("standard", False): (S, S, S, S, S, R, R, R),
    ("standard", True): (S, S, R, S, S, R, R, R),
    ("BandCdecay", False): (S, S, S, SD, SD, R, R, R),
    ("BandCdecay", True): (S, S, R, SD, SD, R, R, R),
    ("BfastandCdecay", False): (S, S, S, R, R, R, R, R),
    ("BfastandCdecay", True): (S, S, R, R, R, R, R, R),
    ("noBCdecay", False): (S, S, S, S, S, S, S, S),
    ("noBCdecay", True): (S, S, R, S, S, S, S, S),
}
OTHER_LEAVES = (
    ".enc.weight",
    ".enc.bias",
    ".norm.weight",
    ".norm.bias",
    ".dec.weight",
    ".dec.bias",
)


@pytest.mark.parametrize("partition, dt_global", sorted(EXPECTED))
def test_groups_per_partition(model, partition, dt_global):
    labels = train.optimizer_groups(model, partition, dt_global=dt_global)
    expected = {f".ssm.{f}": g for f, g in zip(SSM_FIELDS, EXPECTED[partition, dt_global])}
    expected.update({path: "regular" for path in OTHER_LEAVES})
    assert _by_path(labels) == expected
    assert jax.tree.structure(labels) == jax.tree.structure(_params(model))


def test_unknown_partition_raises(model):
    with pytest.raises(ValueError, match="partition"):
        train.optimizer_groups(model, "nope")


def test_describe_groups(model):
    labels = train.optimizer_groups(model, "BandCdecay")
    rows = train.describe_groups(model, labels)
    P = model.ssm.P
    assert [r[0] for r in rows] == ["ssm", "ssm_decay", "regular"]
    assert rows[0][1:3] == (3, 2 * P + P)
    assert rows[1][1:] == (2, 2 * P * H, [".ssm.B_re", ".ssm.B_im"])
    n_total = sum(x.size for x in jax.tree.leaves(_params(model)))
    assert sum(r[2] for r in rows) == n_total
    assert "ssm_decay" in train.format_groups(rows)


# --- schedules ---------------------------------------------------------------------------------

SPE, EPOCHS, WARM = 4, 5, 1  # W = 4 warmup steps, 20 in all, cosine length T = 16
BASE, LR_MIN = 0.01, 0.001


def _sched(**kw):
    args = dict(base_lr=BASE, lr_min=LR_MIN, steps_per_epoch=SPE, epochs=EPOCHS)
    args.update(warmup_epochs=WARM)
    args.update(kw)
    return train.LRSchedule(**args)


def _cos(t, T=16, base=BASE):
    return LR_MIN + (base - LR_MIN) * 0.5 * (1 + math.cos(math.pi * t / T))


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, BASE / 4),  # warmup start: base·1/W
        (1, BASE / 2),  # warmup middle
        (3, BASE),  # warmup end
        (4, BASE),  # cosine start
        (8, LR_MIN + (BASE - LR_MIN) * 0.5 * (1 + math.sqrt(0.5))),  # cos(π/4)
        (12, LR_MIN + (BASE - LR_MIN) * 0.5),  # cosine middle
        (19, _cos(15)),  # last update
        (20, LR_MIN),  # cosine end
        (25, LR_MIN),  # held
    ],
)
def test_clean_cosine_schedule(step, expected):
    assert float(_sched()(step)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, BASE),  # quirk 1: the first update at the full base rate
        (1, BASE / 4),  # then one step behind: warmup(0)
        (4, BASE),  # warmup(3)
        (5, _cos(4)),  # quirk 2: the cosine counter is 4, not 0
        (13, _cos(12)),
        (17, LR_MIN),  # lr_min reached W steps early...
        (19, LR_MIN),  # ...and held
    ],
)
def test_faithful_schedule(step, expected):
    assert float(_sched(faithful=True)(step)) == pytest.approx(expected, rel=1e-5)


def test_faithful_without_warmup_is_shifted_by_one():
    sched = _sched(faithful=True, warmup_epochs=0)
    assert float(sched(0)) == pytest.approx(BASE)
    assert float(sched(1)) == pytest.approx(BASE)
    assert float(sched(11)) == pytest.approx(_cos(10, T=20), rel=1e-5)


def test_constant_schedule():
    warm = _sched(kind="constant")
    assert [float(warm(k)) for k in (0, 1, 3, 4, 19)] == pytest.approx(
        [BASE / 4, BASE / 2, BASE, BASE, BASE]
    )
    flat = _sched(kind="constant", warmup_epochs=0)
    assert float(flat(0)) == pytest.approx(BASE)
    assert float(_sched(kind="constant", faithful=True)(0)) == pytest.approx(BASE)


def test_schedule_scale_floors_at_lr_min():
    sched = _sched()
    assert float(sched(12, 0.5)) == pytest.approx(LR_MIN + (BASE / 2 - LR_MIN) * 0.5)
    assert float(sched(12, 0.01)) == pytest.approx(LR_MIN)  # base·0.01 < lr_min
    assert float(jax.jit(sched)(jnp.asarray(12, jnp.int32), 0.5)) == pytest.approx(0.003)


def test_group_schedules_use_each_groups_base():
    cfg = OptimConfig(ssm_lr=0.01, lr_factor=2.0, warmup_epochs=1, lr_min=0.0)
    scheds = train.group_schedules(cfg, steps_per_epoch=SPE, epochs=EPOCHS)
    assert float(scheds["ssm"](1)) == pytest.approx(0.005)
    assert float(scheds["ssm_decay"](1)) == pytest.approx(0.005)
    assert float(scheds["regular"](1)) == pytest.approx(0.01)


# --- the optimiser -----------------------------------------------------------------------------


def _step(cfg, model, grads=None, scale=None):
    """One jitted update from the initial state: (params, updates), keyed by path."""
    opt, _ = train.build_optimizer(cfg, model, steps_per_epoch=SPE, epochs=EPOCHS)
    params = _params(model)
    state = opt.init(params)
    if scale is not None:
        state = train.set_lr_scale(state, scale)
    if grads is None:
        grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(opt.update)(grads, state, params)
    return _by_path(params), _by_path(updates)


def _assert_decay(params, updates, path, rate):
    """AdamW with a zero gradient: the update of `path` is −lr·wd·p, with lr·wd = `rate`."""
    np.testing.assert_allclose(updates[path], -rate * params[path], rtol=1e-5, atol=1e-12)


def _cfg(**kw):
    args = dict(
        ssm_lr=0.01,
        lr_factor=2.0,
        weight_decay=0.1,
        schedule="constant",
        warmup_epochs=0,
        lr_min=0.0,
    )
    args.update(kw)
    return OptimConfig(**args)


@pytest.mark.parametrize("partition", ["standard", "BandCdecay", "BfastandCdecay", "noBCdecay"])
def test_weight_decay_only_outside_ssm_group(model, partition):
    params, updates = _step(_cfg(partition=partition), model)
    labels = _by_path(train.optimizer_groups(model, partition))
    decay = {"ssm": 0.0, "ssm_decay": 0.01 * 0.1, "regular": 0.02 * 0.1}
    for path, group in labels.items():
        _assert_decay(params, updates, path, decay[group])
        if group == "ssm":  # no weight decay: the leaf does not move at all
            assert not np.any(np.asarray(updates[path]))
    groups = set(labels.values())
    assert ("ssm_decay" in groups) == (partition == "BandCdecay")


def test_schedule_reaches_the_optimiser(model):
    """Zero gradients: the decay of the first update is lr(0)·wd in each schedule form."""
    cfg = dict(schedule="cosine", warmup_epochs=1)
    params, clean = _step(_cfg(**cfg), model)
    _, faithful = _step(_cfg(faithful_schedule=True, **cfg), model)
    _assert_decay(params, clean, ".enc.weight", 0.02 / SPE * 0.1)
    _assert_decay(params, faithful, ".enc.weight", 0.02 * 0.1)


def test_lr_scale_reaches_the_optimiser(model):
    params, updates = _step(_cfg(), model, scale=0.25)
    _assert_decay(params, updates, ".dec.weight", 0.25 * 0.002)


def test_set_lr_scale_is_pure(model):
    opt, _ = train.build_optimizer(_cfg(), model, steps_per_epoch=SPE, epochs=EPOCHS)
    state = opt.init(_params(model))
    new = train.set_lr_scale(state, 0.5)
    assert train.get_lr_scale(state) == 1.0
    assert train.get_lr_scale(new) == 0.5
    # Same structure and dtypes: a jitted step does not retrace.
    assert jax.tree.structure(new) == jax.tree.structure(state)
    assert [x.dtype for x in jax.tree.leaves(new)] == [x.dtype for x in jax.tree.leaves(state)]


@pytest.mark.parametrize("clip", [None, 0.5])
def test_gradient_clipping(model, clip):
    """With a large Adam ε the first update is −lr·ĝ/(|ĝ| + ε): it shows the clipped ĝ."""
    eps = 1e3
    cfg = _cfg(weight_decay=0.0, grad_clip=clip, adam_eps=eps, partition="noBCdecay")
    params = _params(model)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.3, p.dtype), params)
    _, updates = _step(cfg, model, grads=grads)
    norm = math.sqrt(sum(0.09 * p.size for p in jax.tree.leaves(params)))
    assert norm > 0.5  # so that clipping is active
    g = 0.3 if clip is None else 0.3 * clip / norm
    labels = _by_path(train.optimizer_groups(model, "noBCdecay"))
    lr = {"ssm": 0.01, "regular": 0.02}
    for path, update in updates.items():
        expected = -lr[labels[path]] * g / (g + eps)
        np.testing.assert_allclose(update, expected, rtol=1e-5)


# --- reduce-on-plateau and early stopping ------------------------------------------------------


def test_plateau_update():
    state = train.PlateauState()
    scales, counts = [], []
    for acc in [0.5, 0.6, 0.6, 0.59, 0.6, 0.7, 0.1, 0.1, 0.1]:
        state = train.plateau_update(state, acc, patience=2, factor=0.5)
        scales.append(state.scale)
        counts.append(state.count)
    assert counts == [0, 0, 1, 2, 0, 0, 1, 2, 0]
    assert scales == [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25]
    assert state.best == 0.7


def test_plateau_min_mode():
    state = train.PlateauState()
    for loss in [1.0, 0.9, 0.95]:
        state = train.plateau_update(state, loss, patience=0, factor=0.1, mode="min")
    assert state.scale == pytest.approx(0.1)
    assert state.best == -0.9


def test_early_stopping():
    state, stops = train.EarlyStopState(), []
    for acc in [0.5, 0.6, 0.55, 0.6, 0.58]:
        state = train.early_stop_update(state, acc, patience=2)
        stops.append(state.stop)
    assert stops == [False, False, False, False, True]
    never = train.EarlyStopState()
    for acc in [0.5] * 10:
        never = train.early_stop_update(never, acc, patience=None)
    assert not never.stop and never.count == 9
    with pytest.raises(ValueError, match="mode"):
        train.early_stop_update(never, 0.1, patience=1, mode="up")
