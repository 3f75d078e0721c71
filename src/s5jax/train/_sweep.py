"""Seeds and sweeps: many ordinary run directories under one folder, and their summary.

`run_seeds` trains one config over several seeds, one run directory per seed
(`<workdir>/seed-<S>/`, the config with `train.seed = S`), one after another, and writes
`<workdir>/summary.json` and `summary.md`: each seed's test figure at its best-validation epoch,
their mean and sample standard deviation (n − 1), and the paper's figure with its ± where the
config gives one.

`run_sweep` trains the trials of a search space (`SweepSpace`, read from a SPACE.toml by
`read_space` or built from `--set key=a,b,c`), one run directory per trial
(`<sweepdir>/trial-<NNN>/`); `sweep.json` records the space and each trial's overrides, so a
rerun maps every trial to the same folder. Trials are compared by their best validation
figure (the one the trainer selects epochs by: accuracy, higher is better, for classification;
MSE, lower is better, otherwise); the test figure is reported for the selected trial only.

Both are resumable with the trainer's own semantics: a run whose `results.json` shows it
finished (with the same config) is read, not touched; any other is resumed from its latest
checkpoint or started (`train_and_evaluate(..., resume="auto")`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .._atomic import atomic_write_json, atomic_write_text
from ..config import ConfigError, ExperimentConfig, apply_overrides, load_experiment, to_dict
from ..config._load import tomllib
from ._rundir import config_differences

__all__ = [
    "SweepSpace",
    "device_slots",
    "parse_seeds",
    "read_space",
    "run_seeds",
    "run_sweep",
    "run_trials",
    "space_from_sets",
]

SUMMARY_JSON, SUMMARY_MD, SWEEP_JSON = "summary.json", "summary.md", "sweep.json"


# --- seeds -----------------------------------------------------------------------------------


#: The most seeds one `--seeds` takes: a range of 10^9 (a typo) would fill the memory
#: before the first run.
MAX_SEEDS = 100_000


def parse_seeds(text: str) -> list[int]:
    """`"0-19"`, `"0,3,5"` or `"0-4,9"` → the seeds, in the order given, without repeats
    (at most `MAX_SEEDS`)."""
    seeds: dict[int, None] = {}  # ordered, and a set for the repeats
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(
                f"--seeds {text!r}: {part!r} is not a seed or a range; write e.g. 0-19, "
                "0,3,5 or 0-4,9"
            )
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise ValueError(
                f"--seeds {text!r}: the range {part!r} runs backwards; write {hi}-{lo}"
            )
        if hi - lo + 1 > MAX_SEEDS:  # checked before the range is built
            raise ValueError(
                f"--seeds {text!r}: the range {part!r} holds {hi - lo + 1:,} seeds, more than "
                f"the {MAX_SEEDS:,} one command trains; give fewer, e.g. 0-19"
            )
        seeds.update(dict.fromkeys(range(lo, hi + 1)))
        if len(seeds) > MAX_SEEDS:
            raise ValueError(
                f"--seeds {text!r}: {len(seeds):,} seeds or more, more than the {MAX_SEEDS:,} "
                "one command trains; give fewer, e.g. 0-19"
            )
    return list(seeds)


def _finished(run_dir: Path, config: ExperimentConfig) -> dict[str, Any] | None:
    """The run's results when `run_dir` holds `config` trained to its last epoch, else None.

    Raises `ValueError` when `run_dir/config.json` is another config (its seed or trial would
    mix two settings in one summary).
    """
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return None
    try:
        there = load_experiment(config_path)
    except ConfigError as e:
        raise ValueError(f"{config_path} cannot be read ({e}); move that folder away") from None
    diff = config_differences(there, config)
    if diff:
        raise ValueError(
            f"{run_dir} holds a run of another config ({'; '.join(diff[:3])}"
            f"{'; ...' if len(diff) > 3 else ''}): choose another --workdir, or move that "
            "folder away"
        )
    results_path = run_dir / "results.json"
    if not results_path.is_file():
        return None
    try:
        results = json.loads(results_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    # results.json is written when a run ends; fewer epochs than the config means it either
    # stopped early (the trainer says so, training nothing) or is being extended.
    if results.get("epochs_run", 0) < config.train.epochs:
        return None
    return results


def _train_one(
    config, run_dir, get_dataset, progress, stream, train, options=None
) -> dict[str, Any]:
    """Read a finished run or resume/start it; a failure becomes a record, not an exception
    (except Ctrl-C and errors in the inputs)."""
    from ._engine import TrainingDiverged
    from ._rundir import RunDirBusy

    done = _finished(run_dir, config)
    if done is not None:
        print(f"{run_dir}: finished earlier; its results are read", file=stream)
        return {"status": "done", "results": done, "trained": False}
    try:
        results = train(
            config,
            run_dir,
            resume="auto",
            dataset=get_dataset(),
            progress=progress,
            stream=stream,
            **(options or {}),
        )
    except TrainingDiverged as e:
        return {"status": "diverged", "message": str(e)}
    except RunDirBusy as e:
        return {"status": "busy", "message": str(e)}
    if results.get("test_at_best_val") is None:
        return {"status": "failed", "message": "no epoch finished", "results": results}
    return {"status": "done", "results": results, "trained": True}


def _unit(config: ExperimentConfig) -> tuple[str, float]:
    """The unit figures are reported in (the paper's, else the metric's own) and its scale."""
    paper = config.paper
    if paper is None:
        return "1", 1.0
    return paper.unit, paper.scale


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def seeds_summary(config: ExperimentConfig, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of per-seed records (`{"seed", "run_dir", "status", "results"?, ...}`)."""
    unit, scale = _unit(config)
    rows, failed = [], []
    metric = None
    for r in records:
        res = r.get("results") or {}
        metric = metric or res.get("metric")
        raw = res.get("test_at_best_val")
        row = {
            "seed": r["seed"],
            "run_dir": r["run_dir"],
            "status": r["status"],
            "best_epoch": res.get("best_epoch"),
            "epochs_run": res.get("epochs_run"),
            "best_val": res.get("best_val"),
            "best_val_value": None if res.get("best_val") is None else res["best_val"] / scale,
            "test": raw,
            "value": None if raw is None else raw / scale,
        }
        if r.get("message"):
            row["message"] = r["message"]
        rows.append(row)
        if r["status"] != "done":
            failed.append(row)
    values = [row["value"] for row in rows if row["status"] == "done"]
    mean, std = _mean_std(values)
    paper = config.paper
    # the constant prediction's test figure: one dataset, so the same for every seed
    constant = next((r["results"]["baseline"] for r in records
                     if (r.get("results") or {}).get("baseline")), None)  # fmt: skip
    return {
        "experiment": config.name,
        "metric": metric
        or (
            "test_accuracy" if config.model.head in ("classification", "retrieval") else "test_mse"
        ),
        "unit": unit,
        "seeds": [r["seed"] for r in records],
        "n": len(values),
        "mean": mean,
        "std": std,
        "std_kind": "sample standard deviation (n - 1)",
        "per_seed": rows,
        "not_finished": [
            {"seed": f["seed"], "status": f["status"], "message": f.get("message")} for f in failed
        ],
        "baseline": None
        if constant is None
        else {"value": constant["value"] / scale, "what": constant["what"]},
        "paper": None
        if paper is None
        else {
            "value": paper.value,
            "std": paper.std,
            "unit": paper.unit,
            "seeds": paper.seeds,
            "source": paper.source,
        },
    }


