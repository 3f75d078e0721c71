"""Where one training step's time goes: a profiler trace of our jitted step, by source line.

Issue 20 asks to profile the whole training step (on the GPU our step is 1.39–1.65× the
authors', and without its SSM it would be 2.52× on ListOps and 3.59× on Text: what in it
costs what?). This script compiles the step `s5jax train` runs for one paper config
(`train_step.build_ours`, the same model, optimiser and jitted step as `benchmarks/train_step.py`),
runs it under `jax.profiler.trace` and attributes every executed XLA operation to the line of
our source that produced it:

1. The compiled program's HLO text (`compiled.as_text()`) gives, for every instruction, its
   `metadata`: the JAX op name and the source file and line that traced it (for a fusion:
   the fusion instruction's own metadata, which XLA takes from its root).
2. The trace (`create_perfetto_trace=True`: Chrome trace JSON, read with `json` and `gzip`;
   one trace session per profiled step, the Python tracer off) gives one event per executed
   operation with `args.hlo_op` and `args.hlo_module`: on a GPU
   the kernels on the device's streams (processes named `/device:...`), on a CPU the thunks
   on XLA's threads. Only the step's module counts (its name from the HLO text).
3. Self time: an event that encloses others on the same thread (a CPU `while` thunk around
   its body's thunks) counts only the time its children do not cover, so nothing is counted
   twice (`self_times`).

Reported per step (total / `--steps`): the operations' time summed (on a CPU, over XLA's
threads, which run concurrently: it can exceed the wall time), the wall time (median of the
profiled calls), the time per source file, per source line (with the line's text) and per
line and its caller in another file (printed: it tells apart the products one helper line makes
for the GLU and for the SSM), and the most expensive operations. `coverage` is the fraction of
the summed time whose operation has a source line; the rest is listed as `<no source>`.
`op_ms_each_step` has each step's summed time and, on a CPU, `overlap` the largest of
(summed time) / (wall time × cores) over the steps: above 1 the events also hold time their
threads spent waiting for a core, and the script says so (`overlap`).

    .venv/bin/python benchmarks/profile_step.py --config text [--paper] [--batch N]
        [--length N] [--method auto] [--precision fp32|bf16] [--steps 5] [--top 25]
        [--trace-dir DIR] [--command-buffers] [--out NAME]

Writes `results/<OUT>-<cpu|gpu>.json` (default `profile-<config>`). `--trace-dir` keeps the
raw traces there (one `perfetto_trace.json.gz` per step under `step-<i>/plugins/profile/<time>/`;
open one in ui.perfetto.dev); by default they go to a temporary folder that is removed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import linecache
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import jax
from _common import device_info, out_name, print_table, write_json
from train_step import TASKS, auto_method, build_ours, random_batch, shapes

from s5jax.config import load_experiment

NO_SOURCE = "<no source>"
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="
"""Added to XLA_FLAGS unless `--command-buffers`: kernels that XLA's GPU backend runs inside a
command buffer (a CUDA graph, on by default) come out of the profiler without their HLO op
(openxla/xprof issue 3070, JAX 0.11 on an NVIDIA GPU; jax-ml/jax issue 31995 shows the
`command_buffer` computation). Without them the step may launch more slowly: the wall time
reported is the profiled program's. A flag for every backend; the CPU ignores it."""
OPS_KEPT = 100
"""The most expensive operations kept in the JSON (a step executes about a thousand)."""

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SOURCE_FILE = re.compile(r'source_file="([^"]*)"')
_SOURCE_LINE = re.compile(r"source_line=(\d+)")
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_MODULE = re.compile(r"^HloModule\s+([\w.\-]+)", re.MULTILINE)
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_FIELD = re.compile(r"(\w+)=(\d+)")


def _stack_tables(lines: list[str]) -> dict[str, dict[int, object]]:
    """The module's source tables (newer XLA writes `stack_frame_id=N` in the metadata and
    these tables once, above the computations): names by id, and the fields of each file
    location and stack frame."""
    tables: dict[str, dict[int, object]] = {name: {} for name in _TABLES}
    current = None
    for line in lines:
        word = line.strip()
        if word in _TABLES:
            current = tables[word]
            continue
        if current is None:
            continue
        head, _, rest = word.partition(" ")
        if not head.isdigit():
            if word.startswith(("%", "ENTRY", "HloModule")):
                current = None
            continue
        if rest.startswith('"'):
            current[int(head)] = rest.strip().strip('"')
        else:
            current[int(head)] = {k: int(v) for k, v in _FIELD.findall(rest)}
    return tables


