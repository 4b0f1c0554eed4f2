# Shared by the GPU check scripts (sourced, after they set STAGES): the output folders, the
# build toolchain, and the stage runner that times each step and records its exit status
# in $OUT/summary.txt.
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Build with compilers that link the libstdc++ the Python process loads: a g++ from another
# GCC install (some images put one first via $CXX) emits iostream code that crashes against
# it at the first formatted message. python/gemmt/_toolchain.py names the system's instead.
eval "$("$PY" python/gemmt/_toolchain.py)"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
has() { [[ " $STAGES " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$SUMMARY"; }
stage() {  # stage NAME LOGFILE COMMAND...: runs, times and records the exit status
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  echo "== $name" >&2
  "$@" >"$log" 2>&1
  local rc=$?
  note "$(printf '%-34s rc=%-3s %5ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(basename "$log")")"
  return $rc
}
