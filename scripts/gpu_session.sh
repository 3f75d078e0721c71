#!/usr/bin/env bash
# Issue 20's GPU checks, in the order they pay off, for one call on a lent GPU machine (device
# time is short: each step's first call compiles for 30-75 s on an H200). Run in the
# repository root, with s5jax importable (the script puts src/ and benchmarks/ on PYTHONPATH):
#
#     bash scripts/gpu_session.sh [STEP ...]
#
# Steps (default: all six, in this order):
#   auto     what `scan_method = "auto"` runs for ListOps, Text and Path-X at the paper's
#            shapes on this machine, and why the Pallas kernel is or is not available
#   scans    benchmarks/scan.py at ListOps' scan shape (batch 50, L 2,048, 8 complex states,
#            one direction): parallel, Pallas and the scan as matrix products ("matmul") at
#            chunk sizes 16, 32, 64 (the default) and 128, forward and forward+backward
#   matmul   benchmarks/train_step.py on ListOps with parallel and "matmul" against the
#            authors' model: does the matmul scan take ListOps' SSM under the 2x budget
#   profile  benchmarks/profile_step.py on ListOps and Text at the paper's batch: where the
#            step's time goes, per source line (the SSM was 36 % and 56 % of it on an H200)
#   step     benchmarks/train_step.py --methods auto on ListOps and Text against the authors'
#            model: the ratio with what `auto` now picks
#   tests    tests/test_scan_pallas.py (the kernel against the sequential scan, on the GPU)
#
# Results go to benchmarks/results/*-gpu.json; where $OUT names a folder,
# the JSONs this run wrote and a log are copied there after every step, so a run cut short by
# its time limit still returns what it finished. Exits non-zero if any step failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD/benchmarks"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(auto scans matmul profile step tests)
for step in "${STEPS[@]}"; do  # check every name before anything runs
    case "$step" in
    auto | scans | matmul | profile | step | tests) ;;
    *)
        echo "gpu_session.sh: error: unknown step '$step' (auto, scans, matmul, profile, step, tests)" >&2
        exit 2 ;;
    esac
done
STAMP=$(mktemp)
LOG=${OUT:+$OUT/gpu_session.log}
LOG=${LOG:-/dev/null}
status=0

say() { echo "== $*" | tee -a "$LOG"; }
keep() {  # copy this run's results to $OUT (the device tool returns at most 8 files)
    [ -n "${OUT:-}" ] || return 0
    find benchmarks/results -name '*-gpu.json' -newer "$STAMP" -exec cp {} "$OUT"/ \;
}
run() {
    say "$*"
    "$@" 2>&1 | grep -v "Pallas Triton backend is deprecated" | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { say "failed ($rc): $*"; status=1; }
    keep
}

for step in "${STEPS[@]}"; do
    case "$step" in
    auto)
        run "$PY" -c '
import jax
from s5jax.core import pallas_unavailable_reason
from train_step import auto_method, shapes
print(jax.devices(), "| pallas:", pallas_unavailable_reason() or "available")
for task in ("listops", "text", "pathx"):
    s = shapes(task, None, None, True)
    print(task, "auto ->", *auto_method(task, s))
' ;;
    scans)
        run "$PY" -W ignore::DeprecationWarning benchmarks/scan.py --shape 50,2048,8 \
            --methods parallel,pallas,matmul --matmul-chunks 16,32,128 --out scan-listops-gpu-session ;;
    matmul)
        run "$PY" -W ignore::DeprecationWarning benchmarks/train_step.py --paper \
            --configs listops --methods parallel,matmul --repeats 5 --out train-step-matmul-gpu-session ;;
    profile)
        for config in listops text; do
            run "$PY" -W ignore::DeprecationWarning benchmarks/profile_step.py --config "$config" \
                --paper --steps 5 --top 30 --out "profile-$config-gpu-session"
        done ;;
    step)
        run "$PY" -W ignore::DeprecationWarning benchmarks/train_step.py --paper \
            --configs listops,text --methods auto --repeats 5 --out train-step-gpu-session ;;
    tests)
        run "$PY" -m pytest -q -p no:cacheprovider tests/test_scan_pallas.py ;;
    esac
done
rm -f "$STAMP"
exit $status
