#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over a workload that runs
# every op and every GEMM variant; only gemmt's kernels are instrumented. Needs gemmt
# installed with CUDA. Reports go to $1 (default ./sanitize-out); a summary is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-$PWD/sanitize-out}
mkdir -p "$DEST/logs"
PY=${PYTHON:-python3}
for tool in memcheck racecheck initcheck synccheck; do
  log="$DEST/logs/sanitize_$tool.log"
  compute-sanitizer --tool "$tool" --kernel-name kns=gemmt --error-exitcode 99 \
    --print-limit 50 "$PY" scripts/sanitize_workload.py >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong results" "$log" | tr '\n' ' ')
  echo "compute-sanitizer $tool: rc=$rc $summary"
done
