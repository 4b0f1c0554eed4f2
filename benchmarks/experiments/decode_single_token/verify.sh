#!/usr/bin/env bash
# The one-token routing checked on a CUDA machine, in one call: build the library, run ab.py
# (gemv, the narrow tile, `auto` and torch at m = 1), the decode section of
# `python -m gemmt bench linear`, and the whole GPU test suite with this build.
# Writes $OUT/decode_single_token_verify.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
FINAL=${OUT:-$PWD/dst-out}
OUT=$FINAL/work
mkdir -p "$OUT"
PY=$(command -v python3)
eval "$("$PY" python/gemmt/_toolchain.py)"
{ nvidia-smi; nvcc --version; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; } >"$OUT/env.txt" 2>&1

t0=$(date +%s)
cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DPython_EXECUTABLE="$PY" \
  >"$OUT/cmake.log" 2>&1 &&
  cmake --build build/g -j"$(nproc)" --target _gemmt >"$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

export PYTHONPATH=$PWD/python GEMMT_LIBRARY=$(ls "$PWD"/build/g/_gemmt*.so)
timeout 120 $PY benchmarks/experiments/decode_single_token/ab.py "$OUT/ab.jsonl" 2>&1 |
  tee "$OUT/ab.log" | tail -n 40
timeout 90 $PY -m gemmt bench linear --sections decode --out "$OUT/decode" >"$OUT/decode.log" 2>&1
tail -n 3 "$OUT/decode.log"
timeout 290 $PY -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE >"$OUT/pytest.log" 2>&1
tail -n 3 "$OUT/pytest.log"
tar -czf "$FINAL/decode_single_token_verify.tgz" -C "$OUT" . && rm -rf "$OUT"
