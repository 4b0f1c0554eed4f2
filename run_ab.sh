#!/bin/bash
export OUT
BUILD_PLAIN=0 STAGES="build" bash scripts/gpu_check.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
rm -f $OUT/logs.tar.gz $OUT/summary.txt
timeout 100 python -m gemmt bench moe --quick --only layer --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -A9 "MoE layer" $OUT/bench.log | head -10
timeout 40 python -m pytest -q tests/test_scaled_grouped_mm.py -k "float8_moe" > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/tests.log