def seeds_table(summary: dict[str, Any]) -> str:
    """`summary.md`: the per-seed table, then ours (mean ± std, n) beside the paper's figure."""
    unit = summary["unit"]
    shown = "" if unit == "1" else f" (×{unit})" if unit != "%" else " (%)"
    lines = [
        f"# {summary['experiment']}: {summary['metric']} over seeds {_seed_list(summary['seeds'])}",
        "",
        f"| seed | status | best epoch | best val{shown} | {summary['metric']}{shown} |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in summary["per_seed"]:
        status = r["status"] + (f": {r['message']}" if r.get("message") else "")
        status = status.replace("|", "/")
        lines.append(
            f"| {r['seed']} | {status} | {r['best_epoch'] or '–'} | "
            f"{_fmt(r['best_val_value'])} | {_fmt(r['value'])} |"
        )
    lines += ["", f"| | {summary['metric']}{shown} | n |", "|---|---:|---:|"]
    ours = _fmt(summary["mean"]) + ("" if summary["std"] is None else f" ± {_fmt(summary['std'])}")
    lines.append(f"| ours (mean ± sample std) | {ours} | {summary['n']} |")
    paper = summary["paper"]
    if paper is not None and paper["value"] is not None:
        theirs = _fmt(paper["value"]) + ("" if paper["std"] is None else f" ± {_fmt(paper['std'])}")
        lines.append(f"| paper | {theirs} | {paper['seeds'] or '–'} |")
    if constant := summary.get("baseline"):  # summaries written before it have none
        lines.append(f"| a constant: {constant['what']} | {_fmt(constant['value'])} | – |")
    if summary["not_finished"]:
        lines += [
            "",
            "Not finished (not in the mean): "
            + ", ".join(f"seed {f['seed']} ({f['status']})" for f in summary["not_finished"]),
        ]
    return "\n".join(lines) + "\n"


def _seed_list(seeds: Sequence[int]) -> str:
    """[0, 1, 2, 5] → "0-2,5"."""
    parts, run = [], []
    for s in sorted(seeds):
        if run and s == run[-1] + 1:
            run.append(s)
        else:
            if run:
                parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [s]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def seed_config(config: ExperimentConfig, seed: int) -> ExperimentConfig:
    return apply_overrides(config, [f"train.seed={seed}"])


def run_seeds(
    config: ExperimentConfig,
    seeds: Sequence[int],
    workdir: str | os.PathLike,
    *,
    dataset=None,
    progress: bool = True,
    stream: TextIO | None = None,
    train: Callable | None = None,
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train `config` once per seed in `workdir/seed-<S>/`; write and return the summary.

    `defaults`: the settings chosen from a user's data (`defaults_record`), recorded in every
    seed's run_info.json as `s5jax train --data` does.

    Every seed folder is checked before anything trains (a folder holding another config is
    refused). A seed that diverges or whose folder another process holds is recorded and the
    next one runs; Ctrl-C writes the summary of the seeds so far and stops.
    """
    from ._engine import train_and_evaluate

    out = stream or sys.stderr
    train = train or train_and_evaluate
    workdir = Path(workdir)
    if (workdir / "config.json").is_file():
        raise ValueError(
            f"{workdir} is a run directory, not a folder of seeds: choose another --workdir"
        )
    _check_summary_is_ours(workdir, "per_seed", "a folder of seeds")
    configs = {s: seed_config(config, s) for s in seeds}
    for s, cfg in configs.items():
        _finished(workdir / f"seed-{s}", cfg)  # refuses a folder of another config, early
    loaded = [dataset]

    def get_dataset():  # loaded once, when a seed trains (the seed does not change the data)
        if loaded[0] is None:
            from ._datasets import load_dataset

            loaded[0] = load_dataset(config.data)
        return loaded[0]

    records: list[dict[str, Any]] = []

    def write() -> dict[str, Any]:
        summary = seeds_summary(config, records)
        atomic_write_json(workdir / SUMMARY_JSON, summary)
        atomic_write_text(workdir / SUMMARY_MD, seeds_table(summary))
        return summary

    try:
        for i, s in enumerate(seeds):
            run_dir = workdir / f"seed-{s}"
            print(f"== seed {s} ({i + 1} of {len(seeds)}): {run_dir}", file=out)
            rec = _train_one(
                configs[s],
                run_dir,
                get_dataset,
                progress,
                out,
                train,
                {"defaults": defaults} if defaults else None,
            )
            records.append({"seed": s, "run_dir": str(run_dir.relative_to(workdir)), **rec})
            write()
    except KeyboardInterrupt:
        if records:
            write()
        raise
    return write()


# --- sweeps ----------------------------------------------------------------------------------

_RANGES = ("uniform", "log_uniform", "int_uniform")


@dataclass(frozen=True)
class SweepSpace:
    """A search space: the base config, fixed overrides, and the searched keys.

    `grid` maps keys to lists (every combination is a trial); `random` maps keys to lists
    (a uniform choice) or ranges `{"uniform" | "log_uniform" | "int_uniform": [low, high]}`,
    and `samples` trials are drawn with `seed`. `samples` > 0 with a grid alone draws that
    many distinct grid points instead of all of them; with both, every grid point is tried
    with `samples` draws of the random keys (grid points × samples trials).
    """

    base: str | None = None  # an experiment name or config file
    data: str | None = None  # or a user's .npz (the default model)
    fixed: tuple[str, ...] = ()
    grid: dict[str, list] = field(default_factory=dict)
    random: dict[str, Any] = field(default_factory=dict)
    samples: int = 0
    seed: int = 0
    metric: str | None = None  # "val_loss", or the trainer's own val metric (the default)
    source: str = "--set"

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "data": self.data,
            "fixed": list(self.fixed),
            "grid": self.grid,
            "random": self.random,
            "samples": self.samples,
            "seed": self.seed,
            "metric": self.metric,
        }

    def trials(self) -> list[dict[str, Any]]:
        """Each trial's searched values, key → value, in a fixed order."""
        rng = random.Random(self.seed)
        if self.grid:
            keys = list(self.grid)
            points = [
                dict(zip(keys, p, strict=True))
                for p in itertools.product(*(self.grid[k] for k in keys))
            ]
            if self.random:  # each grid point with `samples` draws of the random keys
                return [
                    point | {k: _draw(rng, spec) for k, spec in self.random.items()}
                    for point in points
                    for _ in range(self.samples)
                ]
            if self.samples:
                picked = sorted(rng.sample(range(len(points)), min(self.samples, len(points))))
                points = [points[i] for i in picked]
            return points
        return [
            {k: _draw(rng, spec) for k, spec in self.random.items()} for _ in range(self.samples)
        ]


def _draw(rng: random.Random, spec: Any) -> Any:
    if isinstance(spec, list):
        return spec[rng.randrange(len(spec))]
    ((kind, (lo, hi)),) = spec.items()
    if kind == "uniform":
        return float(f"{rng.uniform(lo, hi):.6g}")
    if kind == "log_uniform":
        return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.6g}")
    return rng.randint(int(lo), int(hi))


def _override(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "none"
    else:
        text = str(value)
    return f"{key}={text}"


def _space_error(source: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {message}")


def _check_key(source: str, table: str, key: str) -> None:
    from ..config import parse_override

    _section, dot, name = key.partition(".")
    if not dot or "." in name:
        raise _space_error(source, f"[{table}] {key}: expected section.key, e.g. optim.ssm_lr")
    try:
        parse_override(f"{key}=0")
    except ConfigError as e:
        if "unknown" in str(e) or "is derived" in str(e):  # the key, not the 0
            raise _space_error(source, f"[{table}] {key}: {str(e).split(': ', 1)[1]}") from None


def _repeated(values: Sequence[Any]) -> Any:
    """The first value listed twice (1e-3 and 0.001 are the same value), or None."""
    seen: list[Any] = []
    for v in values:
        if any(type(v) is type(w) and v == w for w in seen):
            return v
        seen.append(v)
    return None


def _check_values(source: str, table: str, key: str, spec: Any) -> None:
    scalars = (bool, int, float, str)
    if isinstance(spec, list):
        if not spec:
            raise _space_error(source, f"[{table}] {key}: the list of values is empty")
        if not all(isinstance(v, scalars) for v in spec):
            raise _space_error(
                source, f"[{table}] {key}: values must be numbers, strings or booleans"
            )
        repeated = _repeated(spec)
        if table == "grid" and repeated is not None:
            raise _space_error(
                source, f"[grid] {key}: {repeated!r} is listed twice (two identical trials)"
            )
        return
    if table == "grid":
        raise _space_error(
            source,
            f"[grid] {key}: expected a list of values, e.g. "
            f"{key} = [1e-3, 3e-3]; ranges belong in [random]",
        )
    if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in _RANGES):
        raise _space_error(
            source,
            f"[random] {key}: expected a list of values or one of "
            + ", ".join(f"{{ {r} = [low, high] }}" for r in _RANGES),
        )
    ((kind, bounds),) = spec.items()
    if not (
        isinstance(bounds, list)
        and len(bounds) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
    ):
        raise _space_error(source, f"[random] {key}: {kind} needs [low, high], two numbers")
    lo, hi = bounds
    if not lo < hi:
        raise _space_error(source, f"[random] {key}: {kind} needs low < high, got [{lo}, {hi}]")
    if kind == "log_uniform" and lo <= 0:
        raise _space_error(source, f"[random] {key}: log_uniform needs low > 0, got {lo}")
    if kind == "int_uniform" and not all(float(b).is_integer() for b in bounds):
        raise _space_error(source, f"[random] {key}: int_uniform needs whole numbers")


def _keys_of(table: dict[str, Any]) -> dict[str, Any]:
    """Flatten `{optim = {ssm_lr = [...]}}` and `{"optim.ssm_lr" = [...]}` alike: a value at
    `section.key` is a leaf (a list, or a range's inline table `{ log_uniform = [a, b] }`)."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict) and "." not in k:
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


_SPACE_KEYS = ("base", "data", "set", "samples", "seed", "metric", "grid", "random")
# What trials may be compared by: the trainer's own val figure (accuracy for classification
# and retrieval, MSE otherwise; the figure it picks its best epoch by) or the val loss.
METRICS = ("val_accuracy", "val_mse", "val_loss")


def read_space(path: str | os.PathLike) -> SweepSpace:
    """Read and check a SPACE.toml (docs: "Seeds and sweeps"). Errors name the file and key."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(f"{source}: sweep space file not found")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{source}: cannot parse: {e}") from None
    for k in raw:
        if k not in _SPACE_KEYS:
            raise _space_error(source, f"unknown key {k!r}; valid keys: {', '.join(_SPACE_KEYS)}")
    base, data = raw.get("base"), raw.get("data")
    if (base is None) == (data is None):
        raise _space_error(
            source, 'give either base = "EXPERIMENT or config file" or data = "FILE.npz"'
        )
    for name, value in (("base", base), ("data", data)):
        if value is not None and not isinstance(value, str):
            raise _space_error(source, f"{name} = {value!r}: expected a string")

    def relative(p: str | None, must_exist: bool) -> str | None:
        if p is None:
            return None
        q = Path(p).expanduser()
        looks_like_file = must_exist or q.suffix in (".toml", ".json") or "/" in p
        if looks_like_file and not q.is_absolute():
            q = path.parent / q
            return str(q)
        return p

    base, data = relative(base, False), relative(data, True)
    fixed = raw.get("set", [])
    if not (isinstance(fixed, list) and all(isinstance(s, str) for s in fixed)):
        raise _space_error(source, 'set: expected a list of "section.key=value" strings')
    tables = {name: raw[name] for name in ("grid", "random") if raw.get(name) is not None}
    if not tables:
        raise _space_error(source, "give a table of searched keys: [grid], [random] or both")
    searched: dict[str, dict[str, Any]] = {}
    for table, contents in tables.items():
        keys = _keys_of(contents)
        if not keys:
            raise _space_error(source, f"[{table}] is empty: name at least one key to search")
        for k, spec in keys.items():
            _check_key(source, table, k)
            _check_values(source, table, k, spec)
        searched[table] = keys
    grid, rand = searched.get("grid", {}), searched.get("random", {})
    both = sorted(set(grid) & set(rand))
    if both:
        raise _space_error(
            source, f"[random] {both[0]}: also in [grid]; search each key in one table"
        )
    samples, seed = raw.get("samples", 0), raw.get("seed", 0)
    for name, value in (("samples", samples), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _space_error(source, f"{name} = {value!r}: expected a whole number >= 0")
    if rand and samples < 1:
        how = "draws of [random] at every [grid] point" if grid else "trials to draw"
        raise _space_error(source, f"[random] needs samples = N (how many {how})")
    points = math.prod(len(v) for v in grid.values()) if grid and not rand else 0
    if samples > points > 0:
        raise _space_error(
            source,
            f"samples = {samples} but the grid has only {points} points; give at most "
            f"{points}, or leave samples out to run every point",
        )
    metric = raw.get("metric")
    if metric is not None and metric not in METRICS:
        raise _space_error(source, f"metric = {metric!r}: expected one of {', '.join(METRICS)}")
    return SweepSpace(
        base=base,
        data=data,
        fixed=tuple(fixed),
        grid=grid,
        random=rand,
        samples=samples,
        seed=seed,
        metric=metric,
        source=source,
    )


def space_from_sets(
    base: str | None,
    data: str | None,
    sets: Sequence[str],
    sample: int = 0,
    seed: int = 0,
    metric: str | None = None,
) -> SweepSpace:
    """`--set key=a,b,c` (searched) and `--set key=v` (fixed) as a grid space."""
    from ..config import parse_override

    grid: dict[str, list] = {}
    fixed: list[str] = []
    for text in sets:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--set {text!r}: expected section.key=value or key=a,b,c")
        values = [v.strip() for v in value.split(",")] if "," in value else None
        if values is None:
            fixed.append(text)
            continue
        if any(not v for v in values):
            raise ConfigError(f"--set {text!r}: an empty value in the list")
        grid[key] = [parse_override(f"{key}={v}")[1] for v in values]
        repeated = _repeated(grid[key])
        if repeated is not None:
            raise ConfigError(
                f"--set {text!r}: {repeated!r} is listed twice (two identical trials)"
            )
    if not grid:
        raise ConfigError("no key to search: give at least one --set key=a,b,c (or SPACE.toml)")
    if sample < 0:
        raise ValueError(f"--sample must be >= 0, got {sample}")
    points = math.prod(len(v) for v in grid.values())
    if sample > points:
        raise ValueError(
            f"--sample {sample} but the grid has only {points} points; give at most "
            f"{points}, or leave --sample out to run every point"
        )
    if metric is not None and metric not in METRICS:
        raise ValueError(f"--metric {metric!r}: expected one of {', '.join(METRICS)}")
    return SweepSpace(
        base=base,
        data=data,
        fixed=tuple(fixed),
        grid=grid,
        samples=sample,
        seed=seed,
        metric=metric,
    )


def _trial_config(space: SweepSpace, values: dict[str, Any]):
    """(config, dataset or None, defaults record or None) of one trial; `ConfigError`
    naming the trial's key."""
    overrides = [*space.fixed, *(_override(k, v) for k, v in values.items())]
    if space.data is not None:
        from ._defaults import defaults_record
        from ._runs import user_data_defaults

        config, dataset, facts, chosen = user_data_defaults(
            space.data, overrides, selects_by_val=True
        )
        return config, dataset, defaults_record(facts, chosen)
    return load_experiment(space.base, overrides), None, None


# --- running trials on devices ---------------------------------------------------------------


def device_slots(devices: str | None = None, environ: dict | None = None) -> list[str]:
    """The accelerators trials spread over: `devices` ("0,1,3"; "cpu" for none), else the
    `CUDA_VISIBLE_DEVICES` list, else the GPUs `nvidia-smi -L` lists; `[]` means one trial at
    a time in this process. Found without starting JAX, which would claim the GPUs' memory."""
    environ = os.environ if environ is None else environ
    if devices is not None:
        if devices.strip().lower() == "cpu":
            return []
        slots = [d.strip() for d in devices.split(",")]
        if not all(slots):
            raise ValueError(f"--devices {devices!r}: expected e.g. 0,1,2,3 or cpu")
        return slots
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return (
        [str(i) for i, line in enumerate(listed.stdout.splitlines()) if line.startswith("GPU ")]
        if listed.returncode == 0
        else []
    )


def run_trials(
    tasks: Sequence[Any], slots: Sequence[str], launch: Callable[[Any, str], Any]
) -> list[Any]:
    """Run `launch(task, slot)` for every task, at most one per slot at a time, each on a
    free slot (threads; `launch` blocks, e.g. on a subprocess). Returns the results in task
    order; the first exception is raised once the running tasks have ended."""
    free: queue.Queue[str] = queue.Queue()
    for s in slots:
        free.put(s)
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(i: int) -> None:
        slot = free.get()
        try:
            if not stop.is_set():
                results[i] = launch(tasks[i], slot)
        except BaseException as e:
            errors.append(e)
            stop.set()
        finally:
            free.put(slot)

    threads = []
    for i in range(len(tasks)):
        t = threading.Thread(target=work, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _subprocess_launcher(space: SweepSpace, sweepdir: Path, stream: TextIO):
    """`launch(trial, device)`: `s5jax train ... --resume-or-start` in a subprocess that sees
    only `device` (CUDA_VISIBLE_DEVICES), its output in `<sweepdir>/logs/trial-NNN.log`."""

    def launch(trial: dict[str, Any], device: str) -> dict[str, Any]:
        run_dir = sweepdir / trial["dir"]
        cmd = [sys.executable, "-m", "s5jax", "train"]
        cmd += ["--data", space.data] if space.data is not None else [space.base]
        for o in trial["overrides"]:
            cmd += ["--set", o]
        cmd += ["--workdir", str(run_dir), "--resume-or-start", "--no-progress"]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=device)
        log_path = sweepdir / "logs" / f"{trial['dir']}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"{trial['dir']} on device {device}: log {log_path}", file=stream)
        with open(log_path, "a", encoding="utf-8") as log:
            code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code == 0:
            return {"status": "done", "results": json.loads((run_dir / "results.json").read_text())}
        status = {3: "diverged", 75: "busy", 130: "interrupted", 143: "interrupted"}.get(
            code, "failed"
        )
        return {"status": status, "message": f"exit status {code}; see {log_path}"}

    return launch


# --- the sweep ---------------------------------------------------------------------------------


def _check_summary_is_ours(folder: Path, key: str, what: str) -> None:
    """Refuse a `folder` whose summary.json / summary.md were not written by this kind of
    command (a summary.json without `key`): writing ours would replace a user's files."""
    path = folder / SUMMARY_JSON
    if not (path.exists() or (folder / SUMMARY_MD).exists()):
        return
    try:
        ours = key in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        ours = False
    if not ours:
        raise ValueError(
            f"{folder} holds a {SUMMARY_JSON} or {SUMMARY_MD} that is not the summary of "
            f"{what}; writing ours would replace it: choose another --workdir"
        )


def _sweep_trials(space: SweepSpace, sweepdir: Path) -> list[dict[str, Any]]:
    """The trials (dir, values, overrides), from sweep.json when the sweep ran before; a
    folder that is not empty and holds no sweep.json is refused (it is not a sweep)."""
    recorded = sweepdir / SWEEP_JSON
    if not recorded.is_file() and sweepdir.is_dir() and any(sweepdir.iterdir()):
        held = sorted(p.name for p in sweepdir.iterdir())
        raise ValueError(
            f"{sweepdir} is not empty ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) "
            f"and holds no sweep ({SWEEP_JSON}): choose another --workdir (a sweep writes "
            "its trials and summary there)"
        )
    if recorded.is_file():
        try:
            old = json.loads(recorded.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{recorded} cannot be read ({e}); move it away") from None
        if old.get("space") != json.loads(json.dumps(space.to_json())):
            raise ValueError(
                f"{sweepdir} holds a sweep of another space ({recorded}): choose another "
                "--workdir, or rerun with the same space to resume it"
            )
        return old["trials"]
    return [
        {
            "dir": f"trial-{i:03d}",
            "values": values,
            "overrides": [*space.fixed, *(_override(k, v) for k, v in values.items())],
        }
        for i, values in enumerate(space.trials())
    ]


def run_sweep(
    space: SweepSpace,
    sweepdir: str | os.PathLike,
    *,
    devices: Sequence[str] = (),
    progress: bool = True,
    stream: TextIO | None = None,
    train: Callable | None = None,
    launch: Callable | None = None,
) -> dict[str, Any]:
    """Train every trial of `space` under `sweepdir`; write and return the summary.

    With no `devices`, the trials run one after another in this process; with devices (GPU
    ids), one trial per device at a time, each in a subprocess (`launch`, default
    `s5jax train` with `CUDA_VISIBLE_DEVICES`). Every trial's config is built (and so
    checked) before anything is written.
    """
    from ._engine import cpu_remat_flag, train_and_evaluate

    out = stream or sys.stderr
    sweepdir = Path(sweepdir)
    trials = _sweep_trials(space, sweepdir)
    if not trials:
        raise ValueError(f"{space.source}: the space has no trial")
    configs = []
    for t in trials:
        cfg, dataset, defaults = _trial_config(space, t["values"])
        _finished(sweepdir / t["dir"], cfg)  # refuses a folder holding another config, early
        configs.append((cfg, dataset, defaults))
    if all(c.model.remat != "none" for c, _, _ in configs):  # for trials run in this process
        cpu_remat_flag(configs[0][0])
    head = configs[0][0].model.head
    metric = "accuracy" if head in ("classification", "retrieval") else "mse"
    select = space.metric or f"val_{metric}"
    if select not in ("val_loss", f"val_{metric}"):
        raise ValueError(
            f"{space.source}: metric = {select!r}, but the model's head ({head}) reports "
            f"val_{metric}: use val_{metric} or val_loss"
        )

    atomic_write_json(sweepdir / SWEEP_JSON, {"space": space.to_json(), "trials": trials})
    records: list[dict[str, Any] | None] = [None] * len(trials)

    def write() -> dict[str, Any]:
        if select == "val_loss":
            for i, r in enumerate(records):
                if r is not None and r["status"] == "done" and "val_loss" not in r:
                    r["val_loss"] = _best_val_loss(sweepdir / trials[i]["dir"])
        summary = sweep_summary(space, trials, records, metric, select)
        atomic_write_json(sweepdir / SUMMARY_JSON, summary)
        atomic_write_text(sweepdir / SUMMARY_MD, sweep_table(summary))
        plot_sweep(summary, sweepdir / "sweep.png")
        return summary

    try:
        if devices:
            launch = launch or _subprocess_launcher(space, sweepdir, out)
            todo = []
            for i, t in enumerate(trials):
                done = _finished(sweepdir / t["dir"], configs[i][0])
                if done is not None:
                    records[i] = {"status": "done", "results": done}
                else:
                    todo.append(i)
            results = run_trials([trials[i] for i in todo], list(devices), launch)
            for i, r in zip(todo, results, strict=True):
                records[i] = r
        else:
            train = train or train_and_evaluate
            cache: dict[str, Any] = {}
            for i, t in enumerate(trials):
                cfg, dataset, defaults = configs[i]

                def get_dataset(cfg=cfg, dataset=dataset):
                    if dataset is not None:  # a user's .npz, read with the trial's config
                        return dataset
                    from ._datasets import load_dataset

                    # loaded when a trial trains; again only when a trial changes [data]
                    key = json.dumps(to_dict(cfg)["data"], sort_keys=True)
                    if cache.get("key") != key:
                        cache.update(key=key, dataset=load_dataset(cfg.data))
                    return cache["dataset"]

                print(
                    f"== {t['dir']} ({i + 1} of {len(trials)}): "
                    + (", ".join(_override(k, v) for k, v in t["values"].items())),
                    file=out,
                )
                records[i] = _train_one(
                    cfg,
                    sweepdir / t["dir"],
                    get_dataset,
                    progress,
                    out,
                    train,
                    {"defaults": defaults} if defaults else None,
                )
                write()
    except KeyboardInterrupt:
        write()
        raise
    return write()


def _best_val_loss(run_dir: Path) -> tuple[float | None, int | None]:
    """The lowest finite val loss of a run's epochs and its epoch (metrics.jsonl)."""
    from ._logging import read_metrics

    pairs = [
        (r["val_loss"], r["epoch"])
        for r in read_metrics(run_dir, "epoch")
        if isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])
    ]
    return min(pairs) if pairs else (None, None)


def sweep_summary(space, trials, records, metric: str, select: str | None = None) -> dict[str, Any]:
    """Trials compared by `select` (default `val_<metric>`, the trainer's own best val
    figure; or `val_loss`, the lowest val loss of each trial's epochs, read into each
    record's `"val_loss"` as `(value, epoch)`); the test figure of the selected trial only
    (its results.json figure: test at the trainer's best-val epoch)."""
    select = select or f"val_{metric}"
    higher = select == "val_accuracy"
    rows = []
    for t, r in zip(trials, records, strict=True):
        r = r or {"status": "not run"}
        res = r.get("results") or {}
        if select == "val_loss":
            best, epoch = r.get("val_loss") or (None, None)
        else:
            best, epoch = res.get("best_val"), res.get("best_epoch")
        rows.append(
            {
                "trial": t["dir"],
                "values": t["values"],
                "status": r["status"],
                "best_val": best,
                "best_epoch": epoch,
                "message": r.get("message"),
            }
        )
    ranked = [
        i
        for i, row in enumerate(rows)
        if row["status"] == "done"
        and row["best_val"] is not None
        and math.isfinite(row["best_val"])
    ]
    selected = None
    if ranked:
        selected = (max if higher else min)(ranked, key=lambda i: rows[i]["best_val"])
    test, reported_at = None, None
    if selected is not None:
        res = records[selected].get("results") or {}
        test = res.get("test_at_best_val")
        # `train.select = "last"` (chosen for small val splits) reports the last epoch
        reported_at = "last" if res.get("select") == "last" else f"best val_{metric}"
    return {
        "space": space.to_json(),
        "selection": f"best {select} ({'higher' if higher else 'lower'} is better)",
        "metric": select,
        "higher_is_better": higher,
        "trials": rows,
        "selected": None if selected is None else rows[selected]["trial"],
        "selected_values": None if selected is None else rows[selected]["values"],
        "test_metric": f"test_{metric}",
        f"test_{metric}_of_selected": test,
        "test_reported_at": None if reported_at is None else f"{reported_at} epoch",
        "not_finished": [row["trial"] for row in rows if row["status"] != "done"],
    }


def _searched(summary: dict[str, Any]) -> list[str]:
    """The searched keys of a summary's space: the grid's, then the random ones."""
    return [*(summary["space"]["grid"] or {}), *(summary["space"]["random"] or {})]


def sweep_table(summary: dict[str, Any]) -> str:
    keys = _searched(summary)
    metric = summary["metric"]
    test_key = summary["test_metric"]
    lines = [
        f"# sweep: {len(summary['trials'])} trials, selected by {summary['selection']}",
        "",
        "| trial | " + " | ".join(keys) + f" | best {metric} | best epoch | status |",
        "|---|" + "---:|" * len(keys) + "---:|---:|---|",
    ]
    for row in summary["trials"]:
        mark = " **(selected)**" if row["trial"] == summary["selected"] else ""
        lines.append(
            f"| {row['trial']}{mark} | "
            + " | ".join(str(row["values"].get(k)) for k in keys)
            + f" | {_fmt(row['best_val'])} | {row['best_epoch'] or '–'} | "
            f"{row['status']} |"
        )
    lines.append("")
    if summary["selected"] is None:
        lines.append("No trial finished.")
    else:
        values = ", ".join(_override(k, v) for k, v in summary["selected_values"].items())
        lines.append(
            f"Selected: {summary['selected']} ({values}); its {test_key} at its "
            + summary.get("test_reported_at", f"best val_{test_key[5:]} epoch")
            + f": {_fmt(summary[test_key + '_of_selected'])} (the test figure of the other "
            "trials is not reported)."
        )
    return "\n".join(lines) + "\n"


def plot_sweep(summary: dict[str, Any], path: Path) -> None:
    """One panel per searched key: each trial's best val against the key's value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure

    from ._plots import DPI, PANEL_SIZE, SPLIT_COLORS, _save_atomic, log_scale_for, plain_log_ticks

    keys = _searched(summary)
    rows = [r for r in summary["trials"] if r["best_val"] is not None]
    if not rows:
        return
    width, height = PANEL_SIZE
    fig = Figure(figsize=(width * len(keys) / DPI, height / DPI), dpi=DPI)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    ys = [r["best_val"] for r in rows]
    for ax, key in zip(axes, keys, strict=True):
        xs = [r["values"].get(key) for r in rows]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        if numeric:
            pos = [float(x) for x in xs]
            if min(pos) > 0 and max(pos) / min(pos) >= 10:
                ax.set_xscale("log")
                plain_log_ticks(ax.xaxis, pos)
        else:
            labels = sorted({str(x) for x in xs})
            pos = [labels.index(str(x)) for x in xs]
            ax.set_xticks(range(len(labels)), labels)
        ax.scatter(pos, ys, color=SPLIT_COLORS["val"], label="trials")
        sel = [i for i, r in enumerate(rows) if r["trial"] == summary["selected"]]
        if sel:
            ax.scatter(
                [pos[sel[0]]],
                [ys[sel[0]]],
                marker="*",
                s=200,
                color="tab:red",
                label="selected",
                zorder=3,
            )
        if log_scale_for(summary["metric"], ys):
            ax.set_yscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"best {summary['metric']}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"sweep: {len(summary['trials'])} trials")
    fig.tight_layout()
    _save_atomic(fig, path)
