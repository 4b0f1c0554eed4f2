#!/usr/bin/env bash
# The float32 Linear forward's K-major weight on a CUDA machine, in one call: build the library
# and the SIMT self-test; run the self-test's checks and its K-major sweep (the weight copied
# N-major first or read in place, the product run transposed with x copied instead, the
# planner's choice, and an N-major weight as the ceiling; rotating rounds); then the fp32 section of `python -m gemmt bench linear` (24 products
# against cuBLAS, TF32 off). With --tests, the GPU test suite follows. Logs are packed
# into $OUT/k_major_b.tgz after every step. (register_rows.patch beside this script is the
# in-place 16-byte register-staged reading that was measured and dropped.)
set -uo pipefail
cd "$(dirname "$0")/../../.."
TESTS=0
[ "${1:-}" = --tests ] && TESTS=1
. benchmarks/experiments/cuda_run.sh
experiment_start k_major_b
experiment_build _gemmt gemm_simt_selftest || exit 1

timeout 200 build/g/bin/gemm_simt_selftest -q -k-major-sweep >"$OUT/simt_selftest.log" 2>&1
echo "selftest rc $?"
grep -E "PASSED|FAIL" "$OUT/simt_selftest.log" | tail -n 5
grep -E "^KMAJOR" "$OUT/simt_selftest.log"
experiment_pack
timeout 120 "$PY" -m gemmt bench linear --sections fp32 --out "$OUT/fp32" >"$OUT/fp32.log" 2>&1
echo "bench rc $?"
tail -n 4 "$OUT/fp32.log"
experiment_pack
if [ "$TESTS" = 1 ]; then
  timeout 280 "$PY" -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE \
    >"$OUT/pytest.log" 2>&1
  tail -n 3 "$OUT/pytest.log"
  experiment_pack
fi
