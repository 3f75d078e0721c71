# ruff: noqa: E501  (the mapping names tests by their full, greppable names)
"""Every config field and every CLI option has a test that observes its effect (issue 17, item 7).

`OBSERVED` maps each option to the test that sees it change an output or a behaviour (not just
parse). The audit walks the config dataclasses and the `s5jax` argument parser, so a new option
without an entry fails `test_every_option_is_mapped_to_an_observing_test`, and an entry naming a
test that no longer exists fails too. `UNOBSERVED` lists, with the reason, the options that no
test observes yet (or that nothing reads): a visible gap list, not a silent one. The tests at
the end of this file observe options that no other test did.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.cli import _parser, main
from s5jax.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    PaperResult,
    TrainConfig,
    apply_overrides,
    load_experiment,
)

TESTS = Path(__file__).parent
HERE = "tests/test_option_coverage.py"

OBSERVED = {
    # --- model
    "model.n_layers": f"{HERE}::test_model_option_changes_the_model",
    "model.d_model": f"{HERE}::test_model_option_changes_the_model",
    "model.ssm_size": f"{HERE}::test_model_option_changes_the_model",
    "model.blocks": f"{HERE}::test_model_option_changes_the_model",
    "model.conj_sym": f"{HERE}::test_model_option_changes_the_model",
    "model.bidirectional": f"{HERE}::test_model_option_changes_the_model",
    "model.causal": "tests/test_defaults.py::test_user_causal_forces_unidirectional_and_refuses_example",
    "model.mask_padding": "tests/test_mask_padding.py::test_training_ignores_the_padding",
    "model.discretization": f"{HERE}::test_model_option_changes_the_model",
    "model.c_init": f"{HERE}::test_model_option_changes_the_model",
    "model.lambda_init": f"{HERE}::test_model_option_changes_the_model",
    "model.parameterization": "tests/test_models.py::test_every_experiment_builds_with_the_closed_form_parameter_count",
    "model.dt_min": f"{HERE}::test_model_option_changes_the_model",
    "model.dt_max": f"{HERE}::test_model_option_changes_the_model",
    "model.scalar_dt": f"{HERE}::test_model_option_changes_the_model",
    "model.clip_eigs": "tests/test_ssm.py::test_layer_matches_the_reference_semantics_on_48_option_combinations",
    "model.norm": f"{HERE}::test_model_option_changes_the_model",
    "model.prenorm": f"{HERE}::test_model_option_changes_the_model",
    "model.activation": f"{HERE}::test_model_option_changes_the_model",
    "model.gelu_approximate": "tests/test_models.py::test_exact_gelu_is_selectable",
    "model.dropout": f"{HERE}::test_model_option_changes_the_model",
    "model.bn_momentum": f"{HERE}::test_model_option_changes_the_model",
    "model.encoder": "tests/test_models.py::test_every_experiment_builds_with_the_closed_form_parameter_count",
    "model.pooling": f"{HERE}::test_model_option_changes_the_model",
    "model.head": f"{HERE}::test_model_option_changes_the_model",
    "model.head_activation": "tests/test_models.py::test_gaussian_head_hidden_activation",
    "model.timestep_mode": "tests/test_models.py::test_pendulum_timestep_modes",
    "model.remat": "tests/test_remat.py::test_remat_keeps_loss_gradients_and_batchnorm_state",
    "model.scan_method": "tests/test_models.py::test_config_scan_method_reaches_every_layer_with_the_same_outputs",
    "model.precision": "tests/test_precision.py::test_bf16_outputs_and_gradients_stay_close_to_fp32",
    "model.max_vocab_size": "tests/test_run_dirs.py::test_own_data_out_of_bounds_is_refused_before_the_workdir_exists",
    "model.max_classes": "tests/test_run_dirs.py::test_own_data_out_of_bounds_is_refused_before_the_workdir_exists",
    "model.members": "tests/test_ensemble.py::test_an_ensemble_predicts_the_mean_probability_of_its_members",
    # --- optim
    "optim.ssm_lr": "tests/test_optim.py::test_group_schedules_use_each_groups_base",
    "optim.lr_factor": "tests/test_optim.py::test_group_schedules_use_each_groups_base",
    "optim.weight_decay": "tests/test_effects.py::test_dt_global_puts_log_step_under_the_global_rate_with_weight_decay",
    "optim.partition": "tests/test_optim.py::test_groups_per_partition",
    "optim.dt_global": "tests/test_effects.py::test_dt_global_puts_log_step_under_the_global_rate_with_weight_decay",
    "optim.schedule": "tests/test_optim.py::test_schedule_reaches_the_optimiser",
    "optim.warmup_epochs": "tests/test_optim.py::test_group_schedules_use_each_groups_base",
    "optim.lr_min": "tests/test_optim.py::test_schedule_scale_floors_at_lr_min",
    "optim.reduce_on_plateau": "tests/test_effects.py::test_reduce_on_plateau_lowers_the_rate_after_patience_epochs",
    "optim.plateau_patience": "tests/test_effects.py::test_reduce_on_plateau_lowers_the_rate_after_patience_epochs",
    "optim.plateau_factor": "tests/test_effects.py::test_reduce_on_plateau_lowers_the_rate_after_patience_epochs",
    "optim.grad_clip": "tests/test_optim.py::test_gradient_clipping",
    "optim.faithful_schedule": "tests/test_optim.py::test_schedule_reaches_the_optimiser",
    "optim.adam_b1": f"{HERE}::test_adam_betas_change_the_second_update",
    "optim.adam_b2": f"{HERE}::test_adam_betas_change_the_second_update",
    "optim.adam_eps": "tests/test_optim.py::test_gradient_clipping",
    # --- data
    "data.dataset": "tests/test_effects.py::test_eval_split_option_evaluates_that_split",
    "data.batch_size": "tests/test_engine.py::test_batch_larger_than_the_data_is_a_clear_error",
    "data.eval_batch_size": "tests/test_paper_configs.py::test_paper_experiment_trains_on_data_read_from_its_real_format",
    "data.seq_len": "tests/test_dataset_loading.py::test_seq_len_is_checked",
    "data.root": "tests/test_dataset_loading.py::test_training_finds_data_prepared_from_another_folder",
    "data.n_train": "tests/test_dataset_loading.py::test_n_train_and_n_eval_keep_the_first_examples",
    "data.n_eval": "tests/test_dataset_loading.py::test_n_train_and_n_eval_keep_the_first_examples",
    "data.zero_shot_8khz": "tests/test_effects.py::test_zero_shot_8khz_splits_are_evaluated_at_step_rescale_2",
    "data.normalize": "tests/test_defaults.py::test_train_eval_predict_export_use_one_normalisation",
    "data.normalize_targets": "tests/test_target_scaling.py::test_an_affine_change_of_the_targets_changes_only_the_units",
    "data.missing": "tests/test_data_uea.py::test_load_dataset_and_user_data_config_read_ts_with_the_data_settings",
    "data.val_fraction": "tests/test_data_uea.py::test_load_dataset_and_user_data_config_read_ts_with_the_data_settings",
    "data.val_seed": "tests/test_data_uea.py::test_load_dataset_and_user_data_config_read_ts_with_the_data_settings",
    # --- train
    "train.epochs": "tests/test_cli.py::test_train_then_eval_the_synthetic_experiment",
    "train.seed": "tests/test_engine.py::test_same_seed_same_losses",
    "train.early_stop_patience": "tests/test_effects.py::test_early_stopping_stops_after_patience_epochs_without_improvement",
    "train.save_best": f"{HERE}::test_save_best_and_save_last_choose_the_checkpoints",
    "train.save_last": f"{HERE}::test_save_best_and_save_last_choose_the_checkpoints",
    "train.log_every": "tests/test_engine.py::test_nan_loss_found_at_a_fetch_names_its_step_and_the_fetched_range",
    "train.test_every_epoch": "tests/test_engine.py::test_test_split_is_evaluated_when_val_improves_unless_asked_every_epoch",
    "train.best_ties": "tests/test_engine.py::test_best_ties_choose_the_earliest_or_the_lower_loss_epoch",
    "train.select": "tests/test_engine.py::test_select_last_reports_the_model_where_training_ends",
    # --- top level and the paper's figure (value, unit and metric: the curves' reference line)
    "name": "tests/test_cli.py::test_train_on_user_npz",
    "paper.metric": f"{HERE}::test_paper_figure_is_the_curves_reference_in_raw_units",
    "paper.value": f"{HERE}::test_paper_figure_is_the_curves_reference_in_raw_units",
    "paper.unit": f"{HERE}::test_paper_figure_is_the_curves_reference_in_raw_units",
    # --- CLI
    "s5jax --version": "tests/test_cli_conventions.py::test_version_is_the_package_metadata",
    "s5jax --quiet": "tests/test_cli_conventions.py::test_quiet_silences_info_and_verbose_shows_debug",
    "s5jax --verbose": "tests/test_cli_conventions.py::test_quiet_silences_info_and_verbose_shows_debug",
    "s5jax --debug": "tests/test_run_dirs.py::test_debug_prints_the_traceback",
    "s5jax train --data": "tests/test_cli.py::test_train_on_user_npz",
    "s5jax train --set": "tests/test_cli.py::test_quick_runs_a_tenth_of_the_epochs",
    "s5jax train --workdir": "tests/test_cli.py::test_train_then_eval_the_synthetic_experiment",
    "s5jax train --resume": "tests/test_run_dirs.py::test_resume_with_a_changed_config_leaves_config_json_untouched",
    "s5jax train --resume-or-start": "tests/test_run_dirs.py::test_resume_or_start_continues_a_killed_run",
    "s5jax train --overwrite": "tests/test_run_dirs.py::test_overwrite_replaces_the_run_without_mixing",
    "s5jax train --quick": "tests/test_cli.py::test_quick_runs_a_tenth_of_the_epochs",
    "s5jax train --cpu-devices": "tests/test_cli.py::test_cpu_devices_warns_when_jax_has_already_started",
    "s5jax train --multihost": f"{HERE}::test_multihost_initialises_jax_distributed_first",
    "s5jax train --coordinator": "tests/test_multiprocess.py::test_two_processes_train_resume_and_read_half_of_each_batch_like_two_devices",
    "s5jax train --num-processes": "tests/test_multiprocess.py::test_two_processes_train_resume_and_read_half_of_each_batch_like_two_devices",
    "s5jax train --process-id": "tests/test_multiprocess.py::test_two_processes_train_resume_and_read_half_of_each_batch_like_two_devices",
    "s5jax train --coordinator-timeout": "tests/test_multiprocess.py::test_a_process_that_cannot_reach_the_coordinator_stops_within_the_timeout",
    "s5jax eval --split": "tests/test_effects.py::test_eval_split_option_evaluates_that_split",
    "s5jax eval --step-rescale": "tests/test_effects.py::test_step_rescale_reaches_the_model_in_evaluate_run_and_eval",
    "s5jax eval --checkpoint": "tests/test_effects.py::test_eval_checkpoint_option_picks_best_or_latest",
    "s5jax predict --data": "tests/test_predict.py::test_classification_predictions_and_metric_equal_eval",
    "s5jax predict --out": "tests/test_predict.py::test_classification_predictions_and_metric_equal_eval",
    "s5jax predict --stream": "tests/test_predict.py::test_streamed_predictions_equal_offline",
    "s5jax export --out": "tests/test_export.py::test_bidirectional_model_exports_only_the_forward",
    "s5jax export --overwrite": "tests/test_export.py::test_bidirectional_model_exports_only_the_forward",
    "s5jax plot --out": "tests/test_cli_plot.py::test_plot_writes_a_png_of_several_runs",
    "s5jax plot --metric": "tests/test_cli_plot.py::test_plot_writes_a_png_of_several_runs",
    "s5jax config --set": "tests/test_cli_conventions.py::test_config_command_prints_toml_that_loads_back",
    "s5jax config --data": "tests/test_data_uea.py::test_config_data_prints_the_config_train_data_trains",
    "s5jax data prepare --source": "tests/test_listops_cli.py::test_l_max_reads_an_existing_copy",
    "s5jax data prepare --generate": "tests/test_data_pathfinder_gen.py::test_cli_generates_and_prepares",
    "s5jax data prepare --count": "tests/test_data_pathfinder_gen.py::test_cli_generates_and_prepares",
    "s5jax data prepare --l-max": "tests/test_listops_cli.py::test_l_max_shorter_than_the_trees_truncates_with_a_note",
    "s5jax data prepare --min-length": "tests/test_listops_cli.py::test_listops_option_errors",
    "s5jax data prepare --max-length": "tests/test_listops_cli.py::test_listops_option_errors",
    "s5jax data prepare --n-train": "tests/test_listops_cli.py::test_data_root_is_prepared_at_data_seq_len",
    "s5jax data prepare --n-val": "tests/test_listops_cli.py::test_generate_short_listops_at_a_matching_length",
    "s5jax data prepare --n-test": "tests/test_listops_cli.py::test_generate_short_listops_at_a_matching_length",
    "s5jax train --no-progress": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax predict --no-progress": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax predict --split": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax predict --checkpoint": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax predict --batch-size": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax export --checkpoint": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax export --length": f"{HERE}::test_flag_reaches_the_function_that_implements_it",
    "s5jax data prepare --seed": f"{HERE}::test_prepare_seed_changes_the_generated_data",
    "s5jax train --seeds": "tests/test_sweep.py::test_seeds_summary_rerun_and_interrupted_seed",
    "s5jax sweep --data": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --set": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --sample": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --seed": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --metric": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --workdir": "tests/test_sweep.py::test_sweep_selects_by_val_and_reports_only_its_test",
    "s5jax sweep --devices": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax sweep --no-progress": "tests/test_sweep.py::test_sweep_flags_reach_the_space_and_the_runner",
    "s5jax data prepare --missing": "tests/test_data_uea.py::test_prepare_uea_writes_npz_that_load_user_npz_reads_the_same",
}
# `s5jax <command> --debug` / `-q` / `-v` (the global flags repeated after each command) are
# one loop in `_parser`.
_COMMANDS = ("train", "eval", "predict", "export", "plot", "list", "config", "data",
             "data prepare", "sweep")  # fmt: skip
for _command in _COMMANDS:
    OBSERVED[f"s5jax {_command} --debug"] = (
        f"{HERE}::test_debug_after_the_command_prints_the_traceback"
    )
    for _flag in ("--quiet", "--verbose"):
        OBSERVED[f"s5jax {_command} {_flag}"] = (
            "tests/test_cli_conventions.py::test_global_flags_are_accepted_after_every_command"
        )

UNOBSERVED = {
    # Records of the published figure: data, read by no code (only written back by dump/TOML).
    # tests/test_config.py::test_published_figures checks their values, not an effect.
    "description": "free text; only written back by `s5jax config` and config.json",
    "paper.std": "record of the paper's figure; read by no code",
    "paper.seeds": "record of the paper's figure; read by no code",
    "paper.source": "record of the paper's figure; read by no code",
    "paper.notes": "record of the paper's figure; read by no code",
    "paper.extra": "record of the paper's other figures; read by no code",
    "paper.table11": "record of Table 11 cells that differ; read by no code",
    "paper.higher_is_better": "read by no code: the trainer derives the direction from its metric "
    "(`_engine._Run.higher_is_better = metric == 'accuracy'`)",
}


def _config_keys() -> list[str]:
    keys = ["name", "description"]
    for section, cls in (
        ("model", ModelConfig),
        ("optim", OptimConfig),
        ("data", DataConfig),
        ("train", TrainConfig),
        ("paper", PaperResult),
    ):
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


def _cli_options(parser: argparse.ArgumentParser, prefix: str = "s5jax") -> list[str]:
    """Every optional argument as 's5jax <command...> --longest-flag' (positionals excluded)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _cli_options(sub, f"{prefix} {name}")
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            out.append(f"{prefix} {max(action.option_strings, key=len)}")
    return out


