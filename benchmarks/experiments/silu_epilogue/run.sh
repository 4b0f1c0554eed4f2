#!/usr/bin/env bash
# The float32 transposed run with a pre-activation output, and SiLU with one
# multi-function-unit instruction in the 16-bit epilogue (not kept), on a CUDA machine.
# Steps, named on the command line and run in this order (default: build selftest linear
# epilogue fused):
#   build      the library and both kernel self-tests (build/g)
#   selftest   gemm_tc_selftest --no-perf (every tensor-core configuration, fused epilogues
#              included) and gemm_simt_selftest -q (`tc`: the first alone)
#   linear     pytest tests/test_linear.py tests/test_gemm.py
#   epilogue   benchmarks/experiments/epilogue_cost/run.py: each epilogue's cost over the plain
#              product, bf16 and fp16, with eager torch in the same run
#   fused      python -m gemmt bench linear --sections fused
#   suite      the GPU test suite (not slow)
#   bench      python -m gemmt bench linear (every section)
#   preact     fp32_preact.py: the float32 Linear forward with a pre-activation output (the
#              training forward) against the same without one, and against eager torch
#   ab         with silu_one_mufu.patch applied (`git apply`; SiLU from one ex2 and Newton
#              steps, measured and not kept): the same library built a second time with
#              GEMMT_SILU_TWO_MUFU (SiLU as z / (1 + __expf(-z)): ex2 and rcp) in
#              build/g_two_mufu, beside build/g; then epilogue_cost's plain, gelu_tanh, silu and
#              bias+silu lines from each build in separate processes, alternating (one, two;
#              then two, one; ...) for AB_ROUNDS rounds
# Logs and JSON go to $OUT/work, packed into $OUT/silu_epilogue.tgz after every step.
set -uo pipefail
cd "$(dirname "$0")/../../.."
STEPS=${*:-build selftest linear epilogue fused}
. benchmarks/experiments/cuda_run.sh
experiment_start silu_epilogue
if has ab; then  # built while build/g builds
  ( cmake -S . -B build/g_two_mufu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_CUDA_FLAGS=-DGEMMT_SILU_TWO_MUFU -DPython_EXECUTABLE="$PY" &&
    cmake --build build/g_two_mufu -j"$(nproc)" --target _gemmt ) >"$OUT/build_two_mufu.log" 2>&1 &
  ab_build=$!
fi
experiment_build _gemmt gemm_tc_selftest gemm_simt_selftest || exit 1
{ has selftest || has tc; } && step tc_selftest 200 build/g/bin/gemm_tc_selftest --no-perf
has selftest && step simt_selftest 120 build/g/bin/gemm_simt_selftest -q
has linear && step pytest_linear 240 "$PY" -m pytest tests/test_linear.py tests/test_gemm.py -q \
  -x -p no:cacheprovider -rfE
has epilogue && TAIL=40 step epilogue_cost 150 "$PY" benchmarks/experiments/epilogue_cost/run.py \
  "$OUT/epilogue_cost.json"
has preact && TAIL=20 step fp32_preact 120 "$PY" benchmarks/experiments/silu_epilogue/fp32_preact.py \
  "$OUT/fp32_preact.json"
has fused && TAIL=12 step bench_fused 240 "$PY" -m gemmt bench linear --sections fused \
  --out "$OUT/fused"
if has ab; then
  wait "$ab_build" || { tail -n 30 "$OUT/build_two_mufu.log"; exit 1; }
  one=$GEMMT_LIBRARY
  two=$(ls "$PWD"/build/g_two_mufu/_gemmt*.so)
  ab_run() {  # ab_run VARIANT ROUND
    local lib=$one
    [ "$1" = two ] && lib=$two
    GEMMT_LIBRARY=$lib timeout 60 "$PY" benchmarks/experiments/epilogue_cost/run.py \
      "$OUT/ab/${1}_$2.json" --cases gelu_tanh,silu,bias+silu >>"$OUT/ab/$1.log" 2>&1
    echo "ab $1 round $2: rc $?"
  }
  mkdir -p "$OUT/ab"
  for r in $(seq 1 "${AB_ROUNDS:-4}"); do
    if (( r % 2 )); then ab_run one "$r"; ab_run two "$r"; else ab_run two "$r"; ab_run one "$r"; fi
  done
  experiment_pack
fi
has suite && step pytest 330 "$PY" -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE
has bench && TAIL=30 step bench_linear 420 "$PY" -m gemmt bench linear --out "$OUT/linear"
exit 0
