// The Hopper GEMM's launchers, one translation unit per operand kind
// (instances_<kind>.cu), called by gemm_sm90.cu with a plan of kernels/plan/sm90_plan.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "plan/sm90_plan.h"

namespace gemmt {
namespace sm90 {

// The operands' tensor maps; c is only encoded (and read) when the launch stores C by TMA.
struct Maps {
  CUtensorMap a, b, c;
};

// What the launch decides besides the plan.
struct Launch {
  int cluster = 1;         // CTAs per cluster: 2 multicasts each B tile to a pair
  bool tma_store = false;  // C goes out through shared memory and TMA
  SplitPlan split;         // k-slices; more than one needs `partial`
  float* partial = nullptr;
};

cudaError_t launch_bf16(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream);
cudaError_t launch_f16(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                       cudaStream_t stream);
cudaError_t launch_tf32(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream);

}  // namespace sm90
}  // namespace gemmt
