"""Plant one plausible one-line bug at a time and see whether the tests that should notice do.

Each mutation names a file under `src/s5jax/`, an exact fragment of one line, its replacement
and the smallest tests that should fail (files or `file::test` node ids). For each, `src/` and
`tests/` (with `pyproject.toml` and `scripts/`) are copied into a fresh temporary folder, the
fragment is replaced there, and the tests run with `PYTHONPATH` set to the copy's `src` (and,
for a mutation of the native C++ source, `S5JAX_CACHE_DIR` inside the copy, so that its build
goes with it):

    pytest -x -q -p no:cacheprovider -n 2 TESTS

A failing run means the mutation was caught; a passing one that it survived (a missing test);
a fragment that is not in its file exactly once is reported as stale and not run. The working
tree is never touched.

    .venv/bin/python scripts/mutation_probe.py                 # all of them
    .venv/bin/python scripts/mutation_probe.py --only zoh-gamma-sign,chunk-carry-off-by-one
    .venv/bin/python scripts/mutation_probe.py --limit 5 --repeat 8

It prints a table and the score and writes `scripts/mutation_probe-results.json` (`--out`
elsewhere; `--merge` keeps the file's records of the mutations not run now).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "scripts" / "mutation_probe-results.json"
COPIED = ("src", "tests", "scripts", "pyproject.toml")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to src/s5jax/
    original: str  # an exact fragment of one line, present exactly once
    replacement: str
    tests: tuple[str, ...]
    why: str


M = Mutation
EFFECTS = "tests/test_effects.py"
NATIVE = "tests/test_scan_native.py"
IMAGE_AUDIO = "tests/test_data_image_audio.py"
OPTIONS = "tests/test_option_coverage.py"
DEFAULTS = "tests/test_defaults.py"
UEA = "tests/test_data_uea.py"
LRA_TEXT = "tests/test_data_lra_text.py"
PRECISION = "tests/test_precision.py"
SWEEP = "tests/test_sweep.py"
RUN_DIRS = "tests/test_run_dirs.py"
NPZ = "tests/test_data_npz_batches.py"
LOGGING = "tests/test_train_logging.py"
PENDULUM = "tests/test_data_pendulum.py"
MUTATIONS = (
    # --- core: the paper's math ----------------------------------------------------------
    M("zoh-gamma-sign", "core/_discretize.py", "(Lambda_bar - 1) / Lambda",
      "(Lambda_bar + 1) / Lambda", ("tests/test_discretize.py",), "ZOH B̄ factor (Eq. 6)"),
    M("zoh-drops-delta", "core/_discretize.py",
      "Lambda_bar = jnp.exp(Lambda * Delta.astype(Lambda.dtype))",
      "Lambda_bar = jnp.exp(Lambda)", ("tests/test_discretize.py",), "Λ̄ without Δ"),
    M("bilinear-denominator", "core/_discretize.py", "denom = 1 - half", "denom = 1 + half",
      ("tests/test_discretize.py",), "bilinear (1 − ΔΛ/2)"),
    M("clip-eigs-max", "core/_discretize.py", "return jnp.minimum(Lambda_re, max_value)",
      "return jnp.maximum(Lambda_re, max_value)", ("tests/test_discretize.py",),
      "clip Re Λ from above"),
    M("conj-sym-factor-2", "core/_ssm.py", "return 2.0 if conj_sym else 1.0",
      "return 1.0 if conj_sym else 1.0", ("tests/test_ssm.py",), "missing conjugate factor 2"),
    M("re-cx-sign", "core/_ssm.py", "W = jnp.concatenate([C.real.T, -C.imag.T], axis=0)",
      "W = jnp.concatenate([C.real.T, C.imag.T], axis=0)", ("tests/test_ssm.py",),
      "Re(C̃x) sign of the imaginary product"),
    M("bu-swapped-re-im", "core/_ssm.py",
      "return jnp.concatenate([M.real.T, M.imag.T], axis=1)",
      "return jnp.concatenate([M.imag.T, M.real.T], axis=1)", ("tests/test_ssm.py",),
      "B̄u with real and imaginary parts swapped"),
    M("step-multipliers-first", "core/_ssm.py", "[jnp.ones((1,), t.dtype), jnp.diff(t)]",
      "[jnp.zeros((1,), t.dtype), jnp.diff(t)]",
      (f"{EFFECTS}::test_unit_spaced_times_give_the_regularly_sampled_layer",),
      "first Δ multiplier 0 instead of 1"),
    M("scan-operator-order", "core/_scan.py", "return a_j * a_i, a_j * b_i + b_j",
      "return a_j * a_i, a_i * b_j + b_i", ("tests/test_scan.py",),
      "App. H binary operator applied in the wrong order"),
    M("chunk-carry-off-by-one", "core/_scan.py", "return a_k * s + h_k, s  # emit",
      "return a_k * s + h_k, a_k * s + h_k  # emit", ("tests/test_scan_chunked.py",),
      "chunked scan carries the state leaving a chunk into the same chunk"),
    M("chunk-reverse-last-step", "core/_scan.py", "last = 0 if reverse else -1",
      "last = -1", ("tests/test_scan_chunked.py",),
      "chunked scan, per-step a, reverse: wrong chunk-end step"),
    M("hippo-diagonal", "core/_hippo.py", "np.diag(np.arange(N, dtype=np.float64))",
      "np.diag(np.arange(1, N + 1, dtype=np.float64))", ("tests/test_hippo.py",),
      "HiPPO-LegS diagonal −(n+1)"),
    M("hippo-n-low-rank", "core/_hippo.py", "p_legs = np.sqrt(np.arange(N) + 0.5)",
      "p_legs = np.sqrt(np.arange(N) + 1.5)", ("tests/test_hippo.py",),
      "HiPPO-N low-rank term"),
    M("hippo-conjugate-eigs", "core/_hippo.py", "Lambda = np.mean(diag) + 1j * Lambda_im",
      "Lambda = np.mean(diag) - 1j * Lambda_im", ("tests/test_hippo.py",),
      "eigenvalues conjugated against their eigenvectors"),
    M("log-step-not-log", "core/_init.py", "np.log(dt_min), np.log(dt_max))",
      "dt_min, dt_max)", ("tests/test_init.py",), "log Δ drawn uniform in Δ, not log Δ"),
    # --- nn -------------------------------------------------------------------------------
    M("ssm-drops-rescale", "nn/_ssm.py",
      "Delta = jnp.exp(self.log_step) * jnp.asarray(step_rescale, self.log_step.dtype)",
      "Delta = jnp.exp(self.log_step)", ("tests/test_ssm.py",), "step_rescale ignored"),
    M("ssm-lambda-swapped", "nn/_ssm.py", "return jax.lax.complex(re, self.Lambda_im)",
      "return jax.lax.complex(self.Lambda_im, re)", ("tests/test_ssm.py",),
      "Λ with real and imaginary parts swapped"),
    M("batchnorm-momentum", "nn/_norm.py",
      "new = (m * running_mean + (1 - m) * mean, m * running_var + (1 - m) * var)",
      "new = ((1 - m) * running_mean + m * mean, (1 - m) * running_var + m * var)",
      ("tests/test_models.py",), "BatchNorm momentum used the wrong way round"),
    M("batchnorm-variance", "nn/_norm.py", "jnp.mean(jnp.square(x - _row(m, x)), axis=0)",
      "jnp.mean(jnp.square(x), axis=0)", ("tests/test_models.py",),
      "BatchNorm variance not centred"),
    M("masked-mean-length", "nn/_heads.py", "mask = jnp.arange(x.shape[0]) < length",
      "mask = jnp.arange(x.shape[0]) <= length", ("tests/test_models.py",),
      "masked mean pooling one step too long"),
    M("mean-pool-length", "nn/_heads.py", "return jnp.mean(x, axis=0)",
      "return jnp.mean(x[1:], axis=0)", (f"{EFFECTS}::test_mean_pooling_averages_every_step",),
      "mean pooling over L − 1 steps"),
    M("half-glu1-value", "nn/_layers.py", "out = g * gate", "out = y * gate",
      ("tests/test_models.py",), "half_glu1 gates the raw SSM output"),
    M("irregular-dt-dropped", "nn/_model.py",
      'ssm_dt = dt if self.timestep_mode == "irregular" else None', "ssm_dt = None",
      ("tests/test_models.py",), "irregular Δ never reaches the SSMs"),
    # --- train ----------------------------------------------------------------------------
    M("engine-dt-ones", "train/_engine.py",
      'out["dt"] = np.concatenate([np.ones_like(t[:, :1]), np.diff(t, axis=1)], axis=1)',
      'out["dt"] = np.ones_like(t)',
      (f"{EFFECTS}::test_batch_conversion_turns_times_into_step_multipliers",),
      "the engine feeds Δ multipliers of 1"),
    M("engine-zero-shot-rescale", "train/_engine.py", "run.evaluate(split, 2.0)",
      "run.evaluate(split, 1.0)",
      (f"{EFFECTS}::test_zero_shot_8khz_splits_are_evaluated_at_step_rescale_2",),
      "8 kHz zero-shot evaluated without doubling Δ"),
    M("engine-plateau-not-applied", "train/_engine.py",
      "run.opt_state = set_lr_scale(run.opt_state, plateau.scale)",
      "run.opt_state = set_lr_scale(run.opt_state, 1.0)",
      (f"{EFFECTS}::test_reduce_on_plateau_lowers_the_rate_after_patience_epochs",),
      "reduce-on-plateau never reaches the optimiser"),
    M("engine-early-stop-patience", "train/_engine.py",
      "patience=cfg.train.early_stop_patience,", "patience=cfg.train.early_stop_patience + 1,",
      (f"{EFFECTS}::test_early_stopping_stops_after_patience_epochs_without_improvement",),
      "early stopping one epoch late"),
    M("evaluate-run-rescale", "train/_runs.py", "result = run.evaluate(split, step_rescale)",
      "result = run.evaluate(split)",
      (f"{EFFECTS}::test_step_rescale_reaches_the_model_in_evaluate_run_and_eval",),
      "evaluate_run drops step_rescale"),
    M("optim-dt-global-dropped", "train/_optim.py",
      "optimizer_groups(model, optim_cfg.partition, dt_global=optim_cfg.dt_global)",
      "optimizer_groups(model, optim_cfg.partition, dt_global=False)",
      (f"{EFFECTS}::test_dt_global_puts_log_step_under_the_global_rate_with_weight_decay",),
      "dt_global never reaches the optimiser"),
    M("schedule-warmup-off-by-one", "train/_schedule.py",
      "warm = base * (s + 1).astype(jnp.float32) / self.warmup_steps",
      "warm = base * s.astype(jnp.float32) / self.warmup_steps", ("tests/test_optim.py",),
      "warm-up starts at 0 instead of base/W"),
    M("plateau-patience", "train/_schedule.py", "if count > patience:",
      "if count >= patience:", ("tests/test_optim.py",), "plateau reduces one epoch early"),
    M("early-stop-patience", "train/_schedule.py",
      "stop=patience is not None and count > patience",
      "stop=patience is not None and count >= patience", ("tests/test_optim.py",),
      "early stop one epoch early"),
    M("eval-count-padding", "train/_steps.py", '"count": jnp.sum(mask.astype(jnp.int32)),',
      '"count": mask.shape[0],',
      ("tests/test_engine.py::test_steps_compile_once_despite_a_padded_last_batch",),
      "padding rows counted in eval averages"),
    M("gaussian-nll-half", "train/_steps.py",
      "nll = 0.5 * (jnp.log(2 * jnp.pi * var) + (y - mean) ** 2 / var)",
      "nll = (jnp.log(2 * jnp.pi * var) + (y - mean) ** 2 / var)",
      (f"{EFFECTS}::test_step_losses_equal_the_heads_losses",),
      "Gaussian NLL without the ½ (pendulum loss)"),
    # --- data -----------------------------------------------------------------------------
    M("epoch-order-ignores-epoch", "data/_batches.py",
      "rng = np.random.default_rng([int(seed), int(epoch)])",
      "rng = np.random.default_rng(int(seed))", ("tests/test_data_npz_batches.py",),
      "the same order every epoch"),
    M("batch-mask-padding", "data/_batches.py", "mask[:real] = True", "mask[:] = True",
      ("tests/test_data_npz_batches.py",), "padding rows marked real"),
    M("pendulum-times", "data/_pendulum.py",
      "t = np.cumsum(np.r_[0.0, np.full(n_steps - 1, dt)]) / dt",
      "t = np.cumsum(np.r_[dt, np.full(n_steps - 1, dt)]) / dt",
      ("tests/test_data_pendulum.py",), "pendulum times start at 1 instead of 0"),
    # --- the speed work of issue 20: native kernels, custom VJPs, the loop around the step --
    M("planar-fwd-state-carried", "core/_native.cc",
      "        std::fill(s.begin(), s.end(), R(0));",
      "        if (d == 0) std::fill(s.begin(), s.end(), R(0));", (NATIVE,),
      "the planar kernel's reverse-time states start from the forward direction's last state"),
    M("planar-adj-kept-chunk", "core/_native.cc",
      "if (k % C == 0) std::copy(br, br + 2 * Pj, kept.begin() + (k / C) * 2 * Pj);",
      "if (k % C == 1) std::copy(br, br + 2 * Pj, kept.begin() + (k / C) * 2 * Pj);", (NATIVE,),
      "the bidirectional adjoint restarts each chunk's λ← from the wrong step"),
    M("planar-adj-abar-back-last", "core/_native.cc",
      "if (k + 1 < L) {  // ā← += conj(x←_{k+1}) λ←_k",
      "if (k + 2 < L) {  // ā← += conj(x←_{k+1}) λ←_k", (NATIVE,),
      "∂Λ̄ of the reverse-time direction misses one step's term"),
    M("planar-adj-abar-fwd-first", "core/_native.cc",
      "if (k > 0) {  // ā→ += conj(x→_{k−1}) λ→_k", "if (k > 1) {  // ā→ += conj(x→_{k−1}) λ→_k",
      (NATIVE,), "∂Λ̄ of the forward direction misses one step's term (bidirectional)"),
    M("planar-adj-flush-drops", "core/_native.cc",
      "            total[static_cast<size_t>(q)] += "
      "static_cast<double>(part[static_cast<size_t>(q)]);",
      "            total[static_cast<size_t>(q)] += 0.0;", (NATIVE,),
      "the one-direction adjoint drops ∂Λ̄'s partial sums every 256 steps"),
    M("wg-remainder-columns", "core/_native.cc", "    if (rem) {", "    if (false && rem) {",
      (NATIVE,), "the weight-gradient tile skips the columns after the last whole panel"),
    M("column-dot-mean-ignored", "core/_native.cc", "p[j] += (Widen(xr[j]) - mb[j]) * gr[j];",
      "p[j] += Widen(xr[j]) * gr[j];", (NATIVE, "tests/test_products.py"),
      "the native column dot forgets BatchNorm's mean"),
    M("column-dot-later-blocks", "core/_native.cc", "db[j] += p[blk * N + j];",
      "db[j] += 0.0f * p[blk * N + j];", (NATIVE, "tests/test_products.py"),
      "the native column dot keeps only its first block of 1,024 rows"),
    M("native-cache-never-pruned", "core/_native.py", "    _prune(out_dir, keep=target)",
      "    pass  # _prune(out_dir, keep=target)", (NATIVE,),
      "a new native build never removes the builds no process has loaded for 30 days"),
    M("native-cache-use-not-marked", "core/_native.py", "        _mark_used(target)",
      "        pass  # _mark_used(target)", (NATIVE,),
      "loading a cached native build does not mark it used, so a build in use is pruned"),
    M("sum-over-batch-odd-tail", "core/_products.py",
      "x = jnp.concatenate([pairs, x[2 * half :]]) if x.shape[0] % 2 else pairs", "x = pairs",
      ("tests/test_products.py",), "the pairwise batch sum drops an odd batch's last example"),
    M("input-gradient-untransposed", "core/_products.py",
      "dims = (((g.ndim - 1,), (1,)), ((), ()))", "dims = (((g.ndim - 1,), (0,)), ((), ()))",
      ("tests/test_products.py",), "∂a = g b instead of g bᵀ (silent for square weights)"),
    M("scale-columns-dx-unscaled", "core/_products.py",
      "return (g * d[None, :].astype(g.dtype)).astype(x.dtype), dd.astype(d.dtype)",
      "return g.astype(x.dtype), dd.astype(d.dtype)", ("tests/test_products.py",),
      "the feed-through's input gradient forgets D"),
    M("native-wg-first-example", "core/_products.py",
      "db = _native.native_weight_gradient(a.reshape(n * m, k), g.reshape(n * m, g.shape[-1]))",
      "db = _native.native_weight_gradient(a[0], g[0])", ("tests/test_products.py",),
      "the float32 native weight gradient sums only the first example"),
    M("rows-to-columns-order", "core/_products.py",
      "return a.reshape(M // s, s, K).transpose(2, 0, 1).reshape(K, M)",
      "return a.reshape(M // s, s, K).transpose(2, 1, 0).reshape(K, M)",
      ("tests/test_products.py",), "the row-major transposed copy interleaves its rows wrongly"),
    M("mixed-abar-first-sequence", "core/_mixed.py",
      "return dU, dW_in, jnp.sum(a_bar, axis=0), dW_out", "return dU, dW_in, a_bar[0], dW_out",
      ("tests/test_mixed.py",), "the one-VJP bf16 SSM's ∂Λ̄ from the first sequence only"),
    M("batchnorm-closed-form-mean", "nn/_norm.py",
      "return g * _row(s, x), -s * sum_g, sum_gx, sum_g",
      "return g * _row(s, x), s * sum_g, sum_gx, sum_g", ("tests/test_models.py",),
      "BatchNorm's closed-form backward: the mean's cotangent with the wrong sign"),
    M("batchnorm-centred-variance", "nn/_norm.py",
      "return (x - _row(m, x)) * _row(2 * g / x.shape[0], x), jnp.zeros_like(m)",
      "return (x - _row(m, x)) * _row(g / x.shape[0], x), jnp.zeros_like(m)",
      ("tests/test_models.py",), "the variance's closed-form gradient loses its factor 2"),
    M("engine-window-overlap", "train/_engine.py", "                window = []",
      "                window = window[-1:]", ("tests/test_engine.py",),
      "the loss fetched every log_every steps counts the window's last step twice"),
    M("engine-prefetch-stale", "train/_engine.py", "device_batch = ahead",
      "device_batch = ahead if i == 0 else device_batch", ("tests/test_engine.py",),
      "the batch read one ahead is never used: every step trains on the first batch"),
    M("sharding-first-rows", "train/_sharding.py", "lo, hi = starts[0][0], starts[-1][1]",
      "lo, hi = 0, starts[-1][1] - starts[0][0]", ("tests/test_multiprocess.py",),
      "every process reads the first rows of each batch instead of its own"),
    M("matmul-scan-reverse-powers", "core/_scan.py",
      "into = powers[1:][::-1] if reverse else powers[1:]",
      "into = powers[1:] if reverse else powers[1:]", ("tests/test_scan_matmul.py",),
      "the matmul scan carries a chunk's entry state in with the forward powers in reverse"),
    M("matmul-scan-padding", "core/_scan.py",
      "b = jnp.concatenate([b, jnp.zeros((pad, P), b.dtype)])",
      "b = jnp.concatenate([b, jnp.ones((pad, P), b.dtype)])", ("tests/test_scan_matmul.py",),
      "the matmul scan pads the last chunk with ones (wrong in reverse only)"),
    M("fused-adjoint-one-direction", "core/_ssm.py",
      "lam = (lams_f + lams_b).reshape(B, T, 2 * P)", "lam = lams_f.reshape(B, T, 2 * P)",
      ("tests/test_ssm_fast.py",), "the fused path's bidirectional B̃ gradient forgets x←"),
    M("eval-first-batch-repeated", "train/_engine.py", "pending.append(stats)",
      "pending.append(stats if not pending else pending[0])",
      ("tests/test_engine.py", EFFECTS), "evaluation counts the first batch for every batch"),
    # --- online inference, export, checkpoints, seeds --------------------------------------
    M("stream-reset-keeps-count", "nn/_model.py", "            restart(stream.count),",
      "            stream.count,", ("tests/test_stream.py",),
      "a reset leaves mean pooling's step count running"),
    M("stream-reset-keeps-pool", "nn/_model.py", "            restart(stream.pool_sum),",
      "            stream.pool_sum,", ("tests/test_stream.py",),
      "a reset leaves mean pooling's running sum in place"),
    M("streamed-masked-last", "train/_predict.py",
      'last = x.shape[0] - 1 if length is None or pooling != "masked_mean" else length - 1',
      'last = x.shape[0] - 1 if length is None or pooling != "masked_mean" else length',
      ("tests/test_predict.py",), "predict --online reads a padded sequence one step late"),
    M("export-example-normalize-std", "train/_predict.py",
      "std = jnp.sqrt(jnp.where(valid, (x - mean) ** 2, 0.0).sum(0, keepdims=True) / count)",
      "std = jnp.sqrt(jnp.where(valid, (x - mean) ** 2, 0.0).sum(0, keepdims=True) / (count - 1))",
      ("tests/test_export.py",), "the exported model's per-example std with n − 1"),
    M("sweep-population-std", "train/_sweep.py", "statistics.stdev(values)",
      "statistics.pstdev(values)", ("tests/test_sweep.py",),
      "the seeds' summary reports the population std, not the sample std the paper's ± is"),
    M("checkpoint-oldest-first", "train/_checkpoint.py",
      "steps = sorted(manager.all_steps(), reverse=True)", "steps = sorted(manager.all_steps())",
      ("tests/test_checkpoint.py",), "restore reads the oldest kept checkpoint"),
    M("checkpoint-manifest-ignored", "train/_checkpoint.py",
      'if sorted(state) != sorted(leaf["name"] for leaf in manifest["leaves"]):',
      "if False:", ("tests/test_checkpoint.py", "tests/test_corruption_fuzz.py"),
      "a checkpoint holding other arrays than its manifest lists is restored"),
    # --- readers, logging, run directories -------------------------------------------------
    M("cifar-gray-rounding", "data/_cifar.py",
      "luma = 19595 * rgb[:, 0] + 38470 * rgb[:, 1] + 7471 * rgb[:, 2] + 0x8000",
      "luma = 19595 * rgb[:, 0] + 38470 * rgb[:, 1] + 7471 * rgb[:, 2]", (IMAGE_AUDIO,),
      "grayscale truncates where Pillow's convert('L') rounds"),
    M("cifar-rgb-planes", "data/_cifar.py",
      "x = (_to_tensor(data.reshape(len(data), 3, PIXELS)) - mean) / std",
      "x = (_to_tensor(data.reshape(len(data), PIXELS, 3).transpose(0, 2, 1)) - mean) / std",
      (IMAGE_AUDIO,), "CIFAR rows read as interleaved RGB instead of three planes"),
    M("bitreversal-identity", "data/_mnist.py", "rev |= ((idx >> b) & 1) << (bits - 1 - b)",
      "rev |= ((idx >> b) & 1) << b", (IMAGE_AUDIO,), "psMNIST's permutation is the identity"),
    M("wav-big-endian", "data/_speech.py", 'return np.frombuffer(frames, "<i2")',
      'return np.frombuffer(frames, ">i2")', (IMAGE_AUDIO,), "WAV samples read big-endian"),
    M("speech-std-biased", "data/_speech.py",
      "std = np.sqrt(np.asarray(spread, np.float64) / (n * (n - 1))) * SCALE",
      "std = np.sqrt(np.asarray(spread, np.float64) / (n * n)) * SCALE", (IMAGE_AUDIO,),
      "Speech Commands' per-step std biased (the reference standardises with n − 1)"),
    M("tensorboard-delta-log", "train/_tensorboard.py",
      'histograms[f"{name}/Delta"] = np.exp(p["log_step"])',
      'histograms[f"{name}/Delta"] = p["log_step"]', ("tests/test_train_logging.py",),
      "the Δ histogram shows log Δ"),
    M("rundir-any-folder-is-a-checkpoint", "train/_rundir.py",
      "return latest.is_dir() and any(p.name.isdigit() for p in latest.iterdir())",
      "return latest.is_dir() and any(True for p in latest.iterdir())",
      ("tests/test_run_dirs.py",), "a half-written orbax temporary counts as a checkpoint"),
    M("announce-error-class-lost", "train/_sharding.py",
      'cls = _error_classes().get(payload["error"])', "cls = None",
      ("tests/test_multiprocess.py",),
      "other processes stop with a RuntimeError instead of process 0's error and exit status"),
    M("announce-rounds-not-numbered", "train/_sharding.py",
      'return f"{key}/{_ROUNDS[key]}"', "return key", ("tests/test_multiprocess.py",),
      "a process training several runs reads the first run's announcements again"),
    # --- configs and seeds ----------------------------------------------------------------
    M("config-base-table-replaced", "config/_load.py",
      "merged[key] = {**parent.get(key, {}), **raw.get(key, {})}",
      "merged[key] = {**raw.get(key, {})}", ("tests/test_config.py",),
      "a config's [model] table replaces its base's instead of overriding key by key"),
    M("config-base-wins", "config/_load.py",
      "merged[key] = {**parent.get(key, {}), **raw.get(key, {})}",
      "merged[key] = {**raw.get(key, {}), **parent.get(key, {})}", ("tests/test_config.py",),
      "the base's settings override the config that names it"),
    M("state-size-ignores-conj-sym", "config/_schema.py",
      "return self.ssm_size // 2 if self.conj_sym else self.ssm_size",
      "return self.ssm_size // 2", ("tests/test_config.py", "tests/test_paper_configs.py"),
      "model.state_size halves P without conjugate symmetry too"),
    M("seeds-range-exclusive", "train/_sweep.py",
      "seeds.update(dict.fromkeys(range(lo, hi + 1)))",
      "seeds.update(dict.fromkeys(range(lo, hi)))", ("tests/test_sweep.py",),
      "--seeds 0-19 stops at 18"),
    M("seeds-unfinished-counts-as-done", "train/_sweep.py",
      'if results.get("epochs_run", 0) < config.train.epochs:', "if False:",
      ("tests/test_sweep.py",), "a seed run to fewer epochs than asked is taken as finished"),
    # --- cli ------------------------------------------------------------------------------
    M("cli-eval-checkpoint", "cli/__init__.py",
      "step_rescale=args.step_rescale, which=args.checkpoint",
      'step_rescale=args.step_rescale, which="best"',
      (f"{EFFECTS}::test_eval_checkpoint_option_picks_best_or_latest",),
      "s5jax eval ignores --checkpoint"),
    M("cli-eval-split", "cli/__init__.py", "split=args.split, step_rescale=args.step_rescale",
      'split="test", step_rescale=args.step_rescale',
      (f"{EFFECTS}::test_eval_split_option_evaluates_that_split",),
      "s5jax eval ignores --split"),
    M("cli-eval-rescale", "cli/__init__.py", "step_rescale=args.step_rescale, which=",
      "step_rescale=1.0, which=",
      (f"{EFFECTS}::test_step_rescale_reaches_the_model_in_evaluate_run_and_eval",),
      "s5jax eval ignores --step-rescale"),
    # --- modules the probe had not reached (2026-12-06) ----------------------------------
    M("atomic-temp-left-behind", "_atomic.py", "tmp.unlink(missing_ok=True)", "None",
      ("tests/test_atomic.py",), "a failed write leaves its temporary file beside the target"),
    M("atomic-private-mode", "_atomic.py", "mode: int = 0o666", "mode: int = 0o600",
      ("tests/test_atomic.py",), "files written atomically are 0600, not what open() gives"),
    M("normalize-counts-padding", "data/_normalize.py", "count = mask.sum()\n",
      "count = mask.size\n", ("tests/test_defaults.py",),
      "channel statistics divide by the padded steps too"),
    M("ensemble-mean-of-log-probs", "nn/_ensemble.py",
      "return jax.nn.logsumexp(outputs, axis=0) - math.log(outputs.shape[0])",
      "return jnp.mean(outputs, axis=0)", ("tests/test_ensemble.py",),
      "the ensemble averages log-probabilities instead of probabilities"),
    M("toml-quote-unescaped", "config/_toml.py", "'\"': '\\\\\"',", "'\"': '\"',",
      ("tests/test_cli_conventions.py",), "a double quote inside a TOML string is not escaped"),
    M("uea-ffill-leading-gap", "data/_uea.py", "idx[idx < 0] = first", "idx[idx < 0] = 0",
      ("tests/test_data_uea.py",), "ffill leaves a leading gap NaN instead of the first value"),
    M("uea-class-order-text", "data/_uea.py", "return sorted(names, key=float)",
      "return sorted(names)", ("tests/test_data_uea.py",),
      "numeric class names sorted as text (1, 10, 2)"),
    M("uea-val-takes-whole-class", "data/_uea.py",
      "k = min(max(1, round(fraction * len(members))), len(members) - 1)",
      "k = min(max(1, round(fraction * len(members))), len(members))",
      ("tests/test_data_uea.py",), "a class can lose every training example to val"),
    M("uea-regression-val-takes-all", "data/_uea.py",
      "k = min(max(1, round(fraction * n)), n - 1)", "k = max(1, round(fraction * n))",
      ("tests/test_data_uea.py",), "a regression carve can leave no training example"),
    M("npz-lengths-beyond-length", "data/_npz.py", "lengths.max() > L:", "lengths.max() > L + 1:",
      ("tests/test_npz_fuzz.py", "tests/test_data_npz_batches.py"),
      "a length of L + 1 is accepted"),
    M("npz-label-equal-to-n-classes", "data/_npz.py", "if y.max() >= n_classes:",
      "if y.max() > n_classes:",
      ("tests/test_npz_fuzz.py", "tests/test_data_npz_batches.py"),
      "a label equal to n_classes is accepted"),
    M("defaults-epochs-floor", "train/_defaults.py",
      "epochs = max(1, math.ceil(steps / per_epoch))", "epochs = max(1, steps // per_epoch)",
      ("tests/test_defaults.py",), "the chosen epochs fall short of the step budget"),
    M("metrics-resume-keeps-next-step", "train/_logging.py",
      'if int(r.get("step", 0)) <= resume_step]', 'if int(r.get("step", 0)) <= resume_step + 1]',
      ("tests/test_train_logging.py",), "a resumed run keeps a record from after its checkpoint"),
    M("tensorboard-purge-off-by-one", "train/_logging.py",
      "purge = None if resume_step is None else (resume_step + 1 if resume_step else 0)",
      "purge = None if resume_step is None else (resume_step if resume_step else 0)",
      ("tests/test_train_logging.py",), "TensorBoard drops the checkpoint's own step on resume"),
    M("vocab-ties-unsorted", "data/_vocab.py", "key=lambda kv: (-kv[1], kv[0])",
      "key=lambda kv: -kv[1]", ("tests/test_data_lra_text.py", "tests/test_listops_cli.py"),
      "tokens of equal count keep first-seen order, not torchtext's string order"),
    M("vocab-min-freq-strict", "data/_vocab.py", "if c >= min_freq and", "if c > min_freq and",
      ("tests/test_data_lra_text.py", "tests/test_listops_cli.py"),
      "a token seen exactly min_freq times becomes <unk>"),
    M("listops-median-upper", "data/_listops.py",
      "return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2", "return s[mid]",
      ("tests/test_data_lra_text.py", "tests/test_listops_cli.py"),
      "MED of an even count takes the upper middle value, not np.median truncated"),
    M("pathfinder-negative-on-one-path", "data/_pathfinder_gen.py",
      "end = origin if label == 1 else 1 - origin", "end = origin",
      ("tests/test_data_pathfinder_gen.py",), "negative images put both markers on one path"),
    M("embedding-no-bias", "nn/_encoders.py",
      "rows = rows + jnp.broadcast_to(self.bias[None, :], rows.shape)", "rows = rows",
      ("tests/test_models.py",),
      "the embedding encoder drops its bias (the authors' one-hot Dense has one)"),
    M("sweep-log-uniform-linear", "train/_sweep.py",
      'return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.6g}")',
      'return float(f"{rng.uniform(lo, hi):.6g}")', ("tests/test_sweep.py",),
      "log_uniform draws uniformly on the linear scale"),
    M("sweep-int-uniform-exclusive", "train/_sweep.py", "return rng.randint(int(lo), int(hi))",
      "return rng.randrange(int(lo), int(hi))", ("tests/test_sweep.py",),
      "int_uniform never draws its upper bound"),
    M("seeds-population-std", "train/_sweep.py", "statistics.stdev(values)",
      "statistics.pstdev(values)", ("tests/test_sweep.py",),
      "the seeds' spread is the population std, not the sample std"),
    M("config-bool-is-an-int", "config/_types.py",
      "if isinstance(value, bool) or not isinstance(value, int):",
      "if not isinstance(value, int):", ("tests/test_config.py",),
      "true is accepted where an integer is expected"),
    M("config-nonfinite-float", "config/_types.py", "if not math.isfinite(value):", "if False:",
      ("tests/test_config.py",), "a NaN or infinite float setting is accepted"),
    M("config-json-added-keys-not-filled", "config/_dict.py", "raw = _fill_added(key, raw)",
      "raw = raw", ("tests/test_config.py", "tests/test_run_dirs.py"),
      "an older config.json takes today's default for a key added since, not its old behaviour"),
    M("config-removed-key-accepted", "config/_dict.py", 'if source != "json":', "if False:",
      ("tests/test_config.py",), "a removed key in a TOML file is ignored instead of refused"),
    M("discrete-b-conjugated", "nn/_discrete.py",
      "self.B_bar_re, self.B_bar_im = B_bar.real, B_bar.imag",
      "self.B_bar_re, self.B_bar_im = B_bar.real, -B_bar.imag", ("tests/test_models.py",),
      "the discrete ablation starts from the conjugate of B-bar"),
    M("aan-second-document-is-first", "data/_aan.py", "char_keys(text2, l_max - 1)",
      "char_keys(text1, l_max - 1)", ("tests/test_data_lra_text.py",),
      "Retrieval's second document is a copy of the first"),
    M("imdb-review-order-text", "data/_imdb.py",
      'sorted(sub.glob("*.txt"), key=_review_order)', 'sorted(sub.glob("*.txt"))',
      ("tests/test_data_lra_text.py",), "reviews ordered by file name text (10_x before 2_x)"),
    M("randperm-offset-range", "data/splits/__init__.py",
      "draws % (n - np.arange(n - 1, dtype=np.int64))",
      "draws % (n - 1 - np.arange(n - 1, dtype=np.int64))", (IMAGE_AUDIO,),
      "the torch.randperm port draws each swap from one slot too few"),
    M("plot-no-best-marker", "train/_plots.py", '_best_marker(ax, best_epoch, *series["val"])',
      "None", ("tests/test_train_logging.py", "tests/test_cli_plot.py"),
      "the curves figure does not mark the best-validation epoch"),
    M("progress-skips-deciles", "train/_progress.py", "if decile > self._last_decile:",
      "if decile > self._last_decile + 1:", ("tests/test_train_logging.py",),
      "the plain progress lines come every 20 % instead of every 10 %"),
    M("pallas-complex-product-sign", "core/_pallas.py",
      "return (pr * qr - pi * qi, pr * qi + pi * qr)",
      "return (pr * qr + pi * qi, pr * qi + pi * qr)", ("tests/test_scan_pallas.py",),
      "the Pallas kernel's complex product adds Im·Im instead of subtracting it"),
    M("pallas-adjoint-next-step", "core/_pallas.py", "j = k - 1 if reverse else k + 1",
      "j = k + 1 if reverse else k - 1", ("tests/test_scan_pallas.py",),
      "the Pallas adjoint pairs λ with the wrong neighbouring state for ā"),
    M("pallas-reverse-chunk-order", "core/_pallas.py", "base = (n_chunks - 1 - c) * T",
      "base = c * T", ("tests/test_scan_pallas.py",),
      "a reverse Pallas walk visits its chunks front to back"),
    M("malloc-opt-out-ignored", "_malloc.py", 'os.environ.get(ENV_VAR, "1").strip() == "0"',
      'os.environ.get(ENV_VAR, "1").strip() == "off"', ("tests/test_malloc.py",),
      "S5JAX_MALLOC_TUNING=0 does not leave the allocator alone"),
    M("n-eval-skips-val", "train/_datasets.py",
      'limits |= {s: data_cfg.n_eval for s in dataset.splits if s != "train"}',
      'limits |= {"test": data_cfg.n_eval}', ("tests/test_dataset_loading.py",),
      "data.n_eval limits the test split but not val"),
    M("seq-len-checks-train-only", "train/_datasets.py",
      'for split_name in ("train", "val", "test"):', 'for split_name in ("train",):',
      ("tests/test_dataset_loading.py",), "data.seq_len is not checked against val and test"),
    M("sequence-length-of-pairs", "train/_datasets.py",
      "x.shape[-1] if np.issubdtype(x.dtype, np.integer) else x.shape[1]", "x.shape[1]",
      ("tests/test_dataset_loading.py", "tests/test_data_lra_text.py"),
      "Retrieval's (N, 2, L) token pairs report a length of 2"),
    M("prepared-format-version-unchecked", "data/_prepared.py",
      'if meta.get("format_version") != _FORMAT_VERSION:', "if False:",
      ("tests/test_dataset_loading.py",), "a prepared dataset of another format version is read"),
    M("cli-io-error-is-usage", "cli/__init__.py",
      "if isinstance(e, (ConfigError, DatasetError, FileNotFoundError, ValueError)):",
      "if isinstance(e, (ConfigError, DatasetError, OSError, ValueError)):",
      ("tests/test_run_dirs.py", "tests/test_cli.py"),
      "a refused write exits 2 (usage) instead of 74 (I/O)"),
    M("cli-busy-is-usage", "cli/__init__.py", "return EXIT_BUSY, str(e)",
      "return EXIT_USAGE, str(e)", ("tests/test_run_dirs.py",),
      "a run directory in use exits 2 instead of 75"),
    M("sweep-busy-exit-lost", "cli/_sweep.py", 'return EXIT_BUSY if "busy" in statuses else 1',
      "return 1", ("tests/test_sweep.py",), "a sweep with a busy trial exits 1, not 75"),
    M("full-glu-gates-g", "nn/_layers.py", "out = h * gate", "out = g * gate",
      ("tests/test_models.py", "tests/test_stream.py", "tests/test_precision.py"),
      "full_glu gates gelu(y) instead of W1 gelu(y)"),
    M("gelu-approximate-ignored", "nn/_layers.py", "approximate=self.gelu_approximate",
      "approximate=True", ("tests/test_models.py", "tests/test_option_coverage.py"),
      "model.gelu_approximate = false still uses the tanh form"),
    M("layer-step-ignores-dt", "nn/_layers.py",
      "ssm_state, y = self.ssm.step(ssm_state, x[0], step_rescale=step_rescale, dt=dt)",
      "ssm_state, y = self.ssm.step(ssm_state, x[0], step_rescale=step_rescale, dt=None)",
      ("tests/test_stream.py",), "the online step drops the observation interval"),
    M("optim-ssm-decay-at-lr", "train/_optim.py", '"ssm_decay": optim_cfg.ssm_lr',
      '"ssm_decay": optim_cfg.lr', ("tests/test_optim.py",),
      "B-tilde under BandCdecay learns at the global rate instead of ssm_lr"),
    M("optim-ssm-group-decays", "train/_optim.py",
      "return optax.adam(learning_rate=schedule, **adam_args)",
      "return optax.adamw(learning_rate=schedule, weight_decay=optim_cfg.weight_decay, "
      "**adam_args)", ("tests/test_optim.py",), "the SSM group gets weight decay"),
    M("optim-adam-b2-is-b1", "train/_optim.py", "b2=optim_cfg.adam_b2", "b2=optim_cfg.adam_b1",
      ("tests/test_optim.py", f"{OPTIONS}::test_adam_betas_change_the_second_update"),
      "optim.adam_b2 is ignored (b1 used for both moments)"),
    M("predict-argmin", "train/_predict.py", 'np.argmax(out, axis=-1).astype(np.int32)}',
      'np.argmin(out, axis=-1).astype(np.int32)}', ("tests/test_predict.py",),
      "predict writes the least likely class"),
    M("predict-default-lengths-short", "train/_predict.py",
      "arrays[\"lengths\"] = np.full(len(x), x.shape[1], np.int32)",
      "arrays[\"lengths\"] = np.full(len(x), x.shape[1] - 1, np.int32)",
      ("tests/test_predict.py",), "predict without lengths drops each sequence's last step"),
    M("atomic-dir-failure-leaves-temp", "data/_common.py", "        if tmp.exists():",
      "        if False:", ("tests/test_data_pendulum.py", "tests/test_data_image_audio.py"),
      "a failed dataset preparation leaves its temporary folder behind"),
    M("pathfinder-blacklist-ignored", "data/_pathfinder.py",
      'if f"{root.name}/{relative.as_posix()}" not in BLACKLIST:', "if True:", (IMAGE_AUDIO,),
      "the LRA release's blacklisted (empty) Pathfinder images are read"),
    M("pathfinder-not-centred", "data/_pathfinder.py",
      "return (pixels.astype(np.float32) / np.float32(255) - half) / half",
      "return pixels.astype(np.float32) / np.float32(255)", (IMAGE_AUDIO,),
      "Pathfinder pixels in [0, 1] instead of Normalize(0.5, 0.5)'s [-1, 1]"),
    M("roles-outermost-wins", "nn/_tags.py", "role = field.metadata[_KEY]",
      "role = role or field.metadata[_KEY]", ("tests/test_layer.py", "tests/test_optim.py"),
      "an array takes the role of its outermost tagged field, not its innermost"),
    M("init-b-std-by-h", "core/_init.py",
      "B = _trunc_normal(key, (P_full, H), 1.0 / np.sqrt(P_full), dtype)",
      "B = _trunc_normal(key, (P_full, H), 1.0 / np.sqrt(H), dtype)", ("tests/test_init.py",),
      "B's LeCun scale uses H instead of its fan-in P"),
    M("checkpoint-crc-ignored", "train/_checkpoint.py",
      "if len(data) != size or zlib.crc32(data) != crc:", "if len(data) != size:",
      ("tests/test_checkpoint.py", "tests/test_corruption_fuzz.py"),
      "a checkpoint file damaged in place (same size) is restored"),
    M("checkpoint-format-unchecked", "train/_checkpoint.py", "if version != FORMAT:",
      "if False:", ("tests/test_checkpoint.py",),
      "a checkpoint of another format version is read"),
    M("checkpoint-dtype-unchecked", "train/_checkpoint.py",
      "if value.shape != leaf.shape or value.dtype != np.dtype(leaf.dtype):",
      "if value.shape != leaf.shape:", ("tests/test_checkpoint.py",),
      "a checkpoint saved in another dtype is restored without a word"),
    M("engine-ties-go-to-later-epochs", "train/_engine.py",
      "return value > best if self.higher_is_better else value < best",
      "return value >= best if self.higher_is_better else value <= best",
      ("tests/test_engine.py", "tests/test_effects.py"),
      "a later epoch that only equals the best val metric replaces it (best_ties = earliest)"),
    M("engine-select-last-ignores-early-stop", "train/_engine.py",
      "improved = epoch == cfg.train.epochs or stopper.stop",
      "improved = epoch == cfg.train.epochs", ("tests/test_engine.py", "tests/test_effects.py"),
      "select = last with early stopping reports no epoch when training stops early"),
    M("engine-best-saved-every-epoch", "train/_engine.py",
      "if improved and cfg.train.save_best:", "if cfg.train.save_best:",
      ("tests/test_engine.py", "tests/test_effects.py", "tests/test_checkpoint.py"),
      "the best checkpoint is overwritten by epochs that did not improve"),
    M("engine-test-every-epoch-ignored", "train/_engine.py",
      'test = run.evaluate("test") if improved or cfg.train.test_every_epoch else None',
      'test = run.evaluate("test") if improved else None',
      ("tests/test_engine.py", "tests/test_effects.py", OPTIONS),
      "train.test_every_epoch = true evaluates test only at improvements"),
    M("rundir-overwrite-any-folder", "train/_rundir.py",
      "if not any(name in contents for name in _RUN_FILES):", "if False:",
      ("tests/test_run_dirs.py",), "--overwrite replaces a folder that is not a run directory"),
    M("rundir-shared-lock", "train/_rundir.py", "fcntl.LOCK_EX | fcntl.LOCK_NB",
      "fcntl.LOCK_SH | fcntl.LOCK_NB", ("tests/test_run_dirs.py",),
      "two processes both take a run directory's lock"),
    M("pendulum-friction-sign", "data/_pendulum.py",
      "omega = omega + sim_dt * (c * np.sin(theta) - friction * omega)",
      "omega = omega + sim_dt * (c * np.sin(theta) + friction * omega)",
      ("tests/test_data_pendulum.py",), "friction speeds the pendulum up"),
    M("pendulum-noise-weights-swapped", "data/_pendulum.py",
      "return (w * frames + (1 - w) * noise).astype(np.uint8)",
      "return ((1 - w) * frames + w * noise).astype(np.uint8)",
      ("tests/test_data_pendulum.py",), "the clean-image weight multiplies the noise"),
    M("batches-drop-last-miscounted", "data/_batches.py",
      "return n // batch_size if drop_last else -(-n // batch_size)",
      "return -(-n // batch_size)", ("tests/test_data_npz_batches.py", "tests/test_engine.py"),
      "drop_last still counts the final partial batch"),
    M("rows-padding-not-masked", "data/_batches.py", "mask = np.arange(real + pad) < real",
      "mask = np.arange(real + pad) < real + pad",
      ("tests/test_data_npz_batches.py", "tests/test_multiprocess.py"),
      "a process's share of a padded batch marks its padding rows real"),
    M("gaussian-variance-unfloored", "nn/_heads.py",
      "var = jnp.maximum(variance, jnp.asarray(VARIANCE_FLOOR, variance.dtype))",
      "var = variance", ("tests/test_models.py", "tests/test_effects.py"),
      "the Gaussian head's variance may reach 0 (an infinite NLL)"),
    M("native-forward-first-step-a", "core/_native.cc",
      "const R* ak = per_step ? an + k * Q : an;", "const R* ak = an;", (NATIVE,),
      "the native scan with per-step decays uses the first step's decay throughout"),
    M("native-adjoint-a-of-step-k", "core/_native.cc",
      "const R* a_next = per_step ? an + next * Q : an;",
      "const R* a_next = per_step ? an + k * Q : an;", (NATIVE,),
      "the native adjoint carries λ back with step k's decay instead of step k+1's"),
    M("native-adjoint-remainder-dropped", "core/_native.cc",
      "abn[j] = static_cast<R>(total[j] + static_cast<double>(part[j]));",
      "abn[j] = static_cast<R>(total[j]);", (NATIVE,),
      "the native ā loses the steps after its last 256-step flush"),
    M("planar-step-conjugate-ignored", "core/_native.cc",
      "const R re = sr[p], im = si[p], c = sign * ai[p];",
      "const R re = sr[p], im = si[p], c = ai[p];", (NATIVE,),
      "the planar adjoint carries λ with a instead of conj(a)"),
    M("planar-abar-unconjugated", "core/_native.cc", "pr[q] += xr[q] * lr[q] + xi[q] * li[q];",
      "pr[q] += xr[q] * lr[q] - xi[q] * li[q];", (NATIVE,),
      "the planar ā sums x λ instead of conj(x) λ (real part)"),
    M("ssm-step-no-feed-through", "core/_ssm.py", "return x_new, y + jnp.asarray(D) * u_k",
      "return x_new, y", ("tests/test_ssm.py", "tests/test_stream.py"),
      "the recurrent step leaves out D u_k"),
    M("fused-conj-dot-unconjugated", "core/_ssm.py",
      "re, im = x_re * l_re + x_im * l_im, x_re * l_im - x_im * l_re",
      "re, im = x_re * l_re - x_im * l_im, x_re * l_im + x_im * l_re",
      ("tests/test_ssm_fast.py",), "the fused path's ∂Λ̄ sums x λ instead of conj(x) λ"),
    M("fused-powers-doubling", "core/_ssm.py", "        a_k = _cmul(a_k, a_k)",
      "        a_k = _cmul(a, a_k)", ("tests/test_ssm_fast.py",),
      "the fused path's powers of Λ̄ go wrong from the fifth"),
    M("fused-cmul-conjugated", "core/_ssm.py",
      "return a_re * z + jnp.concatenate([-a_im, a_im], axis=-2) * jnp.flip(z, axis=-2)",
      "return a_re * z + jnp.concatenate([a_im, -a_im], axis=-2) * jnp.flip(z, axis=-2)",
      ("tests/test_ssm_fast.py",), "the fused path multiplies by conj(a)"),
    # --- the defaults chosen from a user's data (train/_defaults.py) ----------------------
    M("defaults-spread-min-channel", "train/_defaults.py",
      "return float(np.max(np.where(q90 <= 1e-12, 1.0, ratio)))",
      "return float(np.min(np.where(q90 <= 1e-12, 1.0, ratio)))", (DEFAULTS,),
      "the scale spread is the calmest channel's, so a wild channel never asks for per-example"),
    M("defaults-spread-reads-padding", "train/_defaults.py",
      "mask = (np.arange(L)[None, :] < lengths[:, None])[..., None]",
      "mask = (np.arange(L)[None, :] <= lengths[:, None])[..., None]", (DEFAULTS,),
      "the per-example statistics read one padding step past each length"),
    M("defaults-dt-min-padded-length", "train/_defaults.py",
      "dt_min = float(min(max(1.0 / facts.max_length, DT_MIN_FLOOR), DT_MIN_CEIL))",
      "dt_min = float(min(max(1.0 / facts.seq_len, DT_MIN_FLOOR), DT_MIN_CEIL))", (DEFAULTS,),
      "dt_min follows the padded length, not the longest valid one"),
    M("defaults-batch-64-boundary", "train/_defaults.py",
      "else 16 if facts.n_train >= 64 else 8", "else 16 if facts.n_train > 64 else 8",
      (DEFAULTS,), "64 training examples get batch 8, not 16"),
    M("defaults-budget-counts-partial-batch", "train/_defaults.py",
      "per_epoch = max(1, facts.n_train // batch)",
      "per_epoch = max(1, -(-facts.n_train // batch))",
      (DEFAULTS,), "the step budget counts the dropped partial batch as a step"),
    M("defaults-token-cap-ignores-batch", "train/_defaults.py",
      "cap = max(MIN_CAPPED_STEPS, STEP_TOKENS // (batch * facts.seq_len))",
      "cap = max(MIN_CAPPED_STEPS, STEP_TOKENS // facts.seq_len)", (DEFAULTS,),
      "the sequence-step cap leaves the batch out"),
    M("defaults-warmup-on-one-epoch", "train/_defaults.py",
      "warmup = max(1, round(WARMUP_FRACTION * epochs)) if epochs > 1 else 0",
      "warmup = max(1, round(WARMUP_FRACTION * epochs))", (DEFAULTS,),
      "a one-epoch budget is all warm-up"),
    M("defaults-ensemble-one-way", "train/_defaults.py",
      'one_way = user.get("model.bidirectional") is False', "one_way = False", (DEFAULTS,),
      "a user's unidirectional model on small data becomes an ensemble (never online)"),
    M("defaults-carve-kept-ignores-patience", "train/_defaults.py",
      'or user.get("train.early_stop_patience")', "or False", (DEFAULTS, UEA),
      "early stopping loses its val split to the uncarve rule"),
    M("defaults-example-norm-still-causal", "train/_defaults.py",
      'causal = user_causal or (facts.per_step and user.get("data.normalize") != "example")',
      "causal = user_causal or facts.per_step", (DEFAULTS,),
      "per-step targets with the user's normalize = example are still made causal"),
    M("defaults-p-ignores-user-width", "train/_defaults.py",
      'choose("model.ssm_size", get("model.d_model", width), "P = H")',
      'choose("model.ssm_size", width, "P = H")', (DEFAULTS,),
      "P is the chosen width, not the user's d_model"),
    M("defaults-epochs-ignore-user-batch", "train/_defaults.py",
      'batch = int(get("data.batch_size", batch))', "batch = int(batch)", (DEFAULTS,),
      "the epochs are counted for the chosen batch, not the user's"),
    M("defaults-warmup-ignores-user-epochs", "train/_defaults.py",
      'epochs = int(get("train.epochs", epochs))', "epochs = int(epochs)", (DEFAULTS,),
      "the warm-up is 10 % of the chosen epochs, not of the user's"),
    M("defaults-select-at-50-val", "train/_defaults.py",
      "elif not facts.per_step and facts.n_val < VAL_SELECT_MIN:",
      "elif not facts.per_step and facts.n_val <= VAL_SELECT_MIN:", (DEFAULTS,),
      "exactly 50 val examples report the last epoch, not the best"),
    M("defaults-per-step-any-regression", "train/_defaults.py",
      'per_step = dataset.task == "regression" and np.asarray(train.y).ndim == 3',
      'per_step = dataset.task == "regression"', (DEFAULTS,),
      "per-sequence regression is read as per-step targets (a causal model)"),
    M("defaults-uncarve-at-50", "train/_defaults.py", "or facts.n_val >= VAL_SELECT_MIN",
      "or facts.n_val > VAL_SELECT_MIN", (DEFAULTS, UEA),
      "a carve of exactly 50 val examples is given up"),
    # --- ListOps generator and reader, overrides, schema, export, Pathfinder ---------------
    M("listops-args-beyond-max", "data/_listops.py", "k = 2 + u.below(max_args - 1)",
      "k = 2 + u.below(max_args)", (LRA_TEXT,),
      "an operator takes up to max_args + 1 arguments"),
    M("listops-depth-one-more", "data/_listops.py",
      "r = u.random() if depth < max_depth else 1.0",
      "r = u.random() if depth <= max_depth else 1.0", (LRA_TEXT,),
      "trees nest one level beyond max_depth"),
    M("listops-min-length-kept", "data/_listops.py", "if count[0] <= min_length:",
      "if count[0] < min_length:", (LRA_TEXT,), "a tree of exactly min_length tokens is kept"),
    M("listops-operator-never-sm", "data/_listops.py",
      "op = LISTOPS_OPERATORS[u.below(len(LISTOPS_OPERATORS))]",
      "op = LISTOPS_OPERATORS[u.below(len(LISTOPS_OPERATORS) - 1)]", (LRA_TEXT,),
      "the last operator (SM) is never drawn"),
    M("listops-label-ten-accepted", "data/_listops.py",
      "int(label) < LISTOPS_N_CLASSES):", "int(label) <= LISTOPS_N_CLASSES):", (LRA_TEXT,),
      "a label of 10 (out of the ten classes) is read"),
    M("listops-quotes-kept", "data/_listops.py", "yield _unquote(fields[0]), int(label)",
      "yield fields[0], int(label)", (LRA_TEXT,),
      "a quoted source field keeps its quotes (tokens '\"[MAX' and ']\"')"),
    M("listops-no-room-for-eos", "data/_listops.py",
      "tokens = listops_tokenize(text)[: l_max - 1]", "tokens = listops_tokenize(text)[:l_max]",
      (LRA_TEXT,), "truncation leaves no room for <eos>"),
    M("override-splits-at-last-equals", "config/_overrides.py",
      'key, sep, value = text.partition("=")', 'key, sep, value = text.rpartition("=")',
      ("tests/test_config.py",), "a value containing '=' is split at its last '='"),
    M("schema-equal-dt-rejected", "config/_schema.py", "self.dt_min <= self.dt_max,",
      "self.dt_min < self.dt_max,", ("tests/test_config.py",),
      "dt_min = dt_max (one fixed initial step) is refused"),
    M("schema-odd-block-without-conj-sym", "config/_schema.py",
      "not self.conj_sym or self.block_size % 2 == 0,", "self.block_size % 2 == 0,",
      ("tests/test_config.py",), "odd blocks are refused even without conjugate symmetry"),
    M("schema-zero-dt-min", "config/_schema.py",
      '_positive(self, "model", "n_layers", "d_model", "ssm_size", "blocks", "dt_min")',
      '_positive(self, "model", "n_layers", "d_model", "ssm_size", "blocks")',
      ("tests/test_config.py",), "model.dt_min = 0 (log of zero at init) is accepted"),
    M("schema-bn-momentum-unchecked", "config/_schema.py",
      '_unit_interval(self, "model", "dropout", "bn_momentum")',
      '_unit_interval(self, "model", "dropout")', ("tests/test_config.py",),
      "a BatchNorm momentum outside [0, 1] is accepted"),
    M("export-channel-std-ignored", "train/_predict.py",
      'std = jnp.asarray(info["std"], x.dtype)[None, :]', "std = jnp.ones_like(mean)",
      ("tests/test_export.py", DEFAULTS),
      "the exported forward centres channels but does not scale them"),
    M("export-padding-not-zeroed", "train/_predict.py",
      "return jnp.where(valid, out, 0.0).astype(x.dtype)", "return out.astype(x.dtype)",
      ("tests/test_export.py", DEFAULTS), "the exported forward feeds normalised padding"),
    M("pathfinder-ring-ignored", "data/_pathfinder_gen.py",
      "lo, hi = self.pad + params.padding + m - 1, self.pad + r - params.padding - m + 1",
      "lo, hi = self.pad + m - 1, self.pad + r - m + 1", ("tests/test_data_pathfinder_gen.py",),
      "paths may reach the padding ring at the border"),
    M("pathfinder-far-end-unmarked", "data/_pathfinder_gen.py",
      "stamp = geom.ext[i][int(k == p.contour_length - 1)]", "stamp = geom.ext[i][0]",
      ("tests/test_data_pathfinder_gen.py",), "a target path's far end carries no marker"),
    # --- Dense under bf16, retrieval pairs, sweeps, run info ---------------------------------
    M("dense-bf16-bias-dropped", "nn/_dense.py",
      "y = y + jnp.broadcast_to(self.bias, y.shape)", "y = y", (PRECISION,),
      "under bf16 the bias is never added (it starts at zero, so only a trained model shows it)"),
    M("dense-bf16-head-rounded", "nn/_dense.py",
      "return y if fp32_output else y.astype(jnp.bfloat16)", "return y.astype(jnp.bfloat16)",
      (PRECISION,), "a head's final layer rounds its float32 accumulator to bfloat16"),
    M("dense-init-glorot", "nn/_dense.py",
      "return jax.nn.initializers.lecun_normal()(key, (fan_in, fan_out), dtype)",
      "return jax.nn.initializers.glorot_normal()(key, (fan_in, fan_out), dtype)",
      ("tests/test_init.py", "tests/test_models.py"),
      "kernels start with variance 2 / (fan_in + fan_out), not flax's 1 / fan_in"),
    M("retrieval-second-length-is-first", "nn/_model.py",
      'o1 = pool(h[1], "masked_mean", lengths[1])', 'o1 = pool(h[1], "masked_mean", lengths[0])',
      ("tests/test_models.py",),
      "the second document is pooled over the first one's length"),
    M("retrieval-state-crosses-documents", "nn/_model.py",
      "h, state, key=key, inference=inference, step_rescale=step_rescale, segments=2",
      "h, state, key=key, inference=inference, step_rescale=step_rescale, segments=1",
      ("tests/test_models.py",),
      "the second document's scan starts from the first one's final state"),
    M("sweep-accuracy-lowest-wins", "train/_sweep.py", 'higher = select == "val_accuracy"',
      "higher = False", (SWEEP,), "the trial with the lowest val accuracy is selected"),
    M("sweep-failed-trial-ranked", "train/_sweep.py", '        if row["status"] == "done"\n',
      '        if row["status"] in ("done", "failed")\n', (SWEEP,),
      "a failed trial's partial best val can be selected"),
    M("sweep-nan-ranked", "train/_sweep.py", 'and math.isfinite(row["best_val"])', "and True",
      (SWEEP,), "a diverged trial (val NaN) takes part in the selection"),
    M("sweep-val-loss-highest", "train/_sweep.py", "return min(pairs) if pairs else (None, None)",
      "return max(pairs) if pairs else (None, None)", (SWEEP,),
      "select = val_loss reads each trial's highest val loss"),
    M("run-info-short-commit", "train/_run_info.py", '["git", "rev-parse", "HEAD"]',
      '["git", "rev-parse", "--short", "HEAD"]', ("tests/test_engine.py", RUN_DIRS),
      "run_info.json records an abbreviated commit"),
    # --- the command line's exits, resume line and option checks ---------------------------
    M("cli-resume-keeps-overwrite", "cli/__init__.py",
      'kept = [a for a in argv if a not in ("--overwrite", "--resume-or-start", "--resume")]',
      'kept = [a for a in argv if a not in ("--resume-or-start", "--resume")]', (RUN_DIRS,),
      "the printed resume command keeps --overwrite, which would start the run over"),
    M("cli-diverged-is-usage", "cli/__init__.py", "return EXIT_DIVERGED, str(e)",
      "return EXIT_USAGE, str(e)", (RUN_DIRS,), "a diverged run exits 2 (usage), not 3"),
    M("cli-listops-lengths-gap", "cli/__init__.py", "if hi - lo < 2:", "if hi - lo < 1:",
      ("tests/test_listops_cli.py",),
      "--max-length = --min-length + 1 (no length strictly between) is accepted"),
    M("cli-step-rescale-zero", "cli/__init__.py",
      "if not (math.isfinite(args.step_rescale) and args.step_rescale > 0):",
      "if not (math.isfinite(args.step_rescale) and args.step_rescale >= 0):",
      ("tests/test_effects.py", RUN_DIRS, "tests/test_option_coverage.py"),
      "s5jax eval --step-rescale 0 (every step of length zero) is accepted"),
    # --- heads ------------------------------------------------------------------------------
    M("heads-variance-unshifted", "nn/_heads.py",
      "return jnp.where(ell < 0, jnp.exp(jnp.minimum(ell, jnp.zeros_like(ell))), ell + 1)",
      "return jnp.where(ell < 0, jnp.exp(jnp.minimum(ell, jnp.zeros_like(ell))), ell)",
      ("tests/test_models.py",), "sigma^2 = l for l >= 0: zero at 0 and a jump of 1 there"),
    M("heads-retrieval-difference-reversed", "nn/_heads.py",
      "return jnp.concatenate([o0, o1, o0 - o1, o0 * o1])",
      "return jnp.concatenate([o0, o1, o1 - o0, o0 * o1])", ("tests/test_models.py",),
      "the retrieval features hold o1 - o0, not the authors' o0 - o1"),
    M("heads-gaussian-activation-ignored", "nn/_heads.py", "act = _HIDDEN[self.activation]",
      "act = jnp.tanh", ("tests/test_models.py", OPTIONS),
      "model.head_activation = 'relu' runs tanh"),
    M("heads-accuracy-argmin", "nn/_heads.py",
      "hits = jnp.argmax(log_probs, axis=-1) == labels.astype(jnp.int32)",
      "hits = jnp.argmin(log_probs, axis=-1) == labels.astype(jnp.int32)",
      ("tests/test_models.py", "tests/test_effects.py"), "accuracy counts the least likely class"),
    # --- UEA/UCR .ts: times and missing values ---------------------------------------------
    M("uea-interpolate-ignores-times", "data/_uea.py",
      "x_axis = np.arange(v.shape[1], dtype=np.float64) if t is None else t",
      "x_axis = np.arange(v.shape[1], dtype=np.float64)", (UEA,),
      "interpolation of timed series by index, not by time"),
    M("uea-times-not-from-zero", "data/_uea.py", "t[i, :m] = (ti[:m] - ti[0]) / time_unit",
      "t[i, :m] = ti[:m] / time_unit", (UEA,),
      "numeric times are not shifted to start at zero"),
    M("uea-all-missing-interpolated", "data/_uea.py", 'if how == "zero" or not seen.any():',
      'if how == "zero":', (UEA,), "a channel with no observed value is not zero-filled"),
    M("uea-repeated-times-accepted", "data/_uea.py",
      "if len(t) > 1 and not (np.diff(t) > 0).all():",
      "if len(t) > 1 and not (np.diff(t) >= 0).all():", (UEA,),
      "two values at the same time are accepted"),
    # --- the .npz reader's checks ------------------------------------------------------------
    M("npz-times-checked-in-padding", "data/_npz.py",
      "bad &= np.arange(1, L)[None, :] < lengths[:, None]",
      "bad &= np.arange(1, L)[None, :] <= lengths[:, None]", (NPZ,),
      "the first padding step's time must follow the last valid one's"),
    M("npz-zero-length-accepted", "data/_npz.py", "if lengths.min() < 1 or lengths.max() > L:",
      "if lengths.min() < 0 or lengths.max() > L:", (NPZ,), "a sequence of no valid step is read"),
    M("npz-bool-lengths-accepted", "data/_npz.py",
      'if not _is_int(lengths) or lengths.dtype.kind == "b":', "if not _is_int(lengths):",
      (NPZ,), "a boolean mask passed as lengths reads as lengths 0 and 1"),
    M("npz-duplicate-times-accepted", "data/_npz.py", "bad = dt <= 0", "bad = dt < 0", (NPZ,),
      "two observations at the same time are accepted (a zero step)"),
    M("npz-n-classes-true", "data/_npz.py",
      "if not _is_int(arr) or isinstance(value, bool) or value < 1:",
      "if not _is_int(arr) or value < 1:", (NPZ,), "n_classes = True reads as one class"),
    # --- plots and TensorBoard ----------------------------------------------------------------
    M("plot-log-scale-for-accuracy", "train/_plots.py",
      'return "accuracy" not in metric and finite.size > 0 and bool(np.all(finite > 0))',
      "return finite.size > 0 and bool(np.all(finite > 0))", (LOGGING, "tests/test_cli_plot.py"),
      "accuracy panels get a log axis"),
    M("plot-log-scale-with-zero", "train/_plots.py",
      'return "accuracy" not in metric and finite.size > 0 and bool(np.all(finite > 0))',
      'return "accuracy" not in metric and finite.size > 0 and bool(np.all(finite >= 0))',
      (LOGGING, "tests/test_cli_plot.py"), "a loss of exactly 0 is drawn on a log axis"),
    M("plot-bool-is-a-number", "train/_plots.py",
      "if isinstance(value, bool) or not isinstance(value, (int, float)):",
      "if not isinstance(value, (int, float)):", (LOGGING, "tests/test_cli_plot.py"),
      "a boolean record field is drawn as 0/1 points"),
    M("tensorboard-norm-real-part", "train/_tensorboard.py",
      'squares = p[f"{m}_re"] ** 2 + p[f"{m}_im"] ** 2', 'squares = p[f"{m}_re"] ** 2',
      (LOGGING,), "the B and C norms leave out the imaginary parts"),
    M("tensorboard-hparams-lists-dropped", "train/_tensorboard.py",
      "            out[name] = str(value)\n", "            continue\n", (LOGGING,),
      "list-valued settings are missing from HParams"),
    # --- run directories, checkpoints, normalisation -------------------------------------------
    M("rundir-lock-is-content", "train/_rundir.py",
      "return sorted(p.name for p in workdir.iterdir() if p.name != LOCK_NAME)",
      "return sorted(p.name for p in workdir.iterdir())", (RUN_DIRS,),
      "a folder holding only the lock file counts as an earlier run"),
    M("rundir-resume-of-nothing", "train/_rundir.py",
      'return "resume" if contents else "new"', 'return "resume"', (RUN_DIRS,),
      "--resume-or-start in an empty folder tries to resume"),
    M("checkpoint-extra-array-accepted", "train/_checkpoint.py", "    if extra:\n",
      "    if False:\n", ("tests/test_checkpoint.py",),
      "a checkpoint with arrays the model lacks restores without a word"),
    M("normalize-constant-channel", "data/_normalize.py",
      "out = (xd - mean) / np.where(std < EPS, 1.0, std)", "out = (xd - mean) / std",
      (DEFAULTS, NPZ), "a constant channel is divided by zero"),
    # --- Speech Commands and MNIST readers -----------------------------------------------------
    M("speech-8khz-odd-samples", "data/_speech.py",
      'splits[f"{split}_8khz"] = Split(x=x[:, ::2], y=labels)',
      'splits[f"{split}_8khz"] = Split(x=x[:, 1::2], y=labels)', (IMAGE_AUDIO,),
      "the 8 kHz splits keep the odd samples, not every second from the first"),
    M("speech-8khz-of-train", "data/_speech.py", 'if split != "train":', "if True:",
      (IMAGE_AUDIO,), "a train_8khz split is made too"),
    M("speech-reads-any-file", "data/_speech.py", 'if not name.endswith(".wav"):', "if False:",
      (IMAGE_AUDIO,), "a non-wav file in a word folder is read as a clip"),
    M("mnist-label-ten-accepted", "data/_mnist.py", "if labels.max() >= N_CLASSES:",
      "if labels.max() > N_CLASSES:", (IMAGE_AUDIO,), "an MNIST label of 10 is read"),
    M("mnist-header-size-unchecked", "data/_mnist.py",
      "if len(raw) - header != int(np.prod(shape)):", "if len(raw) - header < int(np.prod(shape)):",
      (IMAGE_AUDIO,), "trailing bytes after an IDX file's data are ignored"),
    # --- optimiser groups and batches ----------------------------------------------------------
    M("optim-nobc-c-regular", "train/_optim.py",
      '"noBCdecay": {"Lambda": "ssm", "log_step": "ssm", "B": "ssm", "C": "ssm", "D": "ssm"},',
      '"noBCdecay": {"Lambda": "ssm", "log_step": "ssm", "B": "ssm", "C": "regular", "D": "ssm"},',
      ("tests/test_optim.py",), "noBCdecay decays C at the global rate"),
    M("optim-bfast-b-slow", "train/_optim.py", '        "B": "regular",\n',
      '        "B": "ssm",\n', ("tests/test_optim.py",),
      "BfastandCdecay trains B at the SSM rate without decay"),
    M("optim-grad-clip-ignored", "train/_optim.py", "if optim_cfg.grad_clip is None:",
      "if True:", ("tests/test_optim.py", OPTIONS), "optim.grad_clip is never applied"),
    M("optim-unknown-role-ssm", "train/_optim.py",
      'return PARTITIONS[partition].get(role, "regular")',
      'return PARTITIONS[partition].get(role, "ssm")', ("tests/test_optim.py",),
      "encoder, norm and head parameters train at the SSM rate without decay"),
    M("batches-gather-sorted", "data/_batches.py", "out[order] = rows", "out[:] = rows", (NPZ,),
      "a shuffled batch comes back in index order, not the epoch's order"),
    M("batches-skip-to-end-refused", "data/_batches.py", "if skip > total:",
      "if skip >= total:", (NPZ,), "resuming at the end of an epoch (skip = all batches) fails"),
    M("batches-shard-pads-real", "data/_batches.py", "mask = np.arange(real + pad) < real",
      "mask = np.arange(real + pad) <= real",
      ("tests/test_multiprocess.py::test_the_rows_of_each_process_make_up_the_batches",),
      "a process's share of a padded batch counts one padding row as real"),
    # --- the pendulum generator's angles, targets and file check --------------------------
    M("pendulum-angle-not-centred", "data/_pendulum.py", "return theta - np.pi, omega",
      "return theta, omega", (PENDULUM,), "angles in [0, 2pi) instead of [-pi, pi)"),
    M("pendulum-targets-cos-sin", "data/_pendulum.py",
      "targets = np.stack([np.sin(theta), np.cos(theta)], axis=-1)",
      "targets = np.stack([np.cos(theta), np.sin(theta)], axis=-1)", (PENDULUM,),
      "targets stored as (cos, sin), not CRU's (sin, cos)"),
    M("pendulum-sum-check-skipped", "data/_pendulum.py",
      "if not np.isclose(total, ref, rtol=0, atol=1e-6):", "if False:", (PENDULUM,),
      "a pendulum file with other values than the generator's passes the check"),
    # --- text readers' shared helpers, AAN and IMDB ----------------------------------------------
    M("count-lines-drops-unterminated-last", "data/_vocab.py",
      'return n + (last != b"\\n")', "return n", (LRA_TEXT,),
      "a file whose last line has no newline is counted one line short"),
    M("lines-keep-carriage-return", "data/_vocab.py", 'yield lineno, line.rstrip("\\r\\n")',
      'yield lineno, line.rstrip("\\n")', (LRA_TEXT,),
      "CRLF files keep '\\r' at the end of each line's last field"),
    M("prepared-reused-for-other-options", "data/_vocab.py",
      "if any(stored.get(k) != v for k, v in provenance.items()):", "if False:",
      (LRA_TEXT, "tests/test_listops_cli.py"),
      "a cached dataset prepared with other options (l_max, min_freq) is reused"),
    M("aan-label-any-number", "data/_aan.py",
      "return int(value) if value in (0.0, 1.0) else None", "return int(value)", (LRA_TEXT,),
      "an AAN label of 2 (or 0.5, read as 0) is accepted"),
    M("imdb-order-by-rating", "data/_imdb.py",
      "return (0, int(match[1]), int(match[2])) if match else (1, 0, 0, path.name)",
      "return (0, int(match[2]), int(match[1])) if match else (1, 0, 0, path.name)", (LRA_TEXT,),
      "reviews ordered by rating, not by review id"),
    # --- config files and command-line values -----------------------------------------------
    M("config-description-not-inherited", "config/_load.py",
      'if "description" not in raw and "description" in parent:', "if False:",
      ("tests/test_config.py",), "a file with a base loses the base's description"),
    M("config-description-parent-wins", "config/_load.py",
      'if "description" not in raw and "description" in parent:',
      'if "description" in parent:', ("tests/test_config.py",),
      "the base's description replaces the file's own"),
    M("config-relative-base-from-cwd", "config/_load.py",
      "if relative_to is not None and not path.is_absolute():", "if False:",
      ("tests/test_config.py",), "a relative base is looked up from the working directory"),
    M("override-one-sided-quote-stripped", "config/_types.py",
      "if len(text) >= 2 and text[0] == text[-1] and text[0] in \"'\\\"\":",
      "if len(text) >= 2 and text[0] in \"'\\\"\":", ("tests/test_config.py",),
      "a value that only starts with a quote loses its first and last characters"),
    M("override-nan-float", "config/_types.py", "            if math.isfinite(value):\n",
      "            if True:\n", ("tests/test_config.py",),
      "--set optim.ssm_lr=nan is parsed (the schema's message, not the override's)"),
    # --- the step's gradient norm, the ensemble's mean, prepared caches ------------------------
    M("steps-grad-norm-per-leaf", "train/_steps.py",
      "grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in reversed(leaves)))",
      "grad_norm = sum(jnp.sqrt(jnp.sum(g**2)) for g in reversed(leaves))",
      ("tests/test_stored_gradients.py", LOGGING),
      "step/grad_norm is the sum of per-array norms, not the global norm"),
    M("ensemble-probabilities-unnormalised", "nn/_ensemble.py",
      "return jax.nn.logsumexp(outputs, axis=0) - math.log(outputs.shape[0])",
      "return jax.nn.logsumexp(outputs, axis=0)", ("tests/test_ensemble.py",),
      "the ensemble's probabilities sum to K"),
    M("prepared-damaged-cache-fatal", "train/_datasets.py",
      "                    pass  # damaged or half-written cache: prepare again below\n",
      "                    raise\n", ("tests/test_listops_cli.py", "tests/test_dataset_loading.py"),
      "a damaged prepared cache stops the run instead of being prepared again"),
    # --- the Pathfinder reader's metadata ---------------------------------------------------
    M("pathfinder-metadata-text-order", "data/_pathfinder.py",
      "return sorted(files, key=lambda path: int(path.stem))", "return sorted(files)",
      (IMAGE_AUDIO, "tests/test_data_pathfinder_gen.py"),
      "metadata files read in text order (10.npy before 2.npy), not by their integer stem"),
    M("pathfinder-label-any-digit", "data/_pathfinder.py",
      'if len(fields) < 4 or fields[3] not in ("0", "1"):', "if len(fields) < 4:",
      (IMAGE_AUDIO, "tests/test_data_pathfinder_gen.py"), "a metadata label of 2 is read"),
    # --- 2026-12-06, late: what replaced a user's files, resume, SIGTERM, data_spec.json ----
    M("resume-config-unchecked", "train/_engine.py", "check_same_config(workdir, config)",
      "None", (RUN_DIRS,), "--resume with another weight decay or seed trains on silently"),
    M("rundir-seed-may-change", "train/_rundir.py", '_FREE = ("train.epochs", ',
      '_FREE = ("train.epochs", "train.seed", ', (RUN_DIRS,),
      "a run resumed with another seed is taken as the same run"),
    M("export-overwrite-any-folder", "train/_predict.py",
      'if others or "spec.json" not in entries:', "if False:", ("tests/test_export.py",),
      "export --overwrite deletes a folder that is not an export"),
    M("predict-out-may-be-the-data", "train/_predict.py", "out.samefile(data)",
      "False and out.samefile(data)", ("tests/test_predict.py",),
      "predict --out DATA replaces the data with the predictions"),
    M("plot-out-inside-a-run", "train/_plots.py",
      "if d.is_dir() and out.parent.resolve() == d.resolve():", "if False:",
      ("tests/test_cli_plot.py",), "plot --out RUN/curves.png replaces the run's curves"),
    M("metrics-undecodable-unnamed", "train/_logging.py", "except UnicodeDecodeError:",
      "except KeyError:", ("tests/test_cli_plot.py",),
      "a metrics.jsonl overwritten by binary data is a bare decode error"),
    M("sigterm-not-caught", "cli/__init__.py", "previous = signal.signal(signal.SIGTERM, stop)",
      "previous = signal.getsignal(signal.SIGTERM)", (RUN_DIRS,),
      "SIGTERM kills a training with no message and no resume command"),
    M("signals-not-deferred", "_signals.py",
      "previous = {s: signal.signal(s, record) for s in _SIGNALS}",
      "previous = {s: signal.getsignal(s) for s in _SIGNALS}", ("tests/test_signals.py",),
      "Ctrl-C / SIGTERM interrupt a checkpoint save in the middle"),
    M("resume-command-always-resume", "cli/__init__.py",
      'kept.append("--resume" if resumable else "--resume-or-start")',
      'kept.append("--resume")', (RUN_DIRS,),
      "a run stopped before its first checkpoint is told to --resume (refused)"),
    M("data-spec-drops-normalisation", "train/_data_spec.py",
      'meta={**spec["meta"], SPEC_ONLY: True},', "meta={SPEC_ONLY: True},",
      ("tests/test_export.py", "tests/test_data_spec.py"),
      "an export from data_spec.json loses the inputs' normalisation"),
    M("defaults-batch-above-n", "train/_defaults.py", "if facts.n_train < batch:",
      "if False:", (DEFAULTS,), "7 training examples get a batch of 8 (refused by the trainer)"),
    M("npz-float-train-beside-int-labels", "data/_npz.py",
      'if _is_int(r.arrays[f"y_{s}"]):', "if False:", (NPZ,),
      "float y_train beside integer y_val trains a regression silently"),
    M("sweep-grid-repeats", "train/_sweep.py", "repeated = _repeated(grid[key])",
      "repeated = None", (SWEEP,), "--set k=a,b,a trains two identical trials"),
    M("sweep-nonempty-folder", "train/_sweep.py",
      "if not recorded.is_file() and sweepdir.is_dir() and any(sweepdir.iterdir()):",
      "if False:", (SWEEP,), "a sweep writes its summary.md over a user's"),
    M("listops-overwrite-release", "data/_listops.py",
      "if folder.exists() and read_generated(folder) is None:", "if False:",
      (LRA_TEXT, "tests/test_listops_cli.py"),
      "generate_listops(overwrite=True) replaces a listops-1000 it did not generate"),
    M("atomic-folder-target", "_atomic.py", "if final.is_dir():", "if False:",
      ("tests/test_atomic.py",), "a write onto a folder names the temporary file"),
    # --- 2026-12-06, night: other files under --out, flags, messages -----------------------
    M("predict-out-any-existing-file", "train/_predict.py",
      "if out.exists() and not _is_predictions(out):", "if False:", ("tests/test_predict.py",),
      "predict --out OTHER.npz replaces a user's data file of that name"),
    M("predictions-any-keys", "train/_predict.py",
      "return bool(names) and names <= PREDICTION_KEYS", "return bool(names)",
      ("tests/test_predict.py",),
      "any .npz counts as an earlier predictions file and is replaced"),
    M("plot-out-any-existing-png", "train/_plots.py",
      "if out.exists() and not written_by_s5jax(out):", "if False:", ("tests/test_cli_plot.py",),
      "plot --out IMAGE.png replaces a user's image"),
    M("plot-png-unmarked", "train/_plots.py",
      'metadata={"Software": PNG_SOFTWARE}', "metadata={}", ("tests/test_cli_plot.py",),
      "a plot lacks s5jax's mark, so plotting again to the same name is refused"),
    M("sweep-sample-above-grid", "train/_sweep.py", "if sample > points:", "if False:", (SWEEP,),
      "--sample 7 of a 6-point grid runs the whole grid without a word"),
    M("predict-width-after-normalisation", "train/_predict.py",
      "_check_inputs(np.asarray(raw.splits[split].x), expect, error)", "pass",
      ("tests/test_predict.py",),
      "predict --data DATASET of another width fails inside numpy's broadcasting"),
    M("data-root-file-accepted", "data/_common.py",
      "if root.exists() and not root.is_dir():", "if False:", ("tests/test_cli.py",),
      "$S5JAX_DATA naming a file fails after the dataset is built"),
    M("flags-only-before-command", "cli/__init__.py",
      "for command in _command_parsers(sub):", "for command in []:",
      ("tests/test_cli_conventions.py",), "s5jax train ... -q is a usage error"),
    M("set-float-nan-message", "config/_types.py",
      'raise ConfigError(f"{path}={text!r}: expected a finite number")', "pass",
      ("tests/test_config.py",), "--set optim.ssm_lr=nan says 'expected float'"),
    M("unknown-dataset-no-suggestion", "train/_datasets.py",
      "return did_you_mean(name, names, substrings=True)", 'return ""',
      ("tests/test_cli.py",), "data prepare mnist does not point at smnist"),
    M("quiet-train-still-chatty", "cli/__init__.py", "    if not quiet:", "    if True:",
      ("tests/test_cli_conventions.py",), "s5jax -q train prints every epoch line"),
    M("trainer-warning-past-logging", "train/_engine.py",
      '_log.warning(warning.removeprefix("warning: "))', "print(warning, file=out)",
      ("tests/test_engine.py", "tests/test_cli_conventions.py"),
      "a trainer warning bypasses logging (so -q cannot keep it apart from the messages)"),
    M("npz-label-wraps-in-int32", "data/_npz.py", "if y.max() > np.iinfo(np.int32).max:",
      "if False:", (NPZ,), "a label of 10**12 wraps around and reads as 'only 1 class'"),
    M("npz-unseen-class-silent", "data/_npz.py", "    if unseen:", "    if False:", (NPZ,),
      "a class only in y_test trains without a word"),
    M("plot-seeds-dir-not-expanded", "train/_plots.py",
      "return sorted(runs, key=_run_order) or [folder]", "return [folder]",
      ("tests/test_cli_plot.py",), "s5jax plot runs/x-seeds says metrics.jsonl not found"),
    M("npz-carve-not-stratified", "data/_npz.py", "np.asarray(train.y), task, val_fraction",
      'np.asarray(train.y), "regression", val_fraction', (NPZ,),
      "the carved val split of an own .npz misses small classes"),
    M("npz-carve-drops-lengths", "data/_npz.py",
      "Split(**{f: None if a is None else a[idx] for f, a in _fields(train).items()})",
      "Split(x=train.x[idx], y=train.y[idx])", (NPZ,),
      "carving an own .npz loses the lengths and times of its examples"),
    M("npz-carve-kept-when-small", "data/_npz.py", 'meta["val_carved"] = True', "pass",
      (DEFAULTS,), "a carve of 6 val examples is kept and selects the reported epoch"),
    M("usage-error-unknown-at-top", "cli/__init__.py",
      "_innermost(parser, args).error(", "parser.error(",
      ("tests/test_cli_conventions.py",), "`train --bogus` points at `s5jax --help`"),
    M("usage-error-no-suggestion", "cli/__init__.py", "if not action.choices or", "if True or",
      ("tests/test_cli_conventions.py",), "`s5jax trian` does not suggest train"),
    M("usage-error-prints-usage", "cli/__init__.py",
      'self.exit(EXIT_USAGE, f"{self.prog}: error:',
      'self.print_usage(sys.stderr); self.exit(EXIT_USAGE, f"{self.prog}: error:',
      ("tests/test_cli_conventions.py",), "usage lines printed before the one-line error"),
    M("listops-short-trees-silent", "cli/__init__.py", "elif args.l_max is None and hi < l_max:",
      "elif False:", ("tests/test_listops_cli.py",),
      "generated 10-40-token trees padded to 2048 without a word"),
    M("seq-len-error-names-config", "train/_datasets.py", 'f"--set data.seq_len={length}',
      'f"--set data.seq_len={data_cfg.seq_len}', ("tests/test_dataset_loading.py",),
      "the mismatch error suggests the value already set"),
    M("config-derived-unknown", "config/_dict.py", "    if key in DERIVED:", "    if False:",
      ("tests/test_config.py",), "`--set optim.lr=0.01` is only 'unknown key'"),
    M("config-wrong-section-no-hint", "config/_dict.py",
      "if other != section and name in field_hints(cls)]", "if False]",
      ("tests/test_config.py",), "`train.batch_size` does not point at data.batch_size"),
    M("not-npz-training-keys-for-predict", "train/_predict.py",
      'r = _Reader(path, "np.savez(path, x=...), or with',
      'r = _Reader(path) or ("np.savez(path, x=...), or with',
      ("tests/test_predict.py",), "predict's not-an-npz error shows the training keys"),
    M("defaults-time-unit-ignored", "train/_defaults.py",
      "dt_min, dt_max = dt_min / step, dt_max / step", "dt_min, dt_max = dt_min, dt_max",
      (DEFAULTS,), "times in hours start from timescales 3,600 times those in seconds"),
    M("defaults-time-step-counts-padding", "train/_defaults.py",
      "steps = np.diff(t, axis=1)[valid]", "steps = np.diff(t, axis=1).ravel()",
      (DEFAULTS,), "the padding's times count in the median time step"),
)  # fmt: skip


def _copy_tree(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dest / name)


def _status(mutation: Mutation) -> str | None:
    """`None` when the fragment is in its file exactly once, else why it is stale."""
    path = ROOT / "src" / "s5jax" / mutation.file
    if not path.is_file():
        return f"stale: {mutation.file} does not exist"
    count = path.read_text().count(mutation.original)
    return None if count == 1 else f"stale: fragment found {count} times"


def run_one(mutation: Mutation, *, workers: int, timeout: float) -> dict:
    """Apply `mutation` to a fresh copy and run its tests; return the record."""
    record = {**asdict(mutation), "tests": list(mutation.tests)}
    stale = _status(mutation)
    if stale is not None:
        return {**record, "result": "stale", "detail": stale, "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="s5jax-mutant-") as tmp:
        tmp = Path(tmp)
        _copy_tree(tmp)
        target = tmp / "src" / "s5jax" / mutation.file
        target.write_text(target.read_text().replace(mutation.original, mutation.replacement))
        env = {**os.environ, "PYTHONPATH": str(tmp / "src")}
        if mutation.file.endswith(".cc"):
            # The mutant's native library builds into the copy, and goes with it; the shared
            # cache (~/.cache/s5jax) keeps only the builds of real sources.
            env["S5JAX_CACHE_DIR"] = str(tmp / "native-cache")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        cmd += ["-n", str(workers)] if workers > 0 else []
        cmd += list(mutation.tests)
        start = time.perf_counter()
        # Its own process group, so that a timeout or Ctrl-C also ends the xdist workers.
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=timeout)
            rc, tail = proc.returncode, output.strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            rc, tail = None, ["timed out"]
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        seconds = time.perf_counter() - start
    # With -x under xdist a failure ends the session as interrupted (exit status 2), so a run
    # that reports failed tests is caught whatever its status; collection or usage errors
    # and timeouts say nothing either way.
    if rc == 0:
        result = "survived"
    elif rc in (1, 2) and re.search(r"\b\d+ failed\b", " ".join(tail)):
        result = "caught"
    else:
        result = "error"
    return {**record, "result": result, "detail": " ".join(tail), "seconds": round(seconds, 1)}


def _check_isolation() -> None:
    """The copy's `src` must shadow the editable install, or every mutation would survive."""
    with tempfile.TemporaryDirectory(prefix="s5jax-mutant-") as tmp:
        shutil.copytree(ROOT / "src", Path(tmp) / "src")
        env = {**os.environ, "PYTHONPATH": str(Path(tmp) / "src")}
        out = subprocess.run(
            [sys.executable, "-c", "import s5jax; print(s5jax.__file__)"],
            env=env, capture_output=True, text=True, check=True, cwd=tmp,
        ).stdout.strip()  # fmt: skip
        if not out.startswith(str(tmp)):
            raise SystemExit(f"PYTHONPATH does not shadow the installed s5jax ({out})")


