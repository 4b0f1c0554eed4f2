// The SIMT family's launchers, one translation unit each (kernels/simt/*.cu), called by
// simt_family.cu with the plans of kernels/plan/simt_plan.h.
#pragma once

#include <cuda_runtime.h>

#include "gemmt/gemm.h"
#include "plan/simt_plan.h"

namespace gemmt {
namespace simt {

// Ladder steps 1-4 (ladder_1_naive.cu .. ladder_4_warp_tiled.cu).
cudaError_t run_naive(const GemmArgs& a, cudaStream_t stream);
cudaError_t run_smem_tiled(const GemmArgs& a, cudaStream_t stream);
cudaError_t run_register_blocked(const GemmArgs& a, cudaStream_t stream);
cudaError_t run_warp_tiled(const GemmArgs& a, cudaStream_t stream);

// Step 5 and 6 (pipelined_launch.cu): runs a pipelined plan on the arguments as given;
// c_transposed writes C column-major (a plan of transposed_problem, without split-k).
cudaError_t run_pipelined(const GemmArgs& a, const PipePlan& plan, float* workspace,
                          cudaStream_t stream, bool c_transposed = false);
// A family plan: on transposed_problem(a) when it is swapped, and after copying a K-major B
// N-major into the front of the workspace when it says so (SimtFamilyPlan::staged_b).
cudaError_t run_pipelined_staged(const GemmArgs& a, const SimtFamilyPlan& plan, void* workspace,
                                 cudaStream_t stream);
// The compiled pipelined instances, as the planner sees them on the current device.
PipeCatalog device_pipe_catalog();

// One compiled instance of the pipelined kernel (pipelined_*.cu): its host stub and what the
// device said about it.
struct PipeKernel {
  const void* fn = nullptr;
  int error = 0;
  int blocks_per_sm = 0;
};
PipeKernel pipe_kernel(ScalarType t, PipeTile tile, LoadMode a, LoadMode b, bool interior,
                       bool stream_k);
// The instance translation units, one per dtype and tile (and interior form).
PipeKernel pipe_kernel_f32_medium(LoadMode a, LoadMode b, bool stream_k);
PipeKernel pipe_kernel_f32_medium_interior(LoadMode a, LoadMode b, bool stream_k);
PipeKernel pipe_kernel_f32_small(LoadMode a, LoadMode b, bool stream_k);
PipeKernel pipe_kernel_f32_narrow(LoadMode a, LoadMode b, bool stream_k);
PipeKernel pipe_kernel_f32_skinny(LoadMode a, LoadMode b, bool stream_k);
PipeKernel pipe_kernel_f16_small(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_bf16_small(LoadMode a, LoadMode b);
// Which of a set's instances a translation unit compiles, by loader mode: all of them, those
// whose loaders both read vectors, or those with an element-wise (kScalar) loader. The float32
// sets split the two: the element-wise ones serve only operands whose rows or start are not
// 16-byte aligned, and compile in their own translation units (pipelined_f32_<tile>_scalar.cu,
// picked by pipelined_f32_scalar.cu), which a build may compile on first use
// (include/gemmt/deferred.h, group simt32_scalar).
enum class LoaderSet { kAll, kVector, kScalar };
constexpr bool in_loader_set(LoaderSet set, int a, int b) {
  const bool vector = (a == kVecC || a == kVecK) && (b == kVecC || b == kVecK);
  return set == LoaderSet::kAll || (set == LoaderSet::kVector) == vector;
}

// The float32 instances with an element-wise loader, a translation unit per tile that has
// them, and the pick among them (pipelined_f32_scalar.cu).
PipeKernel pipe_kernel_f32_small_scalar(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_f32_medium_scalar(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_f32_large_scalar(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_f32_fat_scalar(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_f32_narrow_scalar(LoadMode a, LoadMode b);
PipeKernel pipe_kernel_f32_scalar(PipeTile tile, LoadMode a, LoadMode b);

// The heaviest sets (float32 Large and Fat, Fat's interior form, 16-bit Large) are split
// further by A's loader mode, one translation unit each (pipelined_<dtype>_<tile>_a_<mode>.cu):
// each whole set was one of the build's longest steps. Only the modes with instances
// (pipe_instance_built for some B mode) are defined.
template <ScalarType kT, PipeTile kTile, bool kInterior, int kAMode,
          LoaderSet kSet = LoaderSet::kAll>
PipeKernel pipe_kernel_a(LoadMode b, bool stream_k);

// Whether (t, tile, interior) has an instance in `set` for A's loader mode a and some B mode.
constexpr bool a_mode_built(ScalarType t, PipeTile tile, LoadMode a, bool interior, LoaderSet set) {
  for (int b = 0; b < kNumLoadModes; ++b) {
    if (pipe_instance_built(t, tile, a, static_cast<LoadMode>(b), interior, false) &&
        in_loader_set(set, a, b)) {
      return true;
    }
  }
  return false;
}

template <ScalarType kT, PipeTile kTile, bool kInterior, int kAMode, LoaderSet kSet>
PipeKernel by_b_mode(LoadMode b, bool stream_k) {
  if constexpr (a_mode_built(kT, kTile, static_cast<LoadMode>(kAMode), kInterior, kSet)) {
    return pipe_kernel_a<kT, kTile, kInterior, kAMode, kSet>(b, stream_k);
  } else {
    return PipeKernel{};
  }
}

// The sets split by A's loader mode (launchers.h: pipe_kernel_a).
template <ScalarType kT, PipeTile kTile, bool kInterior, LoaderSet kSet = LoaderSet::kAll>
PipeKernel by_a_mode(LoadMode a, LoadMode b, bool stream_k) {
  return with_load_mode(a, [&](auto am) {
    return by_b_mode<kT, kTile, kInterior, decltype(am)::value, kSet>(b, stream_k);
  });
}

// The 16-bit instances (pipelined_{f16,bf16}_*.cu), picked in their own translation unit
// (pipelined_16bit.cu) so that a build may compile them on first use (include/gemmt/deferred.h,
// group simt16): on sm_80 and later the tensor-core kernels take 16-bit products, and these
// run only when a caller names the pipelined or split-k variant.
PipeKernel pipe_kernel_16bit(ScalarType t, PipeTile tile, LoadMode a, LoadMode b);

// Step 6 (split_k_reduce.cu): C = alpha * (sum of `splits` float32 slices [splits][m][n]) +
// beta * C, slices added in order.
cudaError_t reduce_slices(const GemmArgs& a, const float* slices, int splits, cudaStream_t stream);
// The split gemv's finish: out[c * cs] = alpha * sum_s ws[s * cols + c] + beta * out[c * cs].
cudaError_t reduce_vector_slices(ScalarType t, const float* ws, int splits, int64_t cols, void* out,
                                 int64_t cs, float alpha, float beta, cudaStream_t stream);

// Step 7 (gemv.cu).
cudaError_t run_gemv(const GemmArgs& a, const GemvPlan& plan, float* workspace,
                     cudaStream_t stream);

}  // namespace simt
}  // namespace gemmt
