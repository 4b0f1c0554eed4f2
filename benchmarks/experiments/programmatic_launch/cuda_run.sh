# Shared by the experiment scripts that run on a CUDA machine (sourced, from the repository
# root): experiment_start NAME sets OUT (a work folder under $OUT, default ./NAME-out) and PY,
# switches to compilers that link torch's libstdc++ (python/gemmt/_toolchain.py) and records
# the machine in env.txt; experiment_build TARGET... builds build/g (sm_90a, self-tests on);
# experiment_pack packs the work folder into NAME.tgz beside it, as often as called;
# has STEP tells whether STEP is among $STEPS, and step NAME TIMEOUT CMD... runs CMD into
# $OUT/NAME.log, prints its status and tail ($TAIL lines) and packs.
experiment_start() {
  EXPERIMENT=$1
  EXPERIMENT_FINAL=${OUT:-$PWD/$EXPERIMENT-out}
  OUT=$EXPERIMENT_FINAL/work
  mkdir -p "$OUT"
  PY=$(command -v python3)
  eval "$("$PY" python/gemmt/_toolchain.py)"
  { nvidia-smi; nvcc --version; "$PY" -c "import torch; print(torch.__version__, torch.version.cuda)"
    git log -1 --format=%H 2>/dev/null; } >"$OUT/env.txt" 2>&1
}

experiment_build() {
  local t0
  t0=$(date +%s)
  cmake -S . -B build/g -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DGEMMT_BUILD_SELFTESTS=ON \
    -DPython_EXECUTABLE="$PY" >"$OUT/cmake.log" 2>&1 &&
    cmake --build build/g -j"$(nproc)" --target "$@" >"$OUT/build.log" 2>&1 ||
    { tail -n 40 "$OUT/build.log"; experiment_pack; return 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  export PYTHONPATH=$PWD/python GEMMT_LIBRARY
  GEMMT_LIBRARY=$(ls "$PWD"/build/g/_gemmt*.so 2>/dev/null)
}

experiment_pack() {
  tar -czf "$EXPERIMENT_FINAL/$EXPERIMENT.tgz" -C "$OUT" .
}

has() { [[ " $STEPS " == *" $1 "* ]]; }

step() {
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: rc $? in $(( $(date +%s) - t0 )) s"
  tail -n "${TAIL:-4}" "$OUT/$name.log"
  experiment_pack
}
