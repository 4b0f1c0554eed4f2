#!/usr/bin/env bash
# On a CUDA machine, in one go: build gemmt (pip and plain CMake), run the standalone kernel
# self-tests, the whole pytest suite (CUDA cases included), the demo, and the benchmarks.
# Logs and JSON go under $OUT (default ./gpu-out); a summary is printed last.
#   STAGES="build selftest prepare test slow demo linear bench fp64 mm tune fp8 moe fp8_quant
#   extra compare profile sanitize" (default: all
#   but profile and sanitize); "buildtime" alone times the pip build (cold, then after touching
#   one kernel file) and records each translation unit's compile time and the module's size.
#   BENCH_ARGS="--quick"   passed to python -m gemmt bench
cd "$(dirname "$0")/.."
STAGES=${STAGES:-"build selftest prepare test slow demo linear bench fp64 mm tune"}
source scripts/stages.sh
# PYTEST_TARGETS narrows the test stage (default: the whole suite); PYTEST_ARGS adds options
# (-k ..., --durations=20); TEST_TIMEOUT and BENCH_TIMEOUT (seconds) bound a stage.
PYTEST_TARGETS=${PYTEST_TARGETS:-tests}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

{
  nvidia-smi
  nvcc --version
  $PY -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  cmake --version | head -1
  echo "ninja $(ninja --version 2>/dev/null)"
  nproc
} >"$LOGS/environment.txt" 2>&1
note "device: $($PY -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null)"

if has buildtime; then
  # The pip build alone on every core, cold, then after touching one kernel file; then what
  # each translation unit took (.ninja_log) and what the module's size is made of.
  rm -rf build/cp*
  if [ -n "${BEFORE_TREE:-}" ]; then
    # The other tree's cold pip build first, on the same machine (its module stays in its
    # build folder for the compare stage; this tree's install replaces its package).
    rm -rf "$BEFORE_TREE"/build
    stage "pip install $BEFORE_TREE, cold" "$LOGS/pip_cold_before.log" \
      $PY -m pip install --no-build-isolation --no-deps -v "$(cd "$BEFORE_TREE" && pwd)"
  fi
  stage "pip install, cold" "$LOGS/pip_cold.log" \
    $PY -m pip install --no-build-isolation --no-deps -v .
  touch kernels/elementwise.cu
  stage "pip install, one kernel touched" "$LOGS/pip_touch.log" \
    $PY -m pip install --no-build-isolation --no-deps -v .
  bdir=$(ls -d build/cp* | head -n1)
  $PY scripts/build_report.py "$bdir" --json "$OUT/build_report.json" | tee -a "$SUMMARY"
  $PY -X importtime -c "import gemmt" 2>"$LOGS/importtime.log"
  $PY -c "import time; t=time.perf_counter(); import torch; t1=time.perf_counter(); import gemmt; t2=time.perf_counter(); print(f'import torch {t1-t:.3f} s, then import gemmt {t2-t1:.3f} s (ops registered: {hasattr(torch.ops.gemmt, \"mm\")})')" | tee -a "$SUMMARY"
fi

if has compare && [ -n "${BEFORE_TREE:-}" ]; then
  # Another tree of gemmt (BEFORE_TREE: for example `git archive <rev> | tar -x -C before`)
  # built as a module for this GPU, then the 16-bit GEMM class timed in both builds,
  # alternating processes (scripts/compare_builds.py). Needs the pip build of this tree.
  before_lib=$(ls "$BEFORE_TREE"/build/cp*/_gemmt*.so 2>/dev/null | head -n1)
  if [ -z "$before_lib" ]; then  # no pip build of it (the buildtime stage makes one)
    stage "cmake build of $BEFORE_TREE" "$LOGS/before_build.log" \
      bash -c "cmake -S $BEFORE_TREE -B $BEFORE_TREE/build -G Ninja -DPython_EXECUTABLE=$(command -v $PY) && cmake --build $BEFORE_TREE/build"
    before_lib=$(ls "$BEFORE_TREE"/build/_gemmt*.so | head -n1)
  fi
  after_lib=$($PY -c "import gemmt._native as n; print(n.library_path())")
  stage "compare builds" "$LOGS/compare_builds.log" $PY scripts/compare_builds.py \
    --before "$before_lib" --before-python "$BEFORE_TREE/python" --after "$after_lib" \
    --out "$OUT/compare_builds.json" ${COMPARE_ARGS:-}
  tail -n 50 "$LOGS/compare_builds.log" >>"$SUMMARY"
fi

