#!/usr/bin/env bash
# The wide-tile schedules of the Hopper GEMM measured against each other, in one call on a
# CUDA machine: build the library and gemm_tc_selftest, run the self-test's correctness
# pass, then gemm_tc_selftest --sk-ab ROUNDS (whole wide tiles, stream-k, the medium and
# 128x192 tiles, rotating order) on the Linear products of the benchmark and on layers it
# does not hold; last, `python -m gemmt bench linear --sections prefill` with this build.
# Writes $OUT/stream_k_schedules.tgz (default OUT: ./stream_k_schedules-out).
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${1:-6}
. benchmarks/experiments/cuda_run.sh
experiment_start stream_k_schedules
experiment_build _gemmt gemm_tc_selftest || exit 1

build/g/bin/gemm_tc_selftest --no-perf >"$OUT/selftest.log" 2>&1
tail -n 2 "$OUT/selftest.log"
timeout 300 build/g/bin/gemm_tc_selftest --sk-ab "$ROUNDS" --runs 10 >"$OUT/sk_ab.log" 2>&1
grep SKAB "$OUT/sk_ab.log" | awk '{printf "%s %s %s %s", $2, $3, $4, $10; for (i = 11; i <= NF; ++i) printf " %s", $i; printf "\n"}'

timeout 120 "$PY" -m gemmt bench linear --sections prefill --out "$OUT/prefill" >"$OUT/prefill.log" 2>&1
tail -n 4 "$OUT/prefill.log"
experiment_pack
