"""The command's conventions: `--version`, `s5jax config`, `-q`/`-v` and help on every argument.

The two views that must agree: the TOML that `s5jax config` prints and the config it was
resolved from (`load_experiment` of the printed text equals the original, for every packaged
experiment); `s5jax --version` and the installed package metadata.
"""

import argparse
import dataclasses
import logging
import typing
from importlib import metadata

import pytest

import s5jax
from s5jax.cli import _parser, main
from s5jax.config import (
    ExperimentConfig,
    list_experiments,
    load_experiment,
    to_toml,
)
from s5jax.config._dict import SECTIONS


@pytest.mark.parametrize("name", list_experiments())
def test_toml_of_every_experiment_loads_back_equal(name, tmp_path):
    cfg = load_experiment(name)
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    assert load_experiment(path) == cfg


def test_toml_round_trips_overrides_and_awkward_strings(tmp_path):
    cfg = load_experiment("pendulum", ["train.epochs=3", "optim.grad_clip=1.5", "data.root=/x"])
    cfg = dataclasses.replace(cfg, description='quote " backslash \\ tab \t newline \n Λ̄ \x7f')
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    assert load_experiment(path) == cfg


def test_every_optional_field_defaults_to_none():
    # to_toml writes None as a comment (TOML has no null), which loads back as the default:
    # that is only the same config while every field that may be None defaults to None.
    for cls in (ExperimentConfig, *SECTIONS.values()):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if type(None) in typing.get_args(hints[f.name]):
                assert f.default is None, f"{cls.__name__}.{f.name}"


def test_version_is_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"s5jax {metadata.version('s5jax')}"
    assert s5jax.__version__ == metadata.version("s5jax")


def test_config_command_prints_toml_that_loads_back(tmp_path, capsys):
    overrides = ["train.epochs=7", "model.d_model=64"]
    set_args = [a for o in overrides for a in ("--set", o)]
    for name in ("listops", "pendulum-append", "speech"):
        assert main(["config", name, *set_args]) == 0
        path = tmp_path / f"{name}.toml"
        path.write_text(capsys.readouterr().out, encoding="utf-8")
        assert load_experiment(path) == load_experiment(name, overrides)
        # and the printed file is itself a config the command accepts
        assert main(["config", str(path)]) == 0
        assert capsys.readouterr().out == path.read_text(encoding="utf-8")


def test_config_command_reports_a_bad_key(capsys):
    assert main(["config", "listops", "--set", "model.d_modle=3"]) == 2
    assert "d_model" in capsys.readouterr().err


@pytest.fixture
def restore_s5jax_logger():
    """The command installs a handler and sets a level on the `s5jax` logger: undo both."""
    logger = logging.getLogger("s5jax")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def test_quiet_silences_info_and_verbose_shows_debug(capsys, restore_s5jax_logger):
    def messages(*flags):
        assert main([*flags, "config", "synthetic"]) == 0
        logging.getLogger("s5jax.test").info("an info message")
        return capsys.readouterr().err

    default = messages()
    assert "s5jax: an info message" in default and "loaded experiment" not in default
    quiet = messages("-q")
    assert "an info message" not in quiet
    verbose = messages("-v")
    assert "s5jax: an info message" in verbose
    assert "s5jax: loaded experiment 'synthetic'" in verbose  # a debug message of s5jax.config
    logging.getLogger("s5jax.test").warning("a warning")
    assert capsys.readouterr().err == "s5jax: warning: a warning\n"


# The shortest valid command line of each command, and where the global flags go in it: after
# the command (`data` takes them before its sub-command too).
COMMAND_LINES = {
    "train": ["train", "synthetic"],
    "eval": ["eval", "r"],
    "predict": ["predict", "r", "--out", "p.npz"],
    "export": ["export", "r", "--out", "e"],
    "plot": ["plot", "r", "--out", "p.png"],
    "sweep": ["sweep", "space.toml"],
    "list": ["list"],
    "config": ["config", "x"],
    "data prepare": ["data", "prepare", "x"],
    "data": ["data", "{flag}", "prepare", "x"],
}


@pytest.mark.parametrize("command", COMMAND_LINES)
def test_global_flags_are_accepted_after_every_command(command):
    """`s5jax train ... -q` (a flag added at the end of a command line) means `s5jax -q train
    ...`: one parse per command, the nested `data prepare` included."""
    argv = COMMAND_LINES[command]
    if "{flag}" not in argv:
        argv = [*argv, "{flag}"]
    parser = _parser()
    plain = parser.parse_args([a for a in argv if a != "{flag}"])
    assert (plain.quiet, plain.verbose, plain.debug) == (False, False, False)
    for flag, want in (("-q", (True, False, False)), ("--verbose", (False, True, False)),
                       ("--debug", (False, False, True))):  # fmt: skip
        args = parser.parse_args([flag if a == "{flag}" else a for a in argv])
        assert (args.quiet, args.verbose, args.debug) == want