if has build; then
  # The plain CMake build runs beside the pip build; both use every core.
  # BUILD_PLAIN=0 skips the plain CMake build (it shares the cores with the pip build).
  cmake_pid=""
  if [ "${BUILD_PLAIN:-1}" != 0 ]; then
    (stage "cmake build (plain)" "$LOGS/cmake_build.log" \
       bash -c "cmake -S . -B build/cmake-gpu -G Ninja -DPython_EXECUTABLE=$(command -v $PY) -DGEMMT_BUILD_SELFTESTS=$(has selftest && echo ON || echo OFF) && cmake --build build/cmake-gpu") &
    cmake_pid=$!
  fi
  stage "pip install (scikit-build)" "$LOGS/pip_build.log" \
    $PY -m pip install --no-build-isolation --no-deps -v .
  [ -n "$cmake_pid" ] && wait $cmake_pid
  $PY -c "import gemmt, json; print(json.dumps(gemmt.build_info()))" >>"$SUMMARY" 2>&1
  cuobjdump --dump-sass build/cmake-gpu/_gemmt*.so 2>/dev/null | grep -c "HGMMA" \
    | xargs -I{} echo "HGMMA instructions in the module's SASS: {}" | tee -a "$SUMMARY"
  # The Hopper kernels' SASS, kept with the logs (the wgmma issue pattern, register use).
  for wg_obj in $(find build/cmake-gpu -path '*sm90*' -name 'instances_*.cu.o' | sort); do
    cuobjdump --dump-sass "$wg_obj"
  done >"$LOGS/gemm_sm90_wgmma.sass" 2>&1
fi

