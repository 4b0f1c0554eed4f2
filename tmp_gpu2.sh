#!/bin/bash
export OUT
BUILD_PLAIN=0 STAGES="build" bash scripts/gpu_check.sh > /dev/null 2>&1
cp $OUT/summary.txt $OUT/build_summary.txt
python -c "import gemmt; print(gemmt.prepare_kernels(['decode','simt16']))" > /dev/null 2>&1
mkdir -p $OUT/t $OUT/h
echo "== tune decode"; timeout 150 python -m gemmt bench tune --sections decode --out $OUT/t 2>&1 | tail -1
echo "== held-out decode class"
timeout 250 python -c "
from pathlib import Path
import gemmt.bench_tune as b
b.DECODE_TOKENS = [72, 80, 96, 112, 136, 144, 176, 192, 224, 240]
b.DECODE_WEIGHTS = [(2048, 4096), (3072, 4096), (4096, 4096), (6144, 4096), (5120, 5120), (3584, 3584)]
b.run(Path('$OUT/h'), sections='decode')
" 2>&1 | tail -1
