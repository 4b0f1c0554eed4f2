#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over a workload that runs
# every op and every GEMM variant; only gemmt's kernels are instrumented. Needs gemmt
# installed with CUDA. Reports go to $1 (default ./sanitize-out); a summary is printed.
# SANITIZE_TOOLS="initcheck synccheck" runs a subset.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-$PWD/sanitize-out}
mkdir -p "$DEST/logs"
PY=${PYTHON:-python3}
# The tools run side by side: each is bound by its own host-side instrumentation, not by
# the GPU, so the wall time is that of the slowest.
tools=(${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck})
for tool in "${tools[@]}"; do
  ( compute-sanitizer --tool "$tool" --kernel-name kns=gemmt --error-exitcode 99 \
      --print-limit 50 "$PY" scripts/sanitize_workload.py >"$DEST/logs/sanitize_$tool.log" 2>&1
    echo $? >"$DEST/logs/sanitize_$tool.rc" ) &
done
wait
for tool in "${tools[@]}"; do
  log="$DEST/logs/sanitize_$tool.log"
  rc=$(cat "$DEST/logs/sanitize_$tool.rc" 2>/dev/null || echo "?")
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong results" "$log" | tr '\n' ' ')
  echo "compute-sanitizer $tool: rc=$rc $summary"
done
