#!/usr/bin/env bash
# On the GPU machine: a 16-core CMake build of the tree (cold, timed; per-object compile
# times from ninja's log), the new-thread regression test, then explore.py. Output in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
PY=$(command -v python3)
B=build/gpu
t0=$(date +%s.%N)
cmake -S . -B $B -G Ninja -DPython_EXECUTABLE=$PY >"$OUT/configure.log" 2>&1
t1=$(date +%s.%N)
cmake --build $B -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
t2=$(date +%s.%N)
{
  echo "cores $(nproc); configure $(echo "$t1-$t0" | bc) s; cold build $(echo "$t2-$t1" | bc) s"
  echo "per-object compile seconds (ninja log):"
  awk 'NR>1{printf "%8.1f %s\n", ($2-$1)/1000, $4}' $B/.ninja_log | sort -rn
} | tee "$OUT/build_times_16core.txt"
export GEMMT_LIBRARY=$(ls $PWD/$B/_gemmt*.so) PYTHONPATH=$PWD/python
$PY -m pytest tests/test_streams_threads.py -q -p no:cacheprovider -x 2>&1 | tail -5 | tee "$OUT/threads.log"
$PY benchmarks/experiments/linear_baseline/explore.py --out "$OUT" "$@" 2>&1 | tee "$OUT/explore.log"
