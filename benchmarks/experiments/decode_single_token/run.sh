#!/usr/bin/env bash
# One-token decode on a CUDA machine, in one call: build the library and the SIMT self-test;
# run the self-test's checks and its gemv sweep (warps per row, then the L2 prefetch lead
# against none in rotating rounds; bf16, m = 1); run ab.py (gemv against the Hopper GEMM's
# narrow tile and torch, m = 1); then the decode section of `python -m gemmt bench linear` and
# the GEMM and Linear tests with this build, or with --quick only the gemv, single-token,
# bad-input and thread tests of test_gemm.py. The logs are packed into
# $OUT/decode_single_token.tgz after every step.
set -uo pipefail
cd "$(dirname "$0")/../../.."
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
. benchmarks/experiments/cuda_run.sh
experiment_start decode_single_token
experiment_build _gemmt gemm_simt_selftest || exit 1

timeout 240 build/g/bin/gemm_simt_selftest -q -gemv-sweep >"$OUT/simt_selftest.log" 2>&1
grep -E "PASSED|FAIL" "$OUT/simt_selftest.log" | tail -n 3
grep -E "GEMVSWEEP|GEMVPREFETCH" "$OUT/simt_selftest.log"
experiment_pack
timeout 200 "$PY" benchmarks/experiments/decode_single_token/ab.py "$OUT/ab.jsonl" 2>&1 |
  tee "$OUT/ab.log" | tail -n 40
experiment_pack
if [ "$QUICK" = 1 ]; then
  tests=(tests/test_gemm.py -k "gemv or single_token or bad or thread")
else
  timeout 120 "$PY" -m gemmt bench linear --sections decode --out "$OUT/decode" \
    >"$OUT/decode.log" 2>&1
  tail -n 4 "$OUT/decode.log"
  tests=(tests/test_gemm.py tests/test_linear.py)
fi
timeout 200 "$PY" -m pytest "${tests[@]}" -q -x -p no:cacheprovider -rfE >"$OUT/pytest.log" 2>&1
tail -n 3 "$OUT/pytest.log"
experiment_pack