def _all_options() -> list[str]:
    return _config_keys() + _cli_options(_parser())


def test_every_option_is_mapped_to_an_observing_test():
    options = _all_options()
    assert len(options) == len(set(options))
    missing = [o for o in options if o not in OBSERVED and o not in UNOBSERVED]
    assert not missing, f"options without an observing test (add one to OBSERVED): {missing}"
    stale = sorted((set(OBSERVED) | set(UNOBSERVED)) - set(options))
    assert not stale, f"entries for options that no longer exist: {stale}"
    assert not set(OBSERVED) & set(UNOBSERVED)


@pytest.mark.parametrize("option", sorted(OBSERVED))
def test_the_observing_test_exists(option):
    path, _, name = OBSERVED[option].partition("::")
    file = TESTS.parent / path
    assert file.is_file(), f"{option}: {path} does not exist"
    assert re.search(rf"^\s*def {name}\(", file.read_text(), re.M), f"{option}: no {name} in {path}"


# --- observing tests for options that no other test observed ------------------------------------

_TINY = dict(n_layers=1, d_model=8, ssm_size=8, blocks=2, dropout=0.0, bn_momentum=0.9)
_VARIANTS = [
    ("n_layers", 2),
    ("d_model", 12),
    ("ssm_size", 16),
    ("blocks", 1),
    ("conj_sym", False),
    ("bidirectional", True),
    ("discretization", "bilinear"),
    ("c_init", "lecun_normal"),
    ("lambda_init", "s4d_lin"),
    ("dt_min", 0.05),
    ("dt_max", 0.01),
    ("scalar_dt", True),
    ("norm", "layer"),
    ("prenorm", False),
    ("activation", "gelu"),
    ("dropout", 0.5),
    ("bn_momentum", 0.5),
    ("pooling", "last"),
    ("head", "regression"),
]