def _table(records: list[dict]) -> str:
    width = max(len(r["name"]) for r in records)
    lines = [f"{'mutation':<{width}}  {'result':<8}  {'s':>6}  tests"]
    for r in records:
        tests = ", ".join(t.replace("tests/", "") for t in r["tests"])
        lines.append(f"{r['name']:<{width}}  {r['result']:<8}  {r['seconds']:>6}  {tests}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--limit", type=int, help="run the first N (after --only)")
    parser.add_argument("--repeat", type=int, default=1, help="run each N times (flaky tests)")
    parser.add_argument("--workers", type=int, default=2, help="pytest -n (0: no xdist)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the file's records of the mutations not run now (default: the file holds "
        "this run only)",
    )
    args = parser.parse_args(argv)

    chosen = list(MUTATIONS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {m.name for m in MUTATIONS})
        if unknown:
            parser.error(f"unknown mutations: {', '.join(unknown)}")
        chosen = [m for m in MUTATIONS if m.name in names]
    if args.limit is not None:
        chosen = chosen[: args.limit]
    if args.list:
        for m in chosen:
            print(f"{m.name:<28} {m.file:<22} {m.why}")
        return 0

    _check_isolation()
    command = " ".join(["scripts/mutation_probe.py", *(sys.argv[1:] if argv is None else argv)])
    records: list[dict] = []
    for mutation in chosen:
        for _ in range(args.repeat):
            record = run_one(mutation, workers=args.workers, timeout=args.timeout)
            records.append(record)
            print(f"{record['name']}: {record['result']} ({record['seconds']} s)", flush=True)
            _write(args.out, command, records, merge=args.merge)  # an interrupted probe keeps it
    in_file = _write(args.out, command, records, merge=args.merge)
    print(_table(records))
    ran = [r for r in records if r["result"] in ("caught", "survived")]
    caught = sum(r["result"] == "caught" for r in ran)
    print(f"score: {caught}/{len(ran)} caught ({100 * caught / max(len(ran), 1):.0f} %)", end="")
    others = [r for r in records if r["result"] not in ("caught", "survived")]
    print(f"; {len(others)} stale or errored" if others else "", end="")
    print(f"; {args.out} now: {in_file[0]}/{in_file[1]} caught" if args.merge else "")
    return 0