if has selftest; then
  for t in tests/cuda/*_selftest.cu; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .cu)
    # CMake targets of the plain build (GEMMT_BUILD_SELFTESTS=ON, tests/cuda/CMakeLists.txt),
    # linked against its kernel library: same flags, same architectures. The build stage
    # compiled them already; this records the step (and builds them if that stage was skipped).
    stage "compile $name" "$LOGS/${name}_build.log" \
      cmake --build build/cmake-gpu --target "$name"
    args=()
    # The SIMT self-test also times every tile configuration of the pipelined kernel.
    [ "$name" = gemm_simt_selftest ] && args=(-q -bench -sweep)
    # The tensor-core self-test also times every split-k count on the narrow and long-k shapes.
    # TC_SELFTEST_ARGS replaces that (e.g. "--no-perf --decode-sweep").
    [ "$name" = gemm_tc_selftest ] && args=(${TC_SELFTEST_ARGS:---sweep --decode-sweep})
    stage "run $name" "$LOGS/${name}.log" timeout 400 "build/cmake-gpu/bin/$name" "${args[@]}"
    grep "^BENCH\|^SWEEP\|^TCSWEEP\|^DECODESWEEP" "$LOGS/${name}.log" >>"$SUMMARY"
    tail -n 5 "$LOGS/${name}.log" >>"$SUMMARY"
  done
fi

if has prepare; then
  # The kernel groups the build compiles on first use (include/gemmt/deferred.h), all at once
  # ahead of the tests, so that no test's time includes a compile.
  stage "python -m gemmt prepare" "$LOGS/prepare.log" $PY -m gemmt prepare
  tail -n 8 "$LOGS/prepare.log" | tee -a "$SUMMARY"
fi

if has test; then
  stage "pytest (all but slow)" "$LOGS/pytest.log" ${TEST_TIMEOUT:+timeout $TEST_TIMEOUT} \
    $PY -m pytest $PYTEST_TARGETS -q -m "not slow" -rfE -p no:cacheprovider --timeout 600 \
    ${PYTEST_ARGS:-}
  tail -n 3 "$LOGS/pytest.log" | tee -a "$SUMMARY"
  cp docs/bad_input_matrix_*.md "$LOGS/" 2>/dev/null
fi

if has fp64; then
  stage "bench gemm_fp64" "$LOGS/bench_fp64.log" ${BENCH_TIMEOUT:+timeout $BENCH_TIMEOUT} $PY -m gemmt bench gemm_fp64 --out "$OUT" ${BENCH_ARGS:-}
  grep -v "it/s\|s/it" "$LOGS/bench_fp64.log" | tail -n 20 >>"$SUMMARY"
fi

if has mm; then
  stage "bench mm" "$LOGS/bench_mm.log" ${BENCH_TIMEOUT:+timeout $BENCH_TIMEOUT} $PY -m gemmt bench mm --out "$OUT" ${BENCH_ARGS:-}
  grep -v "it/s\|s/it" "$LOGS/bench_mm.log" | tail -n 60 >>"$SUMMARY"
fi

if has tune && $PY -m gemmt bench --help 2>/dev/null | grep -q tune; then
  stage "bench tune" "$LOGS/bench_tune.log" ${BENCH_TIMEOUT:+timeout $BENCH_TIMEOUT} $PY -m gemmt bench tune --out "$OUT" ${TUNE_ARGS:-}
  grep -v "it/s\|s/it" "$LOGS/bench_tune.log" | tail -n 60 >>"$SUMMARY"
fi

# FP8_ARGS / MOE_ARGS: e.g. "--quick --only gemm,quant" (the new suites, each bounded by
# BENCH_TIMEOUT like the others).
for suite in fp8 moe fp8_quant; do
  if has $suite; then
    args_var=$(echo "${suite}_ARGS" | tr a-z A-Z)
    stage "bench $suite" "$LOGS/bench_$suite.log" ${BENCH_TIMEOUT:+timeout $BENCH_TIMEOUT} \
      $PY -m gemmt bench $suite --out "$OUT" ${!args_var:-}
    grep -v "it/s\|s/it" "$LOGS/bench_$suite.log" | tail -n 60 >>"$SUMMARY"
  fi
done

# EXTRA_PY: a Python script run with $OUT as its argument (a one-off measurement).
if has extra && [ -n "${EXTRA_PY:-}" ]; then
  stage "extra: $EXTRA_PY" "$LOGS/extra.log" $PY $EXTRA_PY "$OUT/extra.json"
  grep -v "it/s\|s/it" "$LOGS/extra.log" | tail -n 80 >>"$SUMMARY"
fi

if has demo; then
  stage "python -m gemmt" "$LOGS/demo.log" $PY -m gemmt
  cat "$LOGS/demo.log" >>"$SUMMARY"
fi

if has linear; then
  # LINEAR_ARGS: e.g. "--sections decode,fused" (default: every section).
  stage "bench linear" "$LOGS/bench_linear.log" $PY -m gemmt bench linear --out "$OUT" \
    ${LINEAR_ARGS:-}
  grep -v "it/s\|s/it" "$LOGS/bench_linear.log" | tail -n 150 >>"$SUMMARY"
fi

if has bench; then
  stage "bench memory" "$LOGS/bench_memory.log" $PY -m gemmt bench memory --out "$OUT" ${BENCH_ARGS:-}
  stage "bench gemm" "$LOGS/bench_gemm.log" $PY -m gemmt bench gemm --out "$OUT" ${BENCH_ARGS:-}
  stage "fp32 square rounds" "$LOGS/fp32_square_rounds.log" \
    $PY scripts/fp32_square_rounds.py --out "$OUT"
  grep -v "it/s\|s/it" "$LOGS/bench_memory.log" | tail -n 35 >>"$SUMMARY"
  grep -v "it/s\|s/it" "$LOGS/bench_gemm.log" | tail -n 90 >>"$SUMMARY"
  cat "$LOGS/fp32_square_rounds.log" >>"$SUMMARY"
fi

if has profile; then
  # Per-kernel durations of the shapes furthest from target (staging, main, reduction).
  stage "ncu gemm breakdown" "$LOGS/ncu_gemm.log" \
    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    $PY scripts/profile_gemm.py
  grep -E "Context [0-9]+, Stream|Duration|Compute \(SM\) Throughput|Memory Throughput" \
    "$LOGS/ncu_gemm.log" | sed -E 's/\(([^()]|\([^()]*\))*\)//; s/  +/ /g' | cut -c1-160 >>"$SUMMARY"
fi

# The slow tests (builds: JIT, setuptools, pip, CMake) are CPU-bound and the sanitizer does
# not time anything, so the two share the machine after the benchmarks are done.
if has sanitize; then
  bash scripts/sanitize.sh "$OUT" >"$OUT/sanitize_summary.txt" 2>&1 &
  sanitize_pid=$!
fi
if has slow; then
  GEMMT_TEST_CMAKE_BUILD=$ROOT/build/cmake-gpu stage "pytest slow (4 ways in)" \
    "$LOGS/pytest_slow.log" $PY -m pytest tests -q -m slow -rfE -p no:cacheprovider --timeout 1200
  tail -n 3 "$LOGS/pytest_slow.log" | tee -a "$SUMMARY"
fi
if has sanitize; then
  wait "$sanitize_pid"
  cat "$OUT/sanitize_summary.txt" >>"$SUMMARY"
fi

tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
echo "==== summary"
cat "$SUMMARY"