def _outputs_and_state(cfg: ModelConfig):
    from s5jax.nn import build_model

    model, state = build_model(cfg, d_input=3, n_outputs=4, key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 6, 3))
    keys = jax.random.split(jax.random.PRNGKey(2), 3)

    def one(x, key):
        return model(x, state, key=key, inference=False)

    out, new_state = jax.vmap(one, axis_name="batch", in_axes=(0, 0), out_axes=(0, None))(x, keys)
    leaves = jax.tree.leaves(eqx.filter(new_state, eqx.is_array))
    return np.asarray(out), [np.asarray(leaf) for leaf in leaves]


@pytest.mark.parametrize(("field", "value"), _VARIANTS, ids=[f for f, _ in _VARIANTS])
def test_model_option_changes_the_model(field, value):
    """One training-mode forward (outputs and BatchNorm running statistics) of a tiny model
    changes when the option changes (same keys, same inputs)."""
    base = dict(_TINY)
    if field == "dt_max":
        base["dt_min"] = 0.001
    out0, state0 = _outputs_and_state(ModelConfig(**base))
    out1, state1 = _outputs_and_state(ModelConfig(**{**base, field: value}))
    same_out = out0.shape == out1.shape and np.allclose(out0, out1, atol=1e-6)
    same_state = len(state0) == len(state1) and all(
        a.shape == b.shape and np.allclose(a, b, atol=1e-7) for a, b in zip(state0, state1)
    )
    if field == "bn_momentum":  # only the running statistics see the momentum
        assert same_out and not same_state
    else:
        assert not same_out, f"model.{field} = {value!r} left the outputs unchanged"