def _write(path: Path, command: str, records: list[dict], merge: bool = False) -> tuple[int, int]:
    """Write the results so far to `path`; return (caught, caught + survived).

    With `merge`, the records already in `path` stay, in their order, except those of the
    mutations in `records`, which replace them (new ones go last; one record per mutation, the
    last run's), and so do the file's other keys; the summary and the command (`--only` with
    every name) then describe the merged file."""
    extra: dict = {}
    if merge and path.is_file():
        old = json.loads(path.read_text())
        fresh = {r["name"]: r for r in records}
        records = [fresh.pop(r["name"], r) for r in old["records"]] + list(fresh.values())
        command = "scripts/mutation_probe.py --only " + ",".join(r["name"] for r in records)
        # notes kept beside the records (e.g. which mutations survived before a new test)
        extra = {k: v for k, v in old.items() if k not in ("command", "caught", "ran", "score")}
    ran = [r for r in records if r["result"] in ("caught", "survived")]
    caught = sum(r["result"] == "caught" for r in ran)
    score = caught / len(ran) if ran else 0.0
    summary = {"command": command, "caught": caught, "ran": len(ran), "score": score}
    path.write_text(json.dumps({**summary, **extra, "records": records}, indent=2) + "\n")
    return caught, len(ran)


if __name__ == "__main__":
    raise SystemExit(main())
