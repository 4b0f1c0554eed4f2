#!/usr/bin/env bash
# The gemv kernel's L2 prefetch on a CUDA machine, in one call: build the library and the SIMT
# self-test; run the self-test's checks and its gemv sweep (warps per row, then the prefetch
# lead against none in rotating rounds); run ab.py (m = 1 against torch) and the single-token
# and gemv tests. The logs are packed into $OUT/decode_prefetch.tgz after every step.
set -uo pipefail
cd "$(dirname "$0")/../../.."
FINAL=${OUT:-$PWD/dst-out}
OUT=$FINAL/work
mkdir -p "$OUT"
pack() { tar -czf "$FINAL/decode_prefetch.tgz" -C "$OUT" .; }
PY=$(command -v python3)
eval "$("$PY" python/gemmt/_toolchain.py)"
{ nvidia-smi; nvcc --version; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; } >"$OUT/env.txt" 2>&1

t0=$(date +%s)
cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DGEMMT_BUILD_SELFTESTS=ON \
  -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 &&
  cmake --build build/g -j"$(nproc)" --target _gemmt gemm_simt_selftest >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; pack; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

timeout 150 build/g/bin/gemm_simt_selftest -q -gemv-sweep >"$OUT/simt_selftest.log" 2>&1
grep -E "PASSED|FAIL" "$OUT/simt_selftest.log" | tail -n 3
grep GEMVPREFETCH "$OUT/simt_selftest.log"
pack

export PYTHONPATH=$PWD/python GEMMT_LIBRARY=$(ls "$PWD"/build/g/_gemmt*.so)
timeout 100 $PY benchmarks/experiments/decode_single_token/ab.py "$OUT/ab.jsonl" 2>&1 |
  tee "$OUT/ab.log" | tail -n 40
pack
timeout 60 $PY -m pytest tests/test_gemm.py -q -x -p no:cacheprovider -rfE \
  -k "gemv or single_token or bad or thread" >"$OUT/pytest.log" 2>&1
tail -n 3 "$OUT/pytest.log"
pack
