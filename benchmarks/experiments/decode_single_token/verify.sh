#!/usr/bin/env bash
# The one-token routing checked on a CUDA machine, in one call: build the library, run ab.py
# (gemv, the narrow tile, `auto` and torch at m = 1), the decode section of
# `python -m gemmt bench linear`, and the whole GPU test suite with this build.
# Writes $OUT/decode_single_token_verify.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/experiments/cuda_run.sh
experiment_start decode_single_token_verify
experiment_build _gemmt || exit 1

timeout 120 "$PY" benchmarks/experiments/decode_single_token/ab.py "$OUT/ab.jsonl" 2>&1 |
  tee "$OUT/ab.log" | tail -n 40
timeout 90 "$PY" -m gemmt bench linear --sections decode --out "$OUT/decode" >"$OUT/decode.log" 2>&1
tail -n 3 "$OUT/decode.log"
experiment_pack
timeout 290 "$PY" -m pytest tests -q -m "not slow" -x -p no:cacheprovider -rfE >"$OUT/pytest.log" 2>&1
tail -n 3 "$OUT/pytest.log"
experiment_pack