def test_quiet_or_verbose_after_the_command_sets_the_level(capsys, restore_s5jax_logger):
    assert main(["config", "synthetic", "-q"]) == 0
    logging.getLogger("s5jax.test").info("an info message")
    assert "an info message" not in capsys.readouterr().err
    assert main(["config", "synthetic", "-v"]) == 0
    assert "s5jax: loaded experiment 'synthetic'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # one before the command, the other after it
        main(["-q", "config", "synthetic", "-v"])
    assert exc.value.code == 2
    assert "s5jax: error: -q/--quiet and -v/--verbose exclude each other" in (
        capsys.readouterr().err
    )


def test_quiet_training_prints_its_result_on_stdout_and_only_warnings_on_stderr(
    tmp_path, capsys, monkeypatch, restore_s5jax_logger
):
    """`s5jax -q train`: no per-epoch lines, parameter table or progress on stderr, the result
    table on stdout; the trainer's warnings (model.remat on CPU, bf16 without bf16 arithmetic:
    one stands in for both here, as which applies depends on the host) still show."""
    from s5jax.train import _engine

    monkeypatch.setattr(_engine, "_remat_warning", lambda config: "warning: a test warning")
    argv = ["train", "synthetic", "--workdir", str(tmp_path / "run"), "--set", "train.epochs=1",
            "-q"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("metric ") and "test accuracy at best val" in out
    assert out.endswith(f"run directory: {tmp_path / 'run'}\n")
    assert err == "s5jax: warning: a test warning\n"  # nothing but the warning
    assert main([a for a in argv if a != "-q"] + ["--overwrite", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "epoch 1: train loss" in err and "test accuracy at best val" in err
    assert out == f"run directory: {tmp_path / 'run'}\n"


def test_path_arguments_expand_the_home_folder(monkeypatch, tmp_path):
    """A quoted `'~/runs/x'` (a script, a scheduler's config: no shell expands it) names the
    home folder; it made a folder called `~` in the current one. Every path argument of every
    command takes the same type."""
    from s5jax.cli._paths import path_arg

    monkeypatch.setenv("HOME", str(tmp_path))
    args = _parser().parse_args(["train", "synthetic", "--workdir", "~/runs/x"])
    assert args.workdir == tmp_path / "runs" / "x"
    args = _parser().parse_args(["predict", "~/run", "--out", "~/p.npz"])
    assert (args.run_dir, args.out) == (tmp_path / "run", tmp_path / "p.npz")
    typed = [(line, a) for line, sub in _subparsers(_parser()) for a in sub._actions
             if a.type is not None and a.type not in (int, float, str)]  # fmt: skip
    assert typed and all(a.type is path_arg for _, a in typed), [
        (line, a.dest, a.type) for line, a in typed if a.type is not path_arg
    ]


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["-q", "-v", "list"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def _subparsers(parser: argparse.ArgumentParser, prefix: str = "s5jax"):
    """(command line, parser) for the parser and every sub-command, recursively."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, f"{prefix} {name}")


def test_every_argument_of_every_command_has_help():
    missing = [
        f"{command}: {action.option_strings or action.dest}"
        for command, parser in _subparsers(_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert not missing, missing


def test_every_command_shows_an_example():
    for command, parser in _subparsers(_parser()):
        text = parser.format_help()
        assert "example" in text and "s5jax " in text.split("example", 1)[1], command


@pytest.mark.parametrize(
    "argv, first, fragments",
    [
        (["train", "pendulum", "--bogus", "x"], "s5jax train: error:",
         ["unrecognized arguments: --bogus x", "`s5jax train --help`"]),
        (["data", "prepare", "pendulum", "--bogus"], "s5jax data prepare: error:",
         ["unrecognized arguments: --bogus", "`s5jax data prepare --help`"]),
        (["trian"], "s5jax: error:", ["invalid choice: 'trian'", "did you mean train?"]),
        (["eval", "run", "--checkpoint", "bets"], "s5jax eval: error:",
         ["invalid choice: 'bets'", "did you mean best?"]),
        (["data", "prepair", "x"], "s5jax data: error:", ["did you mean prepare?"]),
        (["eval"], "s5jax eval: error:", ["required: run"]),
        (["eval", "run", "--checkpoint", "zzz"], "s5jax eval: error:", ["invalid choice"]),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_naming_the_command_and_its_help(argv, first, fragments, capsys):
    # argparse prints its usage lines before the error; the command's errors are one line.
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(first), err
    assert "usage:" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    if argv[-1] == "zzz":  # nothing close: no suggestion
        assert "did you mean" not in err