def _frames(tables, frame_id: int) -> list[tuple[str, str, int]]:
    """(file, function, line) of frame `frame_id` and its callers, innermost first. The text
    prints a frame's caller as `parent_frame_id` = the caller's id + 1, 1 meaning none (seen
    with jax 0.10.2; `tests/test_profile_step.py` pins it on a real compile)."""
    out, seen = [], set()
    while frame_id in tables["StackFrames"] and frame_id not in seen:
        seen.add(frame_id)
        frame = tables["StackFrames"][frame_id]
        loc = tables["FileLocations"].get(frame.get("file_location_id"), {})
        out.append((
            tables["FileNames"].get(loc.get("file_name_id"), ""),
            tables["FunctionNames"].get(loc.get("function_name_id"), ""),
            loc.get("line"),
        ))  # fmt: skip
        frame_id = frame.get("parent_frame_id", 1) - 1
    return out


def hlo_sources(hlo_text: str) -> tuple[str, dict[str, dict]]:
    """The module name and `{instruction name: {"op_name", "file", "line", "function",
    "callers"}}` for every instruction (in every computation: fused and loop bodies too) of
    an HLO module's text. The source is the innermost frame JAX recorded (the user's code
    that traced the op; `callers`: up to five frames around it, as "file:line"; `caller`: the
    first of them in another file, which tells the call sites of a helper apart), read from
    `stack_frame_id` and the module's tables, or from `source_file`/`source_line` where an
    older XLA writes those. Instructions without metadata map to an empty dict."""
    lines = hlo_text.splitlines()
    tables = _stack_tables(lines)
    module = _MODULE.search(hlo_text)
    table: dict[str, dict] = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        meta: dict = {}
        if (op := _OP_NAME.search(line)) is not None:
            meta["op_name"] = op.group(1)
        if (fid := _FRAME_ID.search(line)) is not None:
            frames = _frames(tables, int(fid.group(1)))
            if frames:
                meta["file"], meta["function"], meta["line"] = frames[0]
                meta["callers"] = [f"{f}:{n}" for f, _, n in frames[1:6]]
                outside = [f"{f}:{n}" for f, _, n in frames[1:] if f != frames[0][0]]
                meta["caller"] = outside[0] if outside else ""
        elif (f := _SOURCE_FILE.search(line)) is not None:
            meta["file"] = f.group(1)
            if (n := _SOURCE_LINE.search(line)) is not None:
                meta["line"] = int(n.group(1))
        table[m.group(1)] = meta
    return (module.group(1) if module else ""), table


def read_trace(trace_dir: str | os.PathLike) -> list[dict]:
    """The events of the one Chrome-format trace `jax.profiler.trace(...,
    create_perfetto_trace=True)` wrote under `trace_dir`."""
    files = glob.glob(str(Path(trace_dir) / "**" / "perfetto_trace.json.gz"), recursive=True)
    if len(files) != 1:
        raise RuntimeError(f"expected one perfetto_trace.json.gz under {trace_dir}, got {files}")
    with gzip.open(files[0], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def op_events(events: list[dict], module: str) -> tuple[list[dict], str]:
    """The complete events (`ph == "X"`) of executed operations of HLO module `module`: on the
    device processes (named `/device:...`) where the trace has any, else anywhere (a CPU
    backend runs them on host threads). Where a device's events name no module at all (not
    seen; a guess at other profiler versions), its events with an `hlo_op` are taken: only
    the step runs while tracing. Returns them and which rule chose them."""
    names = {
        e["pid"]: e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    device_pids = {pid for pid, name in names.items() if name.startswith("/device:")}
    candidates = [
        e for e in events
        if e.get("ph") == "X" and e.get("args", {}).get("hlo_op")
        and (not device_pids or e.get("pid") in device_pids)
    ]  # fmt: skip
    ops = [e for e in candidates if e["args"].get("hlo_module") == module]
    rule = "device processes" if device_pids else "all processes (no device process)"
    if not ops and device_pids:  # kernels named by op only: the step is all that ran
        ops = [e for e in candidates if "hlo_module" not in e["args"]]
        rule = "device processes, events without a module name"
    return ops, rule


def self_times(events: list[dict]) -> list[float]:
    """Each event's duration minus the parts covered by events nested inside it on the same
    (process, thread): what it spent itself. The result sums to the union of the top-level
    events' durations per thread when the events nest properly (as XLA's do)."""
    out = [float(e.get("dur", 0.0)) for e in events]
    by_thread: dict[tuple, list[int]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -float(events[i].get("dur", 0.0))))
        stack: list[int] = []  # open events, outermost first
        for i in idx:
            start = events[i]["ts"]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]].get("dur", 0.0) <= start:
                stack.pop()
            if stack:  # nested: its time is not its parent's own
                out[stack[-1]] -= float(events[i].get("dur", 0.0))
            stack.append(i)
    return out


