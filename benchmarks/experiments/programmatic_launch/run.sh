#!/usr/bin/env bash
# Programmatic dependent launch (gemmt/launch.cuh) on a CUDA machine: the build's tests, and
# the Linear benchmark with it and without it (GEMMT_PDL=0) in the same call.
# Steps, named on the command line and run in this order (default: build tc suite):
#   build    the library and the tensor-core self-test (build/g)
#   tc       gemm_tc_selftest --no-perf: every tensor-core configuration
#   suite    the GPU test suite (not slow)
#   bench    python -m gemmt bench linear (every section)
#   anatomy  train_step_anatomy.py: the model section's training step taken apart
#   attn     gemm_tc_selftest --sk-ab 3 --sk-ab-attention: the wide-tile schedules on the
#            attention projections (square and grouped-query weights, 512-4096 tokens)
#   wgrad    wgrad_in_step.py: a grad_weight product alone, on a new thread and in a backward
#   t1024    the prefill section at 1024 tokens (the training step's products)
#   ab       the prefill, decode, fused and model sections three times, alternating without
#            and with programmatic launch (off, on, off)
# Logs and JSON go to $OUT/work, packed into $OUT/programmatic_launch.tgz after every step.
set -uo pipefail
cd "$(dirname "$0")/../../.."
STEPS=${*:-build tc suite}
. benchmarks/experiments/programmatic_launch/cuda_run.sh
experiment_start programmatic_launch
experiment_build _gemmt gemm_tc_selftest || exit 1
has tc && step tc_selftest 240 build/g/bin/gemm_tc_selftest --no-perf
has suite && step pytest 330 "$PY" -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE
has bench && TAIL=30 step bench_linear 420 "$PY" -m gemmt bench linear --out "$OUT/linear"
has anatomy && TAIL=40 step train_step_anatomy 300 "$PY" \
  benchmarks/experiments/programmatic_launch/train_step_anatomy.py
has attn && TAIL=70 step sk_ab_attention 400 build/g/bin/gemm_tc_selftest --sk-ab 3 --runs 10 \
  --sk-ab-attention
has wgrad && TAIL=80 step wgrad_in_step 200 "$PY" \
  benchmarks/experiments/programmatic_launch/wgrad_in_step.py
has t1024 && TAIL=60 step bench_prefill_1024 200 "$PY" -m gemmt bench linear --sections prefill \
  --tokens 1024 --out "$OUT/prefill_1024"
if has ab; then
  SECTIONS=${AB_SECTIONS:-prefill,decode,fused,model}
  for run in off1 on1 off2; do
    pdl=1; [[ $run == off* ]] && pdl=0
    GEMMT_PDL=$pdl TAIL=12 step "ab_$run" 300 "$PY" -m gemmt bench linear --sections "$SECTIONS" \
      --out "$OUT/ab_$run"
  done
fi
exit 0