def test_adam_betas_change_the_second_update():
    """Adam's first update does not depend on β1, β2 (bias correction); the second does."""
    from s5jax.nn import build_model
    from s5jax.train import build_optimizer

    model, _ = build_model(ModelConfig(**_TINY), d_input=3, n_outputs=4, key=jax.random.PRNGKey(0))
    params = eqx.filter(model, eqx.is_inexact_array)

    def second_update(**adam):
        cfg = OptimConfig(schedule="constant", warmup_epochs=0, weight_decay=0.0, **adam)
        opt, _ = build_optimizer(cfg, model, steps_per_epoch=10, epochs=1)
        state = opt.init(params)
        for scale in (1.0, -0.3):
            grads = jax.tree.map(lambda p, s=scale: jnp.full_like(p, s), params)
            updates, state = opt.update(grads, state, params)
        return np.concatenate([np.ravel(u) for u in jax.tree.leaves(updates)])

    default = second_update()
    assert not np.allclose(second_update(adam_b1=0.5), default)
    assert not np.allclose(second_update(adam_b2=0.5), default)


def test_save_best_and_save_last_choose_the_checkpoints(tmp_path):
    from s5jax.train._engine import train_and_evaluate

    base = ["train.epochs=1", "data.seq_len=8", "data.n_train=8", "data.n_eval=8"]
    base += ["model.n_layers=1", "model.d_model=8"]
    for best, last in ((False, True), (True, False)):
        cfg = apply_overrides(
            load_experiment("synthetic"),
            [*base, f"train.save_best={str(best).lower()}", f"train.save_last={str(last).lower()}"],
        )
        run = tmp_path / f"{best}-{last}"
        train_and_evaluate(cfg, run, progress=False, stream=io.StringIO())
        kept = {p.name for p in (run / "checkpoints").iterdir() if any(p.iterdir())}
        assert kept == {name for name, on in (("best", best), ("latest", last)) if on}


