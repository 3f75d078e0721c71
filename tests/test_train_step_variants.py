"""benchmarks/train_step.py's `--ceiling` and `--no-scan` variants compute what they claim: with
the scans patched out, an SSM is exactly its products and feed-through, 2 Re(C̃_f B̄u + C̃_b B̄u)
+ D ⊙ u (float64, at a small and a large P, and the per-step Δ path); with the SSM patched
out, a layer's SSM is D ⊙ u; and both patches are undone on exit. `--isolate`: `build(only=...)`,
`variant_names` and `time_isolated` end to end on a tiny pendulum."""

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.core import apply_ssm, apply_ssm_continuous
from s5jax.nn import S5SSM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import train_step as ts


def _system(P, H, L, key):
    k = jax.random.split(key, 6)
    lam = jnp.exp(jax.lax.complex(-0.1 - jax.random.uniform(k[0], (P,)),
                                  jax.random.uniform(k[1], (P,))))  # fmt: skip
    B = jax.lax.complex(jax.random.normal(k[2], (P, H)), jax.random.normal(k[3], (P, H)))
    C = jax.lax.complex(jax.random.normal(k[4], (H, 2 * P)), jax.random.normal(k[5], (H, 2 * P)))
    D = jax.random.normal(k[0], (H,))
    u = jax.random.normal(k[1], (L, H))
    return lam, B, C, D, u


def _products(B_rows, C, D, u):
    """2 Re((C_f + C_b) B̄u) + D u, with B̄u given per step as `B_rows` (L, P)."""
    P = B_rows.shape[1]
    return 2 * jnp.real(B_rows @ (C[:, :P] + C[:, P:]).T) + D[None, :] * u


@pytest.mark.parametrize("P", [4, 128])
def test_no_scan_leaves_the_products_and_restores_the_scans(x64, P):
    lam, B, C, D, u = _system(P, 3, 6, jax.random.PRNGKey(0))
    full = apply_ssm(lam, B, C, D, u, bidirectional=True, method="sequential")
    with ts._products_only():
        y = apply_ssm(lam, B, C, D, u, bidirectional=True, method="chunked")
    Bu = u.astype(B.dtype) @ B.T
    np.testing.assert_allclose(y, _products(Bu, C, D, u), rtol=1e-12, atol=1e-12)
    assert not np.allclose(y, full)  # the scans did matter for this system
    after = apply_ssm(lam, B, C, D, u, bidirectional=True, method="chunked")
    np.testing.assert_allclose(after, full, rtol=1e-10, atol=1e-10)


