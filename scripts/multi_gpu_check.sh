#!/usr/bin/env bash
# On a machine with two GPUs or more, in one go: build gemmt's module, then run what needs
# several GPUs: the tests on cuda:1, the distributed tests (NCCL groups of 2, and of 4 where
# there are 4 GPUs), the distributed training example under torchrun, and the MLP block's
# tensor-parallel scaling benchmark. Logs and JSON go under $OUT (default ./gpu-out).
#   STAGES="build devices distributed example scaling suite" (default: all but suite)
cd "$(dirname "$0")/.."
STAGES=${STAGES:-"build devices distributed example scaling"}
source scripts/stages.sh
BUILD=${BUILD_DIR:-build/multi-gpu}
# NVLink multicast stays off (shared hosts); every process started below inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

{
  nvidia-smi
  nvidia-smi topo -m
  nvcc --version | tail -2
  $PY -c "import torch; print(torch.__version__, torch.version.cuda, 'nccl', torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} >"$LOGS/environment.txt" 2>&1
note "devices: $($PY -c 'import torch; print(torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))' 2>/dev/null)"

if has build; then
  stage "build (cmake, _gemmt)" "$LOGS/build.log" bash -c \
    "cmake -S . -B $BUILD -G Ninja -DPython_EXECUTABLE=$(command -v $PY) && cmake --build $BUILD -j$(nproc) --target _gemmt" \
    || { note "build failed"; exit 1; }
fi
GEMMT_LIBRARY=$(ls "$ROOT/$BUILD"/_gemmt*.so 2>/dev/null | head -1)
export GEMMT_LIBRARY PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
note "library: $GEMMT_LIBRARY"

has devices && stage "tests on cuda:1" "$LOGS/pytest_second_device.log" \
  timeout 300 $PY -m pytest tests/test_streams_threads.py -v -rs -k "second_device"
has distributed && stage "distributed tests (gloo, NCCL)" "$LOGS/pytest_distributed.log" \
  timeout 500 $PY -m pytest tests/test_distributed.py -v -rs
if has example; then
  NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())')
  stage "example: TP on 2 GPUs" "$LOGS/example_tp.log" \
    timeout 200 $PY -m torch.distributed.run --nproc-per-node 2 examples/distributed/train_mlp.py \
    --mode tp --dim 1024 --hidden 2816 --layers 2 --batch 4 --seq 256 --optim sgd
  stage "example: FSDP2 on 2 GPUs" "$LOGS/example_fsdp.log" \
    timeout 200 $PY -m torch.distributed.run --nproc-per-node 2 examples/distributed/train_mlp.py \
    --mode fsdp --dim 1024 --hidden 2816 --layers 2 --batch 4 --seq 256 --optim sgd
  if [ "$NGPU" -ge 4 ]; then
    stage "example: 2-D mesh on 4 GPUs" "$LOGS/example_2d.log" \
      timeout 200 $PY -m torch.distributed.run --nproc-per-node 4 \
      examples/distributed/train_mlp.py --mode 2d --dim 1024 --hidden 2816 --optim sgd
  fi
fi
has scaling && stage "MLP tensor-parallel scaling" "$LOGS/mlp_tp_scaling.log" \
  timeout 400 $PY benchmarks/mlp_tp_scaling.py --out "$OUT/scaling" --gpus "${SCALING_GPUS:-1,2}"
has suite && stage "whole suite (not slow)" "$LOGS/pytest.log" \
  timeout 560 $PY -m pytest tests -q -m "not slow" -rs -p no:cacheprovider
cat "$SUMMARY"