def test_multihost_initialises_jax_distributed_first(tmp_path, monkeypatch, capsys):
    import s5jax.train

    called = []

    def fake(*args, **kwargs):
        called.append(True)
        raise RuntimeError("jax.distributed.initialize was called")

    monkeypatch.setattr(s5jax.train, "initialize_multihost", fake)
    argv = ["train", "synthetic", "--workdir", str(tmp_path / "run"), "--no-progress"]
    assert main([*argv, "--multihost"]) != 0
    assert called and "jax.distributed.initialize was called" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "no-such-experiment"],
        ["eval", "{tmp}/none"],
        ["predict", "{tmp}/none", "--out", "{tmp}/p.npz"],
        ["export", "{tmp}/none", "--out", "{tmp}/e"],
        ["plot", "{tmp}/none", "--out", "{tmp}/p.png"],
        ["train", "no-such-experiment"],
        ["data", "prepare", "no-such-dataset"],
        ["sweep", "{tmp}/none.toml"],
    ],
    ids=lambda argv: argv[0],
)
def test_debug_after_the_command_prints_the_traceback(tmp_path, capsys, argv):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv) != 0
    assert "Traceback" not in capsys.readouterr().err
    debug = [argv[0], "--debug", *argv[1:]]
    assert main(debug) != 0
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    # `list` takes it too (it has no error to show here): it parses to the same flag.
    assert _parser().parse_args(["list", "--debug"]).debug


