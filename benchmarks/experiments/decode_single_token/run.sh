#!/usr/bin/env bash
# One-token decode on a CUDA machine, in one call: build the library and the SIMT self-test;
# run the self-test's checks and its gemv sweep (warps per row, bf16 m = 1); run ab.py (gemv
# against the Hopper GEMM's narrow tile and torch, m = 1); then the decode section of
# `python -m gemmt bench linear` and the GEMM and Linear tests with this build.
# Writes $OUT/decode_single_token.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
FINAL=${OUT:-$PWD/dst-out}
OUT=$FINAL/work
mkdir -p "$OUT"
PY=$(command -v python3)
# Compilers that link the libstdc++ of torch's process (python/gemmt/_toolchain.py).
eval "$("$PY" python/gemmt/_toolchain.py)"
{ nvidia-smi; nvcc --version; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; git log -1 --format=%H; } >"$OUT/env.txt" 2>&1

t0=$(date +%s)
cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DGEMMT_BUILD_SELFTESTS=ON \
  -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 &&
  cmake --build build/g -j"$(nproc)" --target _gemmt gemm_simt_selftest >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

timeout 240 build/g/bin/gemm_simt_selftest -q -gemv-sweep >"$OUT/simt_selftest.log" 2>&1
grep -E "PASSED|FAIL" "$OUT/simt_selftest.log" | tail -n 3
grep GEMVSWEEP "$OUT/simt_selftest.log"

export PYTHONPATH=$PWD/python GEMMT_LIBRARY=$(ls "$PWD"/build/g/_gemmt*.so)
timeout 200 $PY benchmarks/experiments/decode_single_token/ab.py "$OUT/ab.jsonl" \
  ${ROUNDS:+--rounds $ROUNDS} 2>&1 | tee "$OUT/ab.log" | tail -n 40
timeout 120 $PY -m gemmt bench linear --sections decode --out "$OUT/decode" >"$OUT/decode.log" 2>&1
tail -n 4 "$OUT/decode.log"
timeout 200 $PY -m pytest tests/test_gemm.py tests/test_linear.py -q -x -p no:cacheprovider -rfE \
  >"$OUT/pytest.log" 2>&1
tail -n 3 "$OUT/pytest.log"
tar -czf "$FINAL/decode_single_token.tgz" -C "$OUT" . && rm -rf "$OUT"
