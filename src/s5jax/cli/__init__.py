"""The `s5jax` command: parses arguments and calls `s5jax.train` and `s5jax.data`.

s5jax [-q|-v] COMMAND ...                      less / more messages on stderr
s5jax --version
s5jax [--debug] COMMAND ...                    a traceback with every error
                                               (-q, -v, --debug also after COMMAND)
s5jax train EXPERIMENT|CONFIG.toml [--set a.b=c ...] [--workdir DIR]
            [--resume | --resume-or-start | --overwrite]
s5jax train --data FILE.npz [--set ...]        your own data, default model
s5jax train EXPERIMENT --seeds 0-19 [--workdir DIR]   one run per seed, and their mean ± std
s5jax sweep SPACE.toml | EXPERIMENT --set key=a,b,c [--sample N]   search, select by val
s5jax eval RUN_DIR [--split test] [--step-rescale R] [--checkpoint best|latest]
s5jax predict RUN_DIR --out PRED.npz [--data FILE.npz|FILE.ts|DATASET] [--split NAME] [--stream]
s5jax export RUN_DIR --out DIR [--checkpoint best|latest] [--length L] [--overwrite]
s5jax plot RUN [RUN ...] --out FILE.png [--metric NAME]   compare runs' curves
s5jax list
s5jax config EXPERIMENT|CONFIG.toml [--set a.b=c ...]   the resolved config as TOML
s5jax data prepare NAME [--source PATH] [--generate [--count N] [--seed S]]
s5jax data prepare listops [--l-max L] [--generate [--min-length N] [--max-length N]
                           [--n-train N] [--n-val N] [--n-test N] [--seed S]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shlex
import signal
import sys
import threading
import traceback
from pathlib import Path

from .. import __version__
from .._cache import configure_compilation_cache
from .._malloc import configure_cpu_malloc
from ._paths import path_arg
from ._sweep import SEEDS_HELP, add_sweep_parser, sweep, train_seeds

__all__ = ["main"]

log = logging.getLogger("s5jax")

_RAW = argparse.RawDescriptionHelpFormatter


def _examples(*lines: str) -> str:
    """An argparse epilog: one example command per line."""
    return "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {x}" for x in lines)


# Exit statuses (docs/reliability.md). Errors are one line on stderr; --debug adds the traceback.
EXIT_USAGE = 2  # a bad option, config, dataset, run directory or value
EXIT_DIVERGED = 3  # the training loss became NaN or infinite
EXIT_COORDINATOR = 69  # a multi-process run's coordinator unreachable in time (EX_UNAVAILABLE)
EXIT_IO = 74  # the system refused a read or write (EX_IOERR): permissions, not a folder, disk full
EXIT_BUSY = 75  # another process trains in the run directory (EX_TEMPFAIL): try again later
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): `kill`, or a scheduler's preemption or time limit

_EXIT_CODES = """exit status:
  0    done
  1    train ran no epoch, or an unexpected error (a bug: --debug shows the traceback)
  2    usage, config, data, run-directory or value error
  3    training diverged (loss NaN or infinite)
  69   train --multihost: the coordinator was not reached, or not every process joined,
       within --coordinator-timeout
  74   I/O error (permissions, a file where a folder should be, disk full)
  75   the run directory is in use by another process
  130  interrupted (Ctrl-C); continue a run with --resume
  143  terminated (SIGTERM: kill, or a scheduler's preemption or time limit); the
       command stops as on Ctrl-C: continue a run with --resume"""


class _Parser(argparse.ArgumentParser):
    """argparse with the command's one-line errors: `s5jax train: error: MESSAGE (see
    `s5jax train --help`)`, status 2, without the usage lines argparse prints first (they are
    in `--help`); a mistyped choice (a command, `--checkpoint bets`) names the close ones."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action, value):  # argparse's own check, with a suggestion added
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            from ..config._types import did_you_mean

            if not action.choices or not isinstance(value, str):
                raise
            hint = did_you_mean(value, [str(c) for c in action.choices]).rstrip()
            message = f"{e.message}; {hint}" if hint else e.message
            raise argparse.ArgumentError(action, message) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="s5jax",
        description="S5 state space models in JAX.",
        epilog=_examples("s5jax list", "s5jax -q train pendulum --set train.epochs=5")
        + "\n\n"
        + _EXIT_CODES,
        formatter_class=_RAW,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    level = parser.add_mutually_exclusive_group()
    level.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings and errors on stderr"
    )
    level.add_argument("-v", "--verbose", action="store_true", help="debug messages on stderr")
    parser.add_argument(
        "--debug", action="store_true", help="print the Python traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train = sub.add_parser(
        "train",
        help="train an experiment of the paper or a config file",
        description="Train an experiment; writes a run directory.",
        epilog=_examples(
            "s5jax train pendulum --set train.epochs=5 --workdir runs/p5",
            "s5jax train --data mine.npz",
        ),
        formatter_class=_RAW,
    )
    train.add_argument(
        "experiment",
        nargs="?",
        help="experiment name (see `s5jax list`) or a .toml/.json config file",
    )
    train.add_argument(
        "--data",
        metavar="FILE",
        help="train on your own data: an .npz in the documented format, or a UEA/UCR "
        "NAME_TRAIN.ts (NAME_TEST.ts is read beside it)",
    )
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. train.epochs=5",
    )
    train.add_argument("--workdir", type=path_arg, help="run directory (default runs/<experiment>)")
    run_dir = train.add_mutually_exclusive_group()
    run_dir.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --workdir (an error when there is none)",
    )
    run_dir.add_argument(
        "--resume-or-start",
        action="store_true",
        help="resume when --workdir holds a checkpoint, else start (for schedulers that "
        "restart jobs blindly); a complete run only prints its results",
    )
    run_dir.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --workdir (the old one is deleted once the new one has "
        "written its config); without it a non-empty --workdir is refused",
    )
    train.add_argument("--seeds", metavar="SEEDS", help=SEEDS_HELP)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--quick", action="store_true", help="a first look: a tenth of the epochs (at least one)"
    )
    train.add_argument(
        "--cpu-devices",
        type=int,
        metavar="N",
        help="split the CPU into N devices for data parallelism (sets XLA_FLAGS before JAX "
        "starts; e.g. the number of cores)",
    )
    train.add_argument(
        "--multihost",
        action="store_true",
        help="join a multi-process run (jax.distributed.initialize) before training: under "
        "SLURM, Open MPI or Cloud TPU from the environment, else from --coordinator, "
        "--num-processes and --process-id (docs/multiprocess.md)",
    )
    train.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="with --multihost: process 0's address and a free port, the same for every "
        "process (default $JAX_COORDINATOR_ADDRESS or detected)",
    )
    train.add_argument(
        "--num-processes", type=int, metavar="N", help="with --multihost: how many processes"
    )
    train.add_argument(
        "--process-id",
        type=int,
        metavar="I",
        help="with --multihost: this process's index, 0 .. N-1 (0 serves the coordinator)",
    )
    train.add_argument(
        "--coordinator-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with --multihost: give up (exit status 69) when the coordinator is not reached, "
        "or not every process has joined, within SECONDS (default 300)",
    )

    ev = sub.add_parser(
        "eval",
        help="evaluate a run's checkpoint",
        description="Evaluate the best (or latest) checkpoint of a run; prints the loss and "
        "metric as JSON.",
        epilog=_examples(
            "s5jax eval runs/pendulum --split test",
            "s5jax eval runs/speech --split test_8khz --step-rescale 2",
        ),
        formatter_class=_RAW,
    )
    ev.add_argument("run_dir", type=path_arg, help="the run directory written by `s5jax train`")
    ev.add_argument(
        "--split",
        default="test",
        help="the split to evaluate: train, val, test, or a dataset's extra split such as "
        "test_8khz (default test)",
    )
    ev.add_argument(
        "--step-rescale",
        type=float,
        default=1.0,
        help="multiply every Δ (2 for 8 kHz audio on a 16 kHz model)",
    )
    ev.add_argument(
        "--checkpoint",
        choices=("best", "latest"),
        default="best",
        help="the best-validation (default) or the latest checkpoint",
    )

    _predict_parser(sub)
    _export_parser(sub)
    _plot_parser(sub)
    add_sweep_parser(sub)

    sub.add_parser(
        "list",
        help="list experiments and whether their data is present",
        description="List the packaged experiments and the state of their data.",
        epilog=_examples("S5JAX_DATA=/data/s5 s5jax list"),
        formatter_class=_RAW,
    )
    _config_parser(sub)
    _data_parser(sub)
    for command in _command_parsers(sub):  # `s5jax train ... --debug -q` works too
        level = command.add_mutually_exclusive_group()
        level.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            default=argparse.SUPPRESS,
            help="only warnings and errors on stderr",
        )
        level.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="debug messages on stderr",
        )
        command.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print the Python traceback of an error",
        )
    return parser


def _command_parsers(sub) -> list[argparse.ArgumentParser]:
    """The parsers of the commands under the sub-parsers action `sub`, nested ones (`data`
    and `data prepare`) included: the global flags are accepted after a command too."""
    parsers = []
    for command in sub.choices.values():
        parsers.append(command)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += _command_parsers(action)
    return parsers


def _innermost(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the (sub)command that `args` ran: `s5jax data prepare`'s for
    `s5jax data prepare ...`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


def _data_parser(sub) -> None:
    data = sub.add_parser(
        "data",
        help="prepare datasets",
        description="Prepare datasets.",
        epilog=_examples("s5jax data prepare pendulum"),
        formatter_class=_RAW,
    )
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    prep = data_sub.add_parser(
        "prepare",
        help="prepare a dataset once into the data root",
        description="Read your local copy (or generate) and cache it.",
        epilog=_examples(
            "s5jax data prepare listops --source ~/Downloads/lra_release",
            "s5jax data prepare pathfinder --generate --count 2000",
            "s5jax data prepare uea --source ~/Downloads/Univariate_ts",
        ),
        formatter_class=_RAW,
    )
    prep.add_argument(
        "name",
        help="dataset name, e.g. pendulum, listops, text, image; uea converts UEA/UCR .ts "
        "files (--source: a folder or one NAME_TRAIN.ts) to .npz files under <data root>/uea",
    )
    prep.add_argument("--source", type=path_arg, help="folder holding your copy of the dataset")
    prep.add_argument(
        "--generate",
        action="store_true",
        help="listops, pathfinder (32x32) and pathx (128x128): generate with the original "
        "algorithm (seeded) into --source (default <data root>/generated) instead of reading "
        "(an earlier generated copy there is replaced, a folder not generated here never); "
        "synthetic data, not comparable with published numbers",
    )
    prep.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="pathfinder/pathx with --generate: number of images (default 2000, a first look; "
        "the LRA release has 200,000 per difficulty)",
    )
    prep.add_argument(
        "--seed", type=int, help="seed for --generate, or of uea's val split (default 0)"
    )
    prep.add_argument(
        "--missing",
        choices=("error", "zero", "ffill", "interpolate"),
        help="uea: what to do with missing values (?) (default error; see data.missing)",
    )
    prep.add_argument(
        "--l-max",
        type=int,
        metavar="L",
        help="listops: sequence length incl. <eos> (default 2048, the paper's); longer "
        "examples are truncated. Train with --set data.seq_len=L to match",
    )
    prep.add_argument(
        "--min-length",
        type=int,
        metavar="N",
        help="listops with --generate: keep trees of more than N tokens (default 500, LRA's "
        "min_length)",
    )
    prep.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="listops with --generate: keep trees of fewer than N tokens (default 2000, LRA's "
        "max_length)",
    )
    for split, default in (("train", "96,000"), ("val", "2,000"), ("test", "2,000")):
        prep.add_argument(
            f"--n-{split}",
            type=int,
            metavar="N",
            help=f"listops with --generate: {split} examples (default {default}, LRA's)",
        )


def _config_parser(sub) -> None:
    conf = sub.add_parser(
        "config",
        help="print an experiment's resolved config as TOML",
        description="Print the resolved config (the file, its base, then the --set overrides) "
        "as TOML;\nthe output is a config file that `s5jax train` accepts.",
        epilog=_examples(
            "s5jax config listops --set model.d_model=64 > mine.toml",
            "s5jax train mine.toml",
            "s5jax config --data mine.npz > mine.toml   # edit, then: s5jax train mine.toml",
        ),
        formatter_class=_RAW,
    )
    conf.add_argument(
        "experiment",
        nargs="?",
        help="experiment name (see `s5jax list`) or a .toml/.json config file",
    )
    conf.add_argument(
        "--data",
        metavar="FILE",
        help="the config `s5jax train --data FILE` would train with (an .npz or a UEA/UCR "
        "NAME_TRAIN.ts), its settings chosen from the data; the choices and their reasons "
        "head the output as comments",
    )
    conf.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. train.epochs=5",
    )


def _predict_parser(sub) -> None:
    pred = sub.add_parser(
        "predict",
        help="predict with a run's checkpoint on new data",
        description="Predict with a run's checkpoint and write the predictions to an .npz "
        "(log_probs and pred for classification,\npred for regression, mean and variance for "
        "the Gaussian head). When the data hold targets, print the loss and\nmetric as one "
        "JSON line (as `s5jax eval` computes them; classifiers also give\nbalanced_accuracy, "
        "the mean of the classes' recalls).\n\n"
        "example: s5jax predict runs/mine --data new.npz --out pred.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pred.add_argument("run_dir", type=path_arg, help="the run directory written by `s5jax train`")
    pred.add_argument(
        "--data",
        metavar="FILE",
        help="an .npz in the own-data format (a split x_{split}, or only x with optional "
        "lengths, t and y), a UEA/UCR .ts file (labels optional; read as the run's training "
        "file was), or a prepared dataset's name (default: the run's own data)",
    )
    pred.add_argument(
        "--split", default="test", help="which split of --data to predict (default test)"
    )
    pred.add_argument(
        "--checkpoint",
        choices=("best", "latest"),
        default="best",
        help="the best-validation (default) or the latest checkpoint",
    )
    pred.add_argument(
        "--out", type=path_arg, required=True, metavar="PRED.npz", help="the predictions file"
    )
    pred.add_argument(
        "--stream",
        action="store_true",
        help="feed the data one step at a time through the online (recurrent) model; "
        "causal models only, same predictions",
    )
    pred.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="examples per batch (default the run's data.eval_batch_size)",
    )
    pred.add_argument("--no-progress", action="store_true", help="no progress bar")


def _export_parser(sub) -> None:
    exp = sub.add_parser(
        "export",
        help="serialise a run's model with jax.export",
        description="Write a run's model as jax.export serialisations (forward.jax, and "
        "step.jax for causal models),\nits initial stream state (init_state.npz) and "
        "spec.json, loadable with jax alone\n(see examples/load_exported.py).\n\n"
        "example: s5jax export runs/mine --out exported/mine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exp.add_argument("run_dir", type=path_arg, help="the run directory written by `s5jax train`")
    exp.add_argument(
        "--out", type=path_arg, required=True, metavar="DIR", help="the folder to write"
    )
    exp.add_argument(
        "--checkpoint",
        choices=("best", "latest"),
        default="best",
        help="the best-validation (default) or the latest checkpoint",
    )
    exp.add_argument(
        "--length",
        type=int,
        metavar="L",
        help="fix the forward's sequence length to L (default: any length, symbolic)",
    )
    exp.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out when it holds an earlier export (never another folder or a file)",
    )


def _plot_parser(sub) -> None:
    plot = sub.add_parser(
        "plot",
        help="compare the curves of several runs in one PNG",
        description="Plot one metric per epoch of several runs in one PNG (log y for positive "
        "losses and errors;\nthe paper's figure dashed when every run's config records the "
        "same one; stars at each\nrun's best-validation epoch).",
        epilog=_examples(
            "s5jax plot runs/seed0 runs/seed1 runs/seed2 --out seeds.png",
            "s5jax plot runs/pendulum runs/pendulum-drop --out drop.png --metric val_mse",
        ),
        formatter_class=_RAW,
    )
    plot.add_argument(
        "runs",
        nargs="+",
        type=path_arg,
        metavar="RUN",
        help="run directories written by `s5jax train`, or seeds/sweep directories (all their "
        "runs)",
    )
    plot.add_argument(
        "--out",
        type=path_arg,
        required=True,
        metavar="FILE.png",
        help="the PNG file to write (a .png name outside the runs)",
    )
    plot.add_argument(
        "--metric",
        metavar="NAME",
        help="a key of the runs' epoch records in metrics.jsonl, e.g. val_accuracy, "
        "train_loss, test_mse (default: the first of val_accuracy, val_mse, val_loss, "
        "train_loss that every run has)",
    )


def _cpu_devices(n: int) -> None:
    """Ask XLA for `n` CPU devices; takes effect only if JAX has not started yet."""
    if n < 1:
        raise ValueError(f"--cpu-devices must be at least 1, got {n}")
    flag = f"--xla_force_host_platform_device_count={n}"
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), flag]).strip()


def _coordinator_timed_out(message: str) -> None:
    """`--multihost` gave up waiting (called from a watchdog thread while JAX blocks)."""
    print(f"s5jax train: error: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_COORDINATOR)


def _train(args) -> int:
    if args.cpu_devices is not None:
        _cpu_devices(args.cpu_devices)
    from ..config import apply_overrides, load_experiment
    from ..train import train_and_evaluate
    from ..train._defaults import defaults_record
    from ..train._engine import cpu_remat_flag
    from ..train._runs import user_data_defaults

    multi = (args.coordinator, args.num_processes, args.process_id)
    if not args.multihost and any(v is not None for v in multi):
        raise ValueError(
            "--coordinator, --num-processes and --process-id configure --multihost: add it"
        )
    if args.multihost:
        from ..train import initialize_multihost

        initialize_multihost(
            *multi, timeout=args.coordinator_timeout, on_timeout=_coordinator_timed_out
        )
    if args.cpu_devices:
        import jax

        if jax.default_backend() == "cpu" and jax.local_device_count() != args.cpu_devices:
            log.warning(
                "--cpu-devices %d had no effect (JAX had already started)", args.cpu_devices
            )
    if args.data:
        if args.experiment:
            raise ValueError("give either an EXPERIMENT or --data FILE.npz, not both")
        config, dataset, facts, chosen = user_data_defaults(args.data, args.overrides)
        defaults = defaults_record(facts, chosen)
    elif args.experiment:
        config, dataset = load_experiment(args.experiment, args.overrides), None
        defaults = None
    else:
        raise ValueError("name an EXPERIMENT (see `s5jax list`) or pass --data FILE.npz")
    if args.quick:
        config = apply_overrides(config, [f"train.epochs={max(1, config.train.epochs // 10)}"])
    cpu_remat_flag(config)
    if args.seeds is not None:
        return train_seeds(args, config, dataset, defaults)
    workdir = args.workdir or Path("runs") / config.name
    args.run_workdir = workdir  # for the resume command of an interruption
    resume = "auto" if args.resume_or_start else args.resume
    with _messages(args.quiet) as stream:
        summary = train_and_evaluate(
            config,
            workdir,
            resume=resume,
            overwrite=args.overwrite,
            dataset=dataset,
            progress=not args.no_progress,
            defaults=defaults,
            stream=stream,
        )
    if args.quiet:  # the result, which the silenced messages ended with, on stdout
        from ..train._engine import results_text

        print(results_text(summary))
    print(f"run directory: {workdir}")
    return 0 if summary["epochs_run"] else 1


@contextlib.contextmanager
def _messages(quiet: bool):
    """The trainer's message stream: stderr, or with `-q` nowhere (its warnings go through
    logging, which `-q` keeps)."""
    if not quiet:
        yield sys.stderr
        return
    with open(os.devnull, "w") as sink:
        yield sink


def _eval(args) -> int:
    from ..train import evaluate_run

    if not (math.isfinite(args.step_rescale) and args.step_rescale > 0):
        raise ValueError(
            f"--step-rescale must be a finite number > 0 (it multiplies every Δ), "
            f"got {args.step_rescale}"
        )
    result = evaluate_run(
        args.run_dir, split=args.split, step_rescale=args.step_rescale, which=args.checkpoint
    )
    print(json.dumps(result, indent=2))
    return 0


def _predict(args) -> int:
    from ..train import predict_run

    result = predict_run(
        args.run_dir,
        args.out,
        data=args.data,
        split=args.split,
        which=args.checkpoint,
        stream=args.stream,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    if "loss" in result:
        print(json.dumps(result))
    else:
        log.info("wrote %d predictions to %s", result["n"], result["out"])
    return 0


def _export(args) -> int:
    from ..train import export_run

    folder = export_run(
        args.run_dir,
        args.out,
        which=args.checkpoint,
        length=args.length,
        overwrite=args.overwrite,
    )
    log.info("exported to %s", folder)
    return 0


def _plot(args) -> int:
    from ..train import plot_runs

    out = plot_runs(args.runs, args.out, metric=args.metric)
    log.info("wrote %s", out)
    return 0


def _config(args) -> int:
    from ..config import load_experiment, to_toml

    if args.data:
        from ..train._defaults import format_choices
        from ..train._runs import user_data_defaults

        if args.experiment:
            raise ValueError("give either an EXPERIMENT or --data FILE, not both")
        config, _dataset, facts, chosen = user_data_defaults(args.data, args.overrides)
        lines = [f"s5jax config --data {args.data}", *format_choices(facts, chosen)]
        print("".join(f"# {line}\n" for line in lines) + "\n" + to_toml(config), end="")
        return 0
    if not args.experiment:
        raise ValueError("name an EXPERIMENT (see `s5jax list`) or pass --data FILE")
    print(to_toml(load_experiment(args.experiment, args.overrides)), end="")
    return 0


def _list(_args) -> int:
    from ..config import list_experiments, load_experiment
    from ..train import DATA_SOURCES, data_status, summary_table
    from ..train._runs import prepared_note

    rows = []
    for name in list_experiments():
        cfg = load_experiment(name)
        paper = cfg.paper.value if cfg.paper else None
        status = data_status(cfg.data.dataset)
        note = prepared_note(cfg.data.dataset, cfg.data.seq_len) if status == "ready" else ""
        rows.append((name, cfg.data.dataset, f"{status} ({note})" if note else status, paper))
    print(summary_table(rows, ["experiment", "dataset", "data", "paper"], float_format="g"))
    if any(", not " in row[2] for row in rows):
        print(
            "\n(L N, not M: prepared at length N, the experiment trains at M; train with --set "
            "data.seq_len=N, or prepare the dataset again at M.)"
        )
    print("\nWhere the data comes from (data root: $S5JAX_DATA, default ./data):")
    for dataset, source in DATA_SOURCES.items():
        print(f"  {dataset:<11} {source}")
    return 0


_LISTOPS_GENERATE = ("--min-length", "--max-length", "--n-train", "--n-val", "--n-test")


def _given(args, flags) -> list[str]:
    """The flags among `flags` that were given on the command line."""
    return [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None]


def _check_listops_options(args) -> None:
    """The ListOps-only options: where they apply, and their values."""
    if args.name != "listops":
        given = _given(args, ("--l-max", *_LISTOPS_GENERATE))
        if given:
            raise ValueError(f"{' and '.join(given)} only apply to listops")
        return
    if args.l_max is not None and args.l_max < 2:
        raise ValueError(f"--l-max must be at least 2 (one token and <eos>), got {args.l_max}")
    for flag in ("--n-train", "--n-val", "--n-test"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if args.min_length is not None and args.min_length < 0:
        raise ValueError(f"--min-length must be non-negative, got {args.min_length}")
    lo, hi = _listops_lengths(args)
    if hi - lo < 2:
        said = {
            flag: f"{flag} {value}" + (" (the default)" if given is None else "")
            for flag, value, given in (("--min-length", lo, args.min_length),
                                       ("--max-length", hi, args.max_length))
        }  # fmt: skip
        raise ValueError(
            f"lengths strictly between {said['--min-length']} and {said['--max-length']} hold "
            "no tree: need max-length >= min-length + 2"
        )


def _listops_lengths(args) -> tuple[int, int]:
    """`--min-length`, `--max-length` or the generator's defaults (the LRA release's)."""
    import inspect

    from ..data import generate_listops

    defaults = inspect.signature(generate_listops).parameters
    lo = defaults["min_length"].default if args.min_length is None else args.min_length
    hi = defaults["max_length"].default if args.max_length is None else args.max_length
    return lo, hi


def _generate_listops(args, seed: int):
    from .. import data as d
    from ..data._listops import LISTOPS_L_MAX

    lo, hi = _listops_lengths(args)
    l_max = LISTOPS_L_MAX if args.l_max is None else args.l_max
    if l_max < hi:
        log.warning(
            "trees have up to %d tokens and <eos>, --l-max %d: longer examples are truncated "
            "(set --l-max to --max-length to keep every token)",
            hi - 1,
            l_max,
        )
    elif args.l_max is None and hi < l_max:
        log.info(
            "trees of fewer than %d tokens are padded to L = %d (the listops experiment's "
            "data.seq_len); for steps of about %.0f times less work, prepare with --l-max %d "
            "and train with --set data.seq_len=%d",
            hi,
            l_max,
            l_max / hi,
            hi,
            hi,
        )
    folder = d.generate_listops(
        args.source or d.data_root() / "generated",
        n_train=96_000 if args.n_train is None else args.n_train,
        n_val=2_000 if args.n_val is None else args.n_val,
        n_test=2_000 if args.n_test is None else args.n_test,
        seed=seed,
        min_length=lo,
        max_length=hi,
        overwrite=True,  # only an earlier generated copy, never the LRA release
    )
    return d.prepare_listops(folder.parent, l_max=l_max)


def _prepare(args) -> int:
    from .. import data as d
    from ..train._datasets import prepare_named

    _check_listops_options(args)
    if args.name == "uea":
        return _prepare_uea(args)
    if args.missing is not None:
        raise ValueError("--missing applies to `s5jax data prepare uea` only")
    if not args.generate:
        options = (("--count", args.count), ("--seed", args.seed))
        given = [flag for flag, value in options if value is not None]
        given += _given(args, _LISTOPS_GENERATE)
        if given:
            flags = " and ".join(given)
            raise ValueError(
                f"{flags} only apply with --generate: add --generate to generate {args.name}, "
                f"or drop {flags} to read your copy"
            )
        if args.l_max is not None:  # listops (checked above)
            dataset = d.prepare_listops(args.source, l_max=args.l_max)
        else:
            dataset = prepare_named(args.name, args.source)
    else:
        seed = 0 if args.seed is None else args.seed
        resolution = {"pathfinder": 32, "pathx": 128}.get(args.name)
        if args.name != "listops" and resolution is None:
            raise ValueError("--generate is only available for listops, pathfinder and pathx")
        if args.count is not None and resolution is None:
            raise ValueError("--count applies to pathfinder and pathx only")
        if args.count is not None and args.count < 1:
            raise ValueError(f"--count must be at least 1, got {args.count}")
        if resolution is None:
            dataset = _generate_listops(args, seed)
        else:
            count = 2000 if args.count is None else args.count
            folder = d.generate_pathfinder(
                args.source or d.data_root() / "generated",
                resolution=resolution,
                n_images=count,
                seed=seed,
                overwrite=True,
            )
            dataset = d.prepare_pathfinder(folder.parent, resolution=resolution, force=True)
    print(d.describe(dataset))
    return 0


def _prepare_uea(args) -> int:
    from .. import data as d
    from ..data._uea import convert_ts

    if args.source is None:
        raise ValueError("s5jax data prepare uea needs --source: a folder of .ts files or one "
                         "NAME_TRAIN.ts")  # fmt: skip
    if args.generate or args.count is not None or args.l_max is not None:
        raise ValueError("uea reads .ts files: drop --generate, --count and --l-max")
    out = d.data_root() / "uea"
    seed = 0 if args.seed is None else args.seed
    for path, dataset in convert_ts(args.source, out, missing=args.missing or "error",
                                    val_seed=seed):  # fmt: skip
        print(d.describe(dataset))
        if dataset.meta.get("classes"):
            names = ", ".join(f"{i}={c}" for i, c in enumerate(dataset.meta["classes"]))
            print(f"  labels: {names}")
        print(f"  {dataset.meta['val_split']}")
        print(f"  wrote {path}; train with: s5jax train --data {path}")
    return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a message comes (callers and tests replace it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Formatter())

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Formatter(logging.Formatter):
    """`s5jax: message`, and `s5jax: warning: message` from warnings up."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        return f"s5jax: {text}"


def _configure_logging(quiet: bool, verbose: bool) -> None:
    """Print the `s5jax` logger's messages on stderr, at the level `-q`/`-v` ask for."""
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


def _data_progress(label: str, total: int | None):
    from ..train._progress import Progress

    return Progress(total, label, sys.stderr, unit="item")


def main(argv: list[str] | None = None) -> int:
    """Run the `s5jax` command; returns the exit status."""
    # Before JAX starts its CPU backend: XLA's per-step buffers stay in the heap (s5jax._malloc).
    tuned = configure_cpu_malloc()
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to, whose --help lists its options
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.quiet and args.verbose:  # one before the command, the other after it
        parser.error("-q/--quiet and -v/--verbose exclude each other")
    _configure_logging(args.quiet, args.verbose)
    from ..data import set_progress_factory

    # Dataset preparation draws its progress with the trainer's bar (tqdm on a terminal, a
    # line per 10 % and 30 s otherwise); `-q` leaves only its log lines, which the level hides.
    previous_factory = set_progress_factory(None if args.quiet else _data_progress)
    # The command prints the `s5jax` records itself; a root handler that a library installs
    # (absl's logging calls `logging.basicConfig()` when orbax logs) would print each again.
    propagate, log.propagate = log.propagate, False
    log.debug("s5jax %s; glibc allocator tuning %s", __version__, "on" if tuned else "off")
    # Before JAX is imported: compiled steps are kept on disk for the next run (s5jax._cache).
    cache = configure_compilation_cache()
    log.debug("compilation cache: %s", cache or "off")
    handlers = {
        "train": _train,
        "eval": _eval,
        "predict": _predict,
        "export": _export,
        "list": _list,
        "plot": _plot,
        "sweep": sweep,
        "config": _config,
        "data": _prepare,
    }
    try:
        with _sigterm_stops():
            return handlers[args.command](args)
    except BaseException as e:  # each kind becomes one line and an exit status
        if isinstance(e, SystemExit):
            raise
        code, message = _failure(e, args, sys.argv[1:] if argv is None else argv)
        if args.debug:
            traceback.print_exc()
        print(f"{_innermost(parser, args).prog}: error: {message}", file=sys.stderr)
        return code
    finally:  # `main` called in-process (tests, notebooks) leaves the library as it found it
        set_progress_factory(previous_factory)
        log.propagate = propagate


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: the command stops as on Ctrl-C (files being
    written are removed, checkpoints closed, the resume command printed), exit status 143."""


@contextlib.contextmanager
def _sigterm_stops():
    """While the command runs, SIGTERM raises `Terminated` once; a second SIGTERM kills at
    once (the default action), as a second Ctrl-C would be expected to."""
    if threading.current_thread() is not threading.main_thread():  # signal() needs it
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _failure(e: BaseException, args, argv: list[str]) -> tuple[int, str]:
    """The exit status and the one-line message for an exception out of a command."""
    from ..config import ConfigError
    from ..data import DatasetError
    from ..train import TrainingDiverged
    from ..train._rundir import RunDirBusy
    from ..train._sharding import CoordinatorUnreachable

    if isinstance(e, KeyboardInterrupt):
        terminated = isinstance(e, Terminated)
        message = "terminated (SIGTERM)" if terminated else "interrupted"
        if args.command == "train":
            message += f"; resume with: {_resume_command(argv, getattr(args, 'run_workdir', None))}"
        return (EXIT_TERMINATED if terminated else EXIT_INTERRUPTED), message
    if isinstance(e, RunDirBusy):
        return EXIT_BUSY, str(e)
    if isinstance(e, CoordinatorUnreachable):
        return EXIT_COORDINATOR, str(e)
    if isinstance(e, TrainingDiverged):
        return EXIT_DIVERGED, str(e)
    if isinstance(e, (ConfigError, DatasetError, FileNotFoundError, ValueError)):
        return EXIT_USAGE, _one_line(e)
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        reason = e.strerror or str(e)
        return EXIT_IO, f"{where}{reason} (check the path, its permissions and the free space)"
    return 1, (
        f"unexpected {type(e).__name__}: {_one_line(e)} (a bug: run again with --debug for "
        "the traceback and report it)"
    )


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _resume_command(argv: list[str], workdir: str | os.PathLike | None) -> str:
    """`argv` as an `s5jax` command that resumes the same run: with `--resume` when `workdir`
    holds a checkpoint, else with `--resume-or-start` (stopped before the first checkpoint:
    it starts the run again in the same folder). `--seeds` resumes each seed by itself."""
    from ..train._rundir import has_checkpoint

    kept = [a for a in argv if a not in ("--overwrite", "--resume-or-start", "--resume")]
    seeds = any(a == "--seeds" or a.startswith("--seeds=") for a in kept)
    if "train" in kept and not seeds:
        resumable = workdir is not None and has_checkpoint(Path(workdir))
        kept.append("--resume" if resumable else "--resume-or-start")
    return shlex.join(["s5jax", *kept])


if __name__ == "__main__":
    sys.exit(main())