def test_paper_figure_is_the_curves_reference_in_raw_units():
    """`paper.metric`, `value` and `unit` give the dashed reference line of curves.png."""
    from s5jax.train._engine import _in_paper_units
    from s5jax.train._plots import paper_reference

    figure = PaperResult(metric="test_mse", value=3.0, unit="1e-3", higher_is_better=False)
    assert paper_reference(figure) == ("test_mse", pytest.approx(0.003))
    assert paper_reference(dataclasses.replace(figure, unit="1")) == ("test_mse", 3.0)
    assert paper_reference(dataclasses.replace(figure, value=4.0))[1] == pytest.approx(0.004)
    assert paper_reference(dataclasses.replace(figure, metric="test_loss"))[0] == "test_loss"
    assert paper_reference(dataclasses.replace(figure, value=None)) is None
    assert _in_paper_units(0.003, figure) == pytest.approx(3.0)  # results.json's table


def _recorded_call(monkeypatch, function: str, argv: list[str]) -> dict:
    """Run `s5jax ARGV` with `s5jax.train.<function>` replaced; return its keyword arguments."""
    import s5jax.train

    calls = []

    def record(*args, **kwargs):
        calls.append(kwargs)
        return {"epochs_run": 1, "n": 0, "out": "x"}

    monkeypatch.setattr(s5jax.train, function, record)
    assert main(argv) == 0
    (kwargs,) = calls
    return kwargs


