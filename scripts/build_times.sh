#!/usr/bin/env bash
# Build times of the kernel library and module: a cold configure + build, then incremental
# rebuilds after touching one kernel file, the largest kernel file and one wrapper file.
# Usage: scripts/build_times.sh [jobs] [build dir] > result.txt
# The default configuration is the one a machine without a GPU gets: a CPU-only module, every
# kernels/**/*.cu compiled by nvcc for the default architectures (80-real;90a-real).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-2}
dir=${2:-build/build_times}
rm -rf "$dir"
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
echo "load before: $(uptime | sed 's/.*load average: //')"
t=$(now)
cmake -S . -B "$dir" -G Ninja >/dev/null
configure=$(since "$t")
t=$(now)
cmake --build "$dir" -j "$jobs" >/dev/null
echo "configure $configure s, cold build $(since "$t") s (-j$jobs)"
for f in kernels/simt/ladder_3_register_blocked.cu kernels/simt/pipelined_f32_fat_a_vecc.cu \
         kernels/sm90/gemm_sm90.cu kernels/elementwise.cu pytorch_wrapper/gemm_ops.cpp; do
  [ -f "$f" ] || continue
  touch "$f"
  t=$(now)
  cmake --build "$dir" -j "$jobs" >/dev/null
  echo "touch $f: $(since "$t") s"
done
echo "load after: $(uptime | sed 's/.*load average: //')"
