#!/usr/bin/env bash
# Stream-k on the partial last wave alone (SplitPlan::sk_clusters == 1), on a CUDA machine.
# Steps, named on the command line and run in this order (default: build tc skab prefill):
#   build    the library and both kernel self-tests (build/g)
#   tc       gemm_tc_selftest --no-perf: every tensor-core configuration, the tail path
#            (sm90-skt) included
#   simt     gemm_simt_selftest -q
#   skab     gemm_tc_selftest --sk-ab $AB_ROUNDS (default 4): whole wide tiles, stream-k on the
#            last two waves and on the last alone, the medium and the 128x192 tile, rotating,
#            on the training products with more than one wave of wide tiles and held-out layers
#            (AB_FLAGS=--sk-ab-tail: only those the planner runs as stream-k on the last wave;
#            AB_FLAGS=--sk-ab-short-k: products of 4 to 12 k-blocks, for short_k_ping_pong;
#            AB_FLAGS=--sk-ab-many-waves: products of five waves or more, for long_k_last_wave)
#   prefill  python -m gemmt bench linear --sections prefill
#   suite    the GPU test suite (not slow)
#   bench    python -m gemmt bench linear (every section)
# Logs and JSON go to $OUT/work, packed into $OUT/stream_k_tail.tgz after every step.
set -uo pipefail
cd "$(dirname "$0")/../../.."
STEPS=${*:-build tc skab prefill}
. benchmarks/experiments/cuda_run.sh
experiment_start stream_k_tail
experiment_build _gemmt gemm_tc_selftest gemm_simt_selftest || exit 1
has tc && step tc_selftest 240 build/g/bin/gemm_tc_selftest --no-perf
has simt && step simt_selftest 120 build/g/bin/gemm_simt_selftest -q
has skab && TAIL=120 step sk_ab 400 build/g/bin/gemm_tc_selftest --sk-ab "${AB_ROUNDS:-4}" --runs 10 \
  ${AB_FLAGS:-}
has prefill && TAIL=12 step bench_prefill 150 "$PY" -m gemmt bench linear --sections prefill \
  --out "$OUT/prefill"
has suite && step pytest 330 "$PY" -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE
has bench && TAIL=30 step bench_linear 420 "$PY" -m gemmt bench linear --out "$OUT/linear"
exit 0