def attribute(events: list[dict], selfs: list[float], table: dict[str, dict], steps: int):
    """Per source file, per source line, per (line, its caller in another file) and per operation:
    milliseconds per step (trace times are microseconds), most expensive first. The caller
    tells apart the products that one helper line makes for several layers' parts."""
    per_file: dict[str, float] = collections.Counter()
    per_line: dict[tuple, float] = collections.Counter()
    per_site: dict[tuple, float] = collections.Counter()
    per_op: dict[str, float] = collections.Counter()
    op_meta: dict[str, dict] = {}
    for e, t in zip(events, selfs, strict=True):
        op = e["args"]["hlo_op"]
        meta = table.get(op, {})
        file = meta.get("file", NO_SOURCE)
        per_file[file] += t
        per_line[(file, meta.get("line"))] += t
        per_site[(file, meta.get("line"), meta.get("caller", ""))] += t
        per_op[op] += t
        op_meta[op] = meta
    ms = 1e-3 / steps
    files = [{"file": f, "ms": v * ms} for f, v in per_file.most_common()]
    lines = [{"file": f, "line": n, "ms": v * ms, "text": _source_text(f, n)}
             for (f, n), v in per_line.most_common()]  # fmt: skip
    sites = [{"file": f, "line": n, "caller": c, "ms": v * ms, "text": _source_text(f, n)}
             for (f, n, c), v in per_site.most_common()]  # fmt: skip
    ops = [{"op": o, "ms": v * ms, **op_meta[o]} for o, v in per_op.most_common()]
    return files, lines, sites, ops


def _profiler_options():
    """`jax.profiler.ProfileOptions` with the Python tracer off, or None where this JAX has
    no such options (the profiler's defaults)."""
    options_type = getattr(jax.profiler, "ProfileOptions", None)
    if options_type is None:
        return None
    options = options_type()
    options.python_tracer_level = 0
    return options


