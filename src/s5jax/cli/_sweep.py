"""`s5jax train ... --seeds 0-19` and `s5jax sweep`: the command-line side of `train._sweep`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._paths import path_arg

EXIT_DIVERGED, EXIT_BUSY = 3, 75

_RAW = argparse.RawDescriptionHelpFormatter

SEEDS_HELP = (
    "train once per seed (e.g. 0-19, 0,3,5 or 0-4,9), each in WORKDIR/seed-S/ (default "
    "WORKDIR runs/<experiment>-seeds), one after another; a finished seed is read, an "
    "interrupted one resumed; writes WORKDIR/summary.json and summary.md (mean ± sample std)"
)


def add_sweep_parser(sub) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="grid or random search: one run directory per trial, selected by val",
        description="Train every trial of a search space, one run directory per trial under "
        "--workdir; select the trial with the best validation figure and report its test "
        "figure. Rerunning the same command resumes the sweep.",
        epilog="examples:\n  s5jax sweep space.toml --workdir runs/my-sweep\n"
        "  s5jax sweep synthetic --set optim.ssm_lr=1e-3,3e-3 --set model.d_model=16,32\n"
        "  s5jax sweep pendulum --set optim.ssm_lr=1e-3,2e-3,4e-3 --sample 2 --seed 0",
        formatter_class=_RAW,
    )
    sweep.add_argument(
        "space", nargs="?", help="SPACE.toml, or an EXPERIMENT / config file with --set key=a,b,c"
    )
    sweep.add_argument("--data", metavar="FILE.npz", help="search on your own data")
    sweep.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=A,B,C",
        help="a searched key (comma-separated values) or a fixed one (one value)",
    )
    sweep.add_argument(
        "--sample", type=int, default=0, metavar="N", help="draw N of the grid's points at random"
    )
    sweep.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    sweep.add_argument(
        "--metric",
        choices=("val_accuracy", "val_mse", "val_loss"),
        help="compare trials by this validation figure (default: the one the trainer picks "
        "its best epoch by: val_accuracy for classification, val_mse otherwise)",
    )
    sweep.add_argument(
        "--workdir", type=path_arg, help="sweep directory (default runs/<name>-sweep)"
    )
    sweep.add_argument(
        "--devices",
        metavar="LIST",
        help="GPU ids to spread trials over, one trial per GPU in a subprocess (default: "
        "CUDA_VISIBLE_DEVICES, else the GPUs nvidia-smi lists; `cpu`: one trial at a time "
        "in this process)",
    )
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")


def _finish_status(summary: dict, noun: str) -> int:
    missing = summary["not_finished"]
    if not missing:
        return 0
    statuses = {m["status"] if isinstance(m, dict) else m for m in missing}
    print(
        f"{len(missing)} {noun} did not finish (listed in the summary); run the same "
        "command again to resume",
        file=sys.stderr,
    )
    if "diverged" in statuses:
        return EXIT_DIVERGED
    return EXIT_BUSY if "busy" in statuses else 1


def train_seeds(args, config, dataset, defaults=None) -> int:
    """`s5jax train ... --seeds SPEC`."""
    from ..train._sweep import parse_seeds, run_seeds, seeds_table

    seeds = parse_seeds(args.seeds)
    if args.resume or args.overwrite:
        flag = "--resume" if args.resume else "--overwrite"
        raise ValueError(
            f"--seeds resumes or starts each seed by itself; {flag} is not for --seeds "
            "(to start again, choose another --workdir)"
        )
    if any(o.split("=", 1)[0].strip() == "train.seed" for o in args.overrides):
        raise ValueError("--seeds sets train.seed for each run: drop --set train.seed=...")
    workdir = args.workdir or Path("runs") / f"{config.name}-seeds"
    from . import _messages

    with _messages(args.quiet) as stream:
        summary = run_seeds(
            config,
            seeds,
            workdir,
            dataset=dataset,
            progress=not args.no_progress,
            defaults=defaults,
            stream=stream,
        )
    print(seeds_table(summary), end="")
    print(f"seeds directory: {workdir} (summary.json, summary.md)")
    return _finish_status(summary, "seed(s)")


def _is_space(path: str) -> bool:
    """A .toml file with a [grid] or [random] table (not an experiment config)."""
    from ..config._load import tomllib

    p = Path(path)
    if p.suffix != ".toml" or not p.is_file():
        return False
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return True  # read_space names the problem
    return "grid" in raw or "random" in raw


def sweep(args) -> int:
    """`s5jax sweep SPACE.toml | EXPERIMENT --set key=a,b,c ...`."""
    from ..train._sweep import (
        device_slots,
        read_space,
        run_sweep,
        space_from_sets,
        sweep_table,
    )

    if args.space and args.space.endswith((".toml", ".json")) and not Path(args.space).is_file():
        raise FileNotFoundError(f"{args.space}: no such file (a SPACE.toml or a config file)")
    if args.space and _is_space(args.space):
        if args.overrides or args.data or args.metric:
            raise ValueError(
                f"{args.space} is a sweep space: put --set, --data and --metric in it "
                "(set = [...], data = ..., metric = ...)"
            )
        space = read_space(args.space)
        name = Path(args.space).stem
    else:
        if bool(args.space) == bool(args.data):
            raise ValueError(
                "give SPACE.toml, or an EXPERIMENT (or config file) or --data FILE.npz with "
                "--set key=a,b,c"
            )
        space = space_from_sets(
            args.space, args.data, args.overrides, args.sample, args.seed, args.metric
        )
        name = Path(args.data).stem if args.data else Path(args.space).stem
    slots = device_slots(args.devices)
    workdir = args.workdir or Path("runs") / f"{name}-sweep"
    from . import _messages

    with _messages(args.quiet) as stream:
        summary = run_sweep(
            space, workdir, devices=slots, progress=not args.no_progress, stream=stream
        )
    print(sweep_table(summary), end="")
    print(f"sweep directory: {workdir} (summary.json, summary.md, sweep.png)")
    return _finish_status(summary, "trial(s)")
