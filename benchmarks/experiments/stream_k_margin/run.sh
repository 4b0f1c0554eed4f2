#!/usr/bin/env bash
# The Hopper planner's stream-k margin, measured in one call on a CUDA machine:
#   1. build the library and gemm_tc_selftest, run the self-test's correctness pass;
#   2. gemm_tc_selftest --sk-ab: whole wide tiles against stream-k, alternating, on the
#      Linear training products at 2048 and 8192 tokens that have a partial last wave;
#   3. python -m gemmt bench linear (prefill, 2048 and 8192 tokens) with the committed
#      margin and with kStreamKMargin set to $1 (default 0.985), rebuilt in place, in
#      alternating runs (base, new, base, new) against PyTorch each time.
# Writes $OUT/stream_k_margin.tgz (default OUT: ./skm-out): the logs and benchmark folders.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NEW_MARGIN=${1:-0.985}
FINAL=${OUT:-$PWD/skm-out}
OUT=$FINAL/work
LIBS=$(mktemp -d)
mkdir -p "$OUT" "$LIBS/base" "$LIBS/new"
export CXX=${CXX:-/usr/bin/g++} CUDAHOSTCXX=${CUDAHOSTCXX:-/usr/bin/g++}
PY=$(command -v python3)
{ nvidia-smi; nvcc --version; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; git log -1 --oneline 2>/dev/null; } >"$OUT/env.txt" 2>&1

t0=$(date +%s)
cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DGEMMT_BUILD_SELFTESTS=ON \
  -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 &&
  cmake --build build/g -j"$(nproc)" --target _gemmt gemm_tc_selftest >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

build/g/bin/gemm_tc_selftest --no-perf >"$OUT/selftest.log" 2>&1
tail -n 2 "$OUT/selftest.log"
timeout 240 build/g/bin/gemm_tc_selftest --sk-ab 6 --runs 10 >"$OUT/sk_ab.log" 2>&1
grep SKAB "$OUT/sk_ab.log"

export PYTHONPATH=$PWD/python
cp build/g/_gemmt*.so "$LIBS/base/"
sed -i "s/constexpr double kStreamKMargin = [0-9.]*;/constexpr double kStreamKMargin = $NEW_MARGIN;/" \
  kernels/plan/sm90_plan.cpp
grep -n "kStreamKMargin =" kernels/plan/sm90_plan.cpp
cmake --build build/g -j"$(nproc)" --target _gemmt >>"$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
cp build/g/_gemmt*.so "$LIBS/new/"
git checkout kernels/plan/sm90_plan.cpp 2>/dev/null || true

for run in base1 new1 base2 new2 base3 new3; do
  lib=$(ls "$LIBS/${run%?}"/_gemmt*.so)
  GEMMT_LIBRARY=$lib timeout 120 $PY -m gemmt bench linear --sections prefill --tokens 2048,8192 \
    --out "$OUT/$run" >"$OUT/$run.log" 2>&1
  echo "$run: $(tail -n 3 "$OUT/$run.log" | tr '\n' ' ')"
done
rm -rf "$LIBS"
tar -czf "$FINAL/stream_k_margin.tgz" -C "$OUT" . && rm -rf "$OUT"
