#!/usr/bin/env bash
# Builds act_backward_layout into $1 (default build/act_backward_layout): one object of
# kernels/linear_backward.cu per block shape, and the timing program.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
B=${1:-$ROOT/build/act_backward_layout}
mkdir -p "$B"
FLAGS=(-O3 -std=c++17 -arch=${ARCH:-sm_90a} --expt-relaxed-constexpr -I"$ROOT/include" -I"$ROOT/kernels")
NVCC=${CUDACXX:-nvcc}
pids=()
for c in 32 64 128 256; do
  "$NVCC" "${FLAGS[@]}" -DGEMMT_ACT_BACKWARD_COL_THREADS=$c -DVARIANT_RUN=act_run_$c \
    -DVARIANT_WS=act_ws_$c -c "$ROOT/benchmarks/experiments/act_backward_layout/variant.cu" \
    -o "$B/variant_$c.o" &
  pids+=($!)
done
"$NVCC" "${FLAGS[@]}" -c "$ROOT/benchmarks/experiments/act_backward_layout/act_backward_layout.cu" \
  -o "$B/main.o" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done  # set -e: a failed compile fails the build
"$NVCC" -arch=${ARCH:-sm_90a} "$B"/variant_*.o "$B/main.o" -o "$B/act_backward_layout"
