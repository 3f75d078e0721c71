"""benchmarks/flop_bound.py counts what it claims: the FLOPs of every matrix product in a
program, nested calls and loops included, checked against counts worked out by hand; on the
layer benchmark's stack, exactly the nine products per layer that `layer.py`'s GEMM floor
names (plus D's gradient, a batched dot); and the peak probe builds and reports."""

import math
import platform
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import flop_bound as fb  # noqa: E402
import layer  # noqa: E402

from s5jax.core import _native  # noqa: E402


def _count(f, *args):
    return fb.product_flops(jax.make_jaxpr(f)(*args))


def test_dot_general_counts_batch_and_free_dims():
    a, b = jnp.ones((3, 5, 7)), jnp.ones((3, 7, 11))
    c = _count(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), a, b)
    assert c["dot_general"] == 2 * 3 * 5 * 7 * 11
    assert c["total"] == c["dot_general"] and c["weight_gradient"] == 0
    # a contraction over two axes, and a plain matrix-vector product
    x, y = jnp.ones((4, 6, 9)), jnp.ones((6, 9, 2))
    assert _count(lambda x, y: jnp.tensordot(x, y, 2), x, y)["total"] == 2 * 4 * 6 * 9 * 2
    assert _count(lambda m, v: m @ v, jnp.ones((8, 13)), jnp.ones(13))["total"] == 2 * 8 * 13


def test_nested_calls_scans_conds_and_whiles():
    m = jnp.ones((6, 6))
    one = 2 * 6**3

    @jax.jit
    def inner(x):
        return x @ m

    def looped(x):
        x, _ = jax.lax.scan(lambda c, _: (inner(c), None), x, None, length=5)
        return x

    assert _count(looped, m)["total"] == 5 * one  # a jitted call inside a scan body
    # a cond counts its cheapest branch: a lower bound may not assume the dearer one runs
    both = _count(lambda p, x: jax.lax.cond(p, lambda x: x @ m @ m, lambda x: x @ m, x), True, m)
    assert both["total"] == one
    # a while body counts once, and is reported: its trip count is not in the program
    w = _count(lambda x: jax.lax.while_loop(lambda c: c[0, 0] < 9.0, lambda c: c @ m, x), m)
    assert w["total"] == one and w["unbounded_loops"] == 1
    # under grad: the product's two cotangent products appear as well
    g = _count(jax.grad(lambda x: jnp.sum(x @ m)), m)
    assert g["total"] >= one


@pytest.mark.skipif(not _native.native_available(), reason="no native kernels on this host")
def test_native_weight_gradients_count_their_multiply_adds():
    a, g = jnp.ones((64, 12)), jnp.ones((64, 20))
    c = _count(_native.native_weight_gradient, a, g)
    assert c["weight_gradient"] == 2 * 64 * 12 * 20 and c["dot_general"] == 0
    c = _count(_native.native_column_dot, jnp.ones((3, 64, 12)), jnp.ones((3, 64, 12)))
    assert c["weight_gradient"] == 2 * 3 * 64 * 12 and c["dot_general"] == 0


@pytest.mark.parametrize("method", ["native", "chunked"])
def test_layer_stack_has_the_nine_products_of_the_gemm_floor(method):
    # layer.py: per bidirectional layer nine products of B·L·H·2P multiply-adds (P stored);
    # D's gradient, Σ over B and L of ∂y ⊙ u, is B·L·H more (a batched dot, or the native
    # column dot where the native library is built).
    B, L, H, P_full, n = 2, 16, 8, 16, 3
    stack = layer.make_ours(n, H, P_full, 1, method, jax.random.PRNGKey(0))
    params, static = eqx.partition(stack, eqx.is_inexact_array)
    u = jax.random.normal(jax.random.PRNGKey(1), (B, L, H))
    c = _count(lambda p: layer.ours_step(eqx.combine(p, static), u), params)
    unit = B * L * H * 2 * (P_full // 2)
    assert c["total"] == n * (9 * 2 * unit + 2 * B * L * H)
    assert c["unbounded_loops"] == 0


def test_bound_row_divides_the_baseline_by_the_products_at_the_peak():
    s = {"batch": 4, "L": 1024, "P_full": 384}
    peak, xla = {"fp32": 200.0, "bf16": None}, {"fp32": 160.0, "bf16": 300.0}
    flops = 100e9  # 0.5 s at the fp32 peak
    row = fb.bound_row("image", s, flops, 2000.0, 800.0, peak, xla, "fp32")
    assert math.isclose(row["products_ms"], 500.0) and math.isclose(row["bound"], 4.0)
    assert math.isclose(row["products_xla_ms"], 625.0) and math.isclose(row["bound_xla"], 3.2)
    assert math.isclose(row["ratio"], 2.5) and math.isclose(row["budget_ms"], 400.0)
    no_peak = fb.bound_row("image", s, flops, 2000.0, 800.0, peak, xla, "bf16")
    assert no_peak["products_ms"] is None and no_peak["bound"] is None
    assert math.isclose(no_peak["bound_xla"], 2000.0 / (flops / 300.0 / 1e6))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 probe")
def test_peak_probe_builds_and_reports(tmp_path):
    try:
        exe = fb.build_probe(tmp_path)
    except RuntimeError as error:  # a host without AVX2/FMA: said in one line
        assert "fma_peak.cc did not compile" in str(error)
        pytest.skip(str(error))
    if exe is None:
        pytest.skip("no C++ compiler")
    seconds, gflops, _ = (float(v) for v in subprocess.run(
        [str(exe), "f", "2", "1000"], check=True, capture_output=True, text=True
    ).stdout.split())  # fmt: skip
    assert seconds > 0 and gflops > 0
    out = subprocess.run([str(exe), "b", "1", "1000"], check=True, capture_output=True,
                         text=True).stdout.split()  # fmt: skip
    assert out == ["none"] or float(out[1]) > 0
    bad = subprocess.run([str(exe), "x", "1", "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_a_failing_probe_is_one_line(tmp_path):
    broken = tmp_path / "probe"
    broken.write_text("#!/bin/sh\necho 'illegal instruction' >&2\nexit 132\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"^fma_peak.cc failed: illegal instruction$"):
        fb.measure_peak(broken, threads=1)