def _cores() -> int:
    """The cores this process may run on (its affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def overlap(op_ms: list[float], wall_ms: list[float], threads: int, backend: str) -> float | None:
    """On a CPU: the largest over the profiled steps of (the operations' summed time) /
    (wall time × threads). Above 1 the events cannot all be time a thread spent computing:
    an operation's event also lasts while its thread waits for a core (more of XLA's threads
    than cores) or for helper tasks, so the shares mix waiting with work. None on other
    backends (a device's kernels run one stream at a time)."""
    if backend != "cpu" or not op_ms:
        return None
    return max(o / (w * threads) for o, w in zip(op_ms, wall_ms, strict=True) if w > 0)


def _source_text(file: str, line: int | None) -> str:
    return linecache.getline(file, line).strip()[:120] if line is not None else ""


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/src/", "/benchmarks/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def profile_step(task: str, s: dict, method: str = "auto", precision: str = "fp32",
                 steps: int = 5, trace_dir: str | None = None) -> dict:  # fmt: skip
    """Compile our step for `task` at shapes `s`, run it `steps` times under the profiler and
    attribute the time (module docstring). Returns the results as a dict."""
    base = load_experiment(task)
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, precision=precision))
    _, step, carry = build_ours(cfg, s, method)
    batch, key = random_batch(task, s, jax.random.PRNGKey(1)), jax.random.PRNGKey(2)
    t0 = time.perf_counter()
    compiled = step.lower(*carry, batch, key).compile()
    compile_s = time.perf_counter() - t0
    module, table = hlo_sources(compiled.as_text())

    def call(carry):
        p, st, o, stats = compiled(*carry, batch, key)
        jax.block_until_ready(stats["loss"])
        return p, st, o

    for _ in range(2):  # warm-up: allocator, first-call work
        carry = call(carry)
    walls, ops, selfs, per_step, runs, rule = [], [], [], [], 0, ""
    with tempfile.TemporaryDirectory() as tmp:
        # One trace session per step, its trace read before the next starts, with the Python
        # tracer off (`_profiler_options`; the attribution reads XLA's operation events only).
        # With one session around five calls of Image's float32 step (2-core Intel Xeon,
        # 2026-12-05), in six runs of seven some of the third to fifth calls took 0.66-4.6 s
        # against 0.53-0.58 s for the first two, and the operations' summed time reached up to
        # 3.1 s a step (a weight-sized 768 x 512 fusion at 31 ms); session by session: 529-575
        # ms a call and 0.79-0.85 s summed, in three runs (`--config image --steps 5`).
        for i in range(steps):
            folder = Path(trace_dir or tmp) / f"step-{i}"
            with jax.profiler.trace(folder, create_perfetto_trace=True,
                                    profiler_options=_profiler_options()):  # fmt: skip
                t0 = time.perf_counter()
                carry = call(carry)
                walls.append(time.perf_counter() - t0)
            step_ops, rule = op_events(read_trace(folder), module)
            if not step_ops:
                raise RuntimeError(f"the trace has no operation events of module {module!r}")
            step_selfs = self_times(step_ops)
            ops += step_ops
            selfs += step_selfs
            per_step.append(sum(step_selfs) * 1e-3)
            runs += len({e["args"].get("run_id") for e in step_ops} - {None})
    files, lines, sites, top = attribute(ops, selfs, table, steps)
    total = sum(selfs) * 1e-3 / steps
    threads = _cores()
    covered = sum(f["ms"] for f in files if f["file"] != NO_SOURCE)
    return {
        "task": task, "shapes": s, "method": method, "precision": precision,
        "auto_resolves_to": auto_method(task, s, precision)[0], "steps": steps,
        "module": module, "events_from": rule, "executions_in_trace": runs or None,
        "compile_s": compile_s, "wall_ms_median": statistics.median(walls) * 1e3,
        "wall_ms_all": [w * 1e3 for w in walls], "op_ms_per_step": total,
        "op_ms_each_step": per_step,
        "overlap": overlap(per_step, [w * 1e3 for w in walls], threads, jax.default_backend()),
        "coverage": covered / total if total else 0.0,
        "per_file": files, "per_line": lines, "per_site": sites,
        "per_op": top[:OPS_KEPT], "ops_executed": len(top),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, choices=sorted(TASKS))
    parser.add_argument("--paper", action="store_true", help="the paper's batch and length")
    parser.add_argument("--batch", type=int, default=None, help="cap on the batch")
    parser.add_argument("--length", type=int, default=None, help="cap on the sequence length")
    parser.add_argument("--method", default="auto", help="model.scan_method (default auto)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 2 warm-up)")
    parser.add_argument("--top", type=int, default=25, help="source lines and ops printed")
    parser.add_argument("--trace-dir", default=None, help="keep the raw trace in this folder")
    parser.add_argument("--out", default=None, type=out_name, help="results/<OUT>-<cpu|gpu>.json")
    parser.add_argument(
        "--command-buffers", action="store_true",
        help="keep XLA's GPU command buffers (CUDA graphs): faster, but their kernels lose the "
        "HLO op names this script attributes by",
    )  # fmt: skip
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if not args.command_buffers:  # read when the backend starts, which has not happened yet
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_COMMAND_BUFFERS}".strip()
    info = device_info()
    print(f"{info['cpu_model']} | {info['backend']} x{info['num_devices']} | jax {info['jax']}")
    s = shapes(args.config, args.batch, args.length, args.paper)
    print(f"{args.config}: batch {s['batch']}, L {s['L']}, method {args.method} "
          f"({auto_method(args.config, s, args.precision)[0]} for auto), {args.precision}",
          flush=True)  # fmt: skip
    r = profile_step(args.config, s, args.method, args.precision, args.steps, args.trace_dir)
    path = write_json(args.out or f"profile-{args.config}", {
        "benchmark": "profile_step", "device": info, "load_average_1_5_15": os.getloadavg(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **r,
    })  # fmt: skip
    print(f"\nwall {r['wall_ms_median']:.2f} ms per step (median of {args.steps}); operations "
          f"{r['op_ms_per_step']:.2f} ms per step summed ({r['events_from']}); "
          f"{100 * r['coverage']:.1f} % with a source line\n")  # fmt: skip
    if r["overlap"] is not None and r["overlap"] > 1.0:
        print(
            f"note: in one step the operations' summed time was {r['overlap']:.2f}x the wall "
            f"time x {_cores()} cores: events include time waiting for a core, so "
            "the shares below mix waiting with work (profile_step.overlap)\n"
        )
    total = r["op_ms_per_step"] or 1.0
    rows = [{"where": _short(f["file"]), "ms": f["ms"], "pct": 100 * f["ms"] / total}
            for f in r["per_file"]]  # fmt: skip
    print_table(rows, [("where", "source file", "s"), ("ms", "ms/step", ".3f"),
                       ("pct", "%", ".1f")])  # fmt: skip
    print()
    rows = [{"where": f"{_short(x['file'])}:{x['line']}", "caller": _short(x["caller"]),
             "ms": x["ms"], "pct": 100 * x["ms"] / total, "text": x["text"][:60]}
            for x in r["per_site"][: args.top]]  # fmt: skip
    print_table(rows, [("where", "source line", "s"), ("caller", "called from", "s"),
                       ("ms", "ms/step", ".3f"), ("pct", "%", ".1f"),
                       ("text", "code", "s")])  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
