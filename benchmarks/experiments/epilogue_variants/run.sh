#!/usr/bin/env bash
# tile_phases builds side by side, run in alternating order; each prints its untraced kernel
# time and a hash of C per shape. VARIANTS lists name:define pairs (default: the TMA store
# against the generic store of generic_store.patch, which must then be applied).
# Usage (repository root, sm_90a machine): VARIANTS="..." bash benchmarks/experiments/epilogue_variants/run.sh
set -u
OUT=${OUT:-$PWD/epilogue_variants-out}
mkdir -p "$OUT"
VARIANTS=${VARIANTS:-"tma: generic:-DGEMMT_SM90_GENERIC_STORE"}
FLAGS="-O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -DGEMMT_HAS_SM90A -Iinclude -Ikernels"
SRC=benchmarks/experiments/tile_phases/tile_phases.cu
names=()
for v in $VARIANTS; do
  name=${v%%:*}
  def=${v#*:}
  names+=("$name")
  nvcc $FLAGS $def $SRC -o "/tmp/tp_$name" -Xptxas -v 2>"$OUT/ptxas_$name.txt" &
done
wait
for name in "${names[@]}"; do echo "$name: $(grep -h spill "$OUT/ptxas_$name.txt" | head -1)"; done
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; nvcc --version | tail -2; } >"$OUT/env.txt" 2>&1
run() {  # variant, label, args...
  local b=$1 label=$2
  shift 2
  echo "### $b $label" >>"$OUT/$b.log"
  timeout 120 "/tmp/tp_$b" "$@" >>"$OUT/$b.log" 2>&1 || echo "== $b $label failed"
}
order=("${names[@]}")
for rep in 1 2; do
  for b in "${order[@]}"; do
    run "$b" "11008x4096 K sweep" 11008 4096
    run "$b" "2048x11008x4096" 2048 11008 x 4096
  done
  # the second pass in reverse order
  rev=()
  for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev+=("${order[i]}"); done
  order=("${rev[@]}")
done
for b in "${names[@]}"; do
  echo "--- $b"
  grep -E "^(===|kernel|C hash)" "$OUT/$b.log" | paste - - - |
    sed -E 's/ \([0-9]+ x [0-9]+ x [0-9]+; the phases follow\)//; s/ bf16, A and B K-major, 128x256 tiles in CTA pairs, staged \(TMA\) store, grid for 132 SMs ===//; s/ \(median of 30, untraced\); traced span [0-9.]+ us; clock/ @/; s/NaN outputs/NaN/' |
    awk -F'\t' '{print $2, $3, $1}'
done