def test_no_scan_with_per_step_timescales(x64):
    P, H, L = 4, 3, 6
    lam, B, C, D, u = _system(P, H, L, jax.random.PRNGKey(1))
    Lambda = jnp.log(lam)  # continuous-time eigenvalues with Re < 0
    Delta = jnp.full((P,), 0.3)
    dt = jnp.linspace(0.5, 2.0, L)
    with ts._products_only():
        y = apply_ssm_continuous(Lambda, B, C, D, Delta, u, dt=dt, bidirectional=True,
                                 method="chunked")  # fmt: skip
    # ZOH: B̄_k u_k = γ_k ⊙ (B̃ u_k), γ = (Λ̄ − 1) / Λ; forward steps use Δ·dt[k], backward
    # steps Δ·dt[k+1] (Δ·1 at the end).
    Bu = u.astype(B.dtype) @ B.T

    def gamma(m):
        step = (Delta[None, :] * m[:, None]).astype(Lambda.dtype)
        return (jnp.exp(Lambda[None, :] * step) - 1) / Lambda[None, :]

    dt_b = jnp.concatenate([dt[1:], jnp.ones(1)])
    y_f = (gamma(dt) * Bu) @ C[:, :P].T
    y_b = (gamma(dt_b) * Bu) @ C[:, P:].T
    expected = 2 * jnp.real(y_f + y_b) + D[None, :] * u
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_feed_through_only_is_d_times_u_and_is_undone():
    ssm = S5SSM(3, 8, bidirectional=True, key=jax.random.PRNGKey(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (5, 3))
    with ts._feed_through_only():
        y = ssm(u)
    np.testing.assert_allclose(y, ssm.D[None, :] * u)
    assert not np.allclose(ssm(u), ssm.D[None, :] * u)


def test_precision_lists_and_variant_names():
    parser = argparse.ArgumentParser()
    assert ts.parse_precisions(parser, "fp32, bf16,fp32") == ("fp32", "bf16")
    for bad in ("fp16", "", "fp32,bf8"):
        with pytest.raises(SystemExit):
            ts.parse_precisions(parser, bad)
    assert ts.variant_name("auto", "fp32", ("auto",), ("fp32",)) == "ours"
    assert ts.variant_name("fused", "bf16", ("auto", "fused"), ("bf16",)) == "ours[fused]"
    assert ts.variant_name("auto", "bf16", ("auto",), ("fp32", "bf16")) == "ours[auto/bf16]"
    assert ts.variant_label("auto", "bf16", ("fp32", "bf16")) == "auto/bf16"


def test_baseline_memory_compiles_the_authors_step_on_their_inputs():
    """`train_step_memory.py --baseline` lowers the authors' step on what it receives in
    `train_step.py` (one-hot float inputs, their parameters and optimiser state): XLA's
    argument bytes equal the bytes of exactly those arguments, and differ from ours."""
    import baseline_model as base
    import train_step_memory as tsm

    from s5jax.config import load_experiment

    s = ts.shapes("listops", batch=2, length=16, paper=True)
    theirs = tsm.compiled_memory("listops", s, tsm.BASELINE)
    ours = tsm.compiled_memory("listops", s, "chunked")

    cfg = load_experiment("listops")
    model, _, (_, state, _) = ts.build_ours(cfg, s, "chunked", init=jax.eval_shape)
    spec, _, carry = ts.build_baseline(cfg, model, state, init=jax.eval_shape)
    batch = base.model_inputs(spec, ts.random_batch("listops", s, jax.random.PRNGKey(1)))
    assert batch["x"].shape == (2, 16, s["vocab"]) and batch["x"].dtype == jnp.float32
    assert cfg.model.dropout == 0  # so jit prunes the unused dropout key from the arguments
    leaves = jax.tree_util.tree_leaves((carry, batch))
    expected = sum(np.prod(x.shape, dtype=int) * np.dtype(x.dtype).itemsize for x in leaves)
    assert theirs["args_bytes"] == expected
    assert theirs["temp_bytes"] > 0 and ours["args_bytes"] != theirs["args_bytes"]


def test_isolate_builds_one_variant_and_names_them_as_build_does():
    """`--isolate`: `build(..., only=name)` compiles and returns that variant alone, for every
    name `variant_names` gives (what the worker processes are started with)."""
    s = ts.shapes("pendulum", 2, 8, False)
    names = ts.variant_names(("auto",), ("fp32",))
    assert names == ["ours", "baseline"], names
    for name in names:
        fns, compile_s = ts.build("pendulum", s, ("auto",), precision=("fp32",), only=name)
        assert list(fns) == list(compile_s) == [name]
        assert np.isfinite(float(fns[name]()))
    assert ts.variant_names(("auto", "native"), ("fp32", "bf16"), no_scan=True) == [
        "ours[auto/fp32]", "ours[native/fp32]", "ours[auto/bf16]", "ours[native/bf16]",
        ts.NO_SCAN, "baseline",
    ]  # fmt: skip


def test_isolated_timing_runs_each_step_in_its_own_process():
    """`time_isolated` (what `--isolate` runs): one spawned process per variant, each timed
    once per round; every timing positive, and the compile seconds come back per variant."""
    s = ts.shapes("pendulum", 2, 8, False)
    times, compile_s = ts.time_isolated("pendulum", s, ("auto",), False, False, ("fp32",), 2)
    assert list(times) == list(compile_s) == ["ours", "baseline"]
    for t in times.values():
        assert len(t["all_s"]) == 2 and all(x > 0 for x in t["all_s"])