# Wiring: each flag changes the argument of the function that implements it; the function's
# own effect is observed by tests/test_train_logging.py::test_training_progress_on_a_terminal
# (progress), tests/test_export.py::test_per_step_gaussian_forward_and_step_equal_the_live_model
# (length), tests/test_effects.py::test_eval_checkpoint_option_picks_best_or_latest (which) and
# tests/test_effects.py::test_eval_split_option_evaluates_that_split (split).
_WIRING = [
    ("train_and_evaluate", ["train", "synthetic"], ["--no-progress"], "progress", True, False),
    ("predict_run", ["predict", "r", "--out", "p.npz"], ["--no-progress"], "progress", True, False),
    ("predict_run", ["predict", "r", "--out", "p.npz"], ["--split", "val"], "split", "test", "val"),
    (
        "predict_run",
        ["predict", "r", "--out", "p.npz"],
        ["--checkpoint", "latest"],
        "which",
        "best",
        "latest",
    ),
    (
        "predict_run",
        ["predict", "r", "--out", "p.npz"],
        ["--batch-size", "3"],
        "batch_size",
        None,
        3,
    ),
    (
        "export_run",
        ["export", "r", "--out", "e"],
        ["--checkpoint", "latest"],
        "which",
        "best",
        "latest",
    ),
    ("export_run", ["export", "r", "--out", "e"], ["--length", "7"], "length", None, 7),
]


@pytest.mark.parametrize(
    ("function", "argv", "flag", "kwarg", "without", "with_"),
    _WIRING,
    ids=[f"{w[1][0]} {w[2][0]}" for w in _WIRING],
)
def test_flag_reaches_the_function_that_implements_it(
    tmp_path, monkeypatch, function, argv, flag, kwarg, without, with_
):
    monkeypatch.chdir(tmp_path)
    assert _recorded_call(monkeypatch, function, argv)[kwarg] == without
    assert _recorded_call(monkeypatch, function, [*argv, *flag])[kwarg] == with_


def test_prepare_seed_changes_the_generated_data(tmp_path, monkeypatch):
    from s5jax.data import load_prepared

    images = []
    for seed in ("0", "1"):
        monkeypatch.setenv("S5JAX_DATA", str(tmp_path / seed))
        argv = ["data", "prepare", "pathfinder", "--generate", "--count", "10", "--seed", seed]
        assert main(argv) == 0
        images.append(load_prepared(tmp_path / seed / "prepared" / "pathfinder").splits["train"].x)
    assert images[0].shape == images[1].shape and not np.array_equal(*images)
