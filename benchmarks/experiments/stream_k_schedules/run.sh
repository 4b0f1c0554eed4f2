#!/usr/bin/env bash
# The wide-tile schedules of the Hopper GEMM measured against each other, in one call on a
# CUDA machine: build the library and gemm_tc_selftest, run the self-test's correctness
# pass, then gemm_tc_selftest --sk-ab ROUNDS (whole wide tiles, stream-k, the medium and
# 128x192 tiles, rotating order) on the Linear products of the benchmark and on layers it
# does not hold; last, `python -m gemmt bench linear --sections prefill` with this build.
# Writes $OUT/stream_k_schedules.tgz (default OUT: ./sks-out).
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${1:-6}
FINAL=${OUT:-$PWD/sks-out}
OUT=$FINAL/work
mkdir -p "$OUT"
PY=$(command -v python3)
# Compilers that link the libstdc++ of torch's process (python/gemmt/_toolchain.py).
eval "$("$PY" python/gemmt/_toolchain.py)"
{ nvidia-smi; nvcc --version; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; } >"$OUT/env.txt" 2>&1

t0=$(date +%s)
cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DGEMMT_BUILD_SELFTESTS=ON \
  -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 &&
  cmake --build build/g -j"$(nproc)" --target _gemmt gemm_tc_selftest >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

build/g/bin/gemm_tc_selftest --no-perf >"$OUT/selftest.log" 2>&1
tail -n 2 "$OUT/selftest.log"
timeout 300 build/g/bin/gemm_tc_selftest --sk-ab "$ROUNDS" --runs 10 >"$OUT/sk_ab.log" 2>&1
grep SKAB "$OUT/sk_ab.log" | awk '{printf "%s %s %s %s", $2, $3, $4, $10; for (i = 11; i <= NF; ++i) printf " %s", $i; printf "\n"}'

export PYTHONPATH=$PWD/python GEMMT_LIBRARY=$(ls "$PWD"/build/g/_gemmt*.so)
timeout 120 $PY -m gemmt bench linear --sections prefill --out "$OUT/prefill" >"$OUT/prefill.log" 2>&1
tail -n 4 "$OUT/prefill.log"
tar -czf "$FINAL/stream_k_schedules.tgz" -C "$OUT" . && rm -rf "$OUT"
