// Launches the pipelined SIMT kernel (ladder_5_pipelined.cuh) with a plan of
// kernels/plan/simt_plan.cpp: the data-parallel grid, the stream-k blocks of the last wave
// (step 5b), or the k-slices of split-k (step 6) followed by their reduction. Also the copy of
// a K-major B that the plan may ask for, and the catalog through which the planner sees the
// compiled instances.
#include <cuda_runtime.h>

#include "common/strided_copy.cuh"
#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/ladder_5_pipelined.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel(ScalarType t, PipeTile tile, LoadMode a, LoadMode b, bool interior,
                       bool stream_k) {
  if (!pipe_instance_built(t, tile, a, b, interior, stream_k)) return PipeKernel{};
  if (t == ScalarType::kFloat16 || t == ScalarType::kBFloat16)
    return pipe_kernel_16bit(t, tile, a, b);
  if (!in_loader_set(LoaderSet::kVector, a, b)) return pipe_kernel_f32_scalar(tile, a, b);
  switch (tile) {
    case PipeTile::kLarge:
      return by_a_mode<ScalarType::kFloat32, PipeTile::kLarge, false, LoaderSet::kVector>(a, b,
                                                                                          stream_k);
    case PipeTile::kMedium:
      return interior ? pipe_kernel_f32_medium_interior(a, b, stream_k)
                      : pipe_kernel_f32_medium(a, b, stream_k);
    case PipeTile::kSmall:
      return pipe_kernel_f32_small(a, b, stream_k);
    case PipeTile::kFat:
      return interior ? by_a_mode<ScalarType::kFloat32, PipeTile::kFat, true>(a, b, stream_k)
                      : by_a_mode<ScalarType::kFloat32, PipeTile::kFat, false, LoaderSet::kVector>(
                            a, b, stream_k);
    case PipeTile::kNarrow:
      return pipe_kernel_f32_narrow(a, b, stream_k);
    case PipeTile::kSkinny:
      return pipe_kernel_f32_skinny(a, b, stream_k);
    default:
      return PipeKernel{};
  }
}

namespace {

PipeInstance query_device(ScalarType t, PipeTile tile, LoadMode a, LoadMode b, bool interior,
                          bool stream_k) {
  const PipeKernel k = pipe_kernel(t, tile, a, b, interior, stream_k);
  PipeInstance inst;
  inst.built = k.fn != nullptr || k.error != 0;
  inst.error = k.error;
  inst.blocks_per_sm = k.blocks_per_sm;
  return inst;
}

}  // namespace

PipeCatalog device_pipe_catalog() {
  PipeCatalog cat;
  cat.query = &query_device;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  cat.device = device;
  return cat;
}

cudaError_t run_pipelined(const GemmArgs& a, const PipePlan& plan, float* workspace,
                          cudaStream_t stream, bool c_transposed) {
  if (plan.error != kPlanOk) {
    return plan.error == kPlanNotSupported ? cudaErrorNotSupported
                                           : static_cast<cudaError_t>(plan.error);
  }
  if (c_transposed && (plan.splits > 1 || plan.choice.a_mode != kVecK))
    return cudaErrorInvalidValue;
  const PipeChoice& ch = plan.choice;
  PipeParams p{};
  p.a = a.a;
  p.sam = a.a_stride_m;
  p.sak = a.a_stride_k;
  p.b = a.b;
  p.sbk = a.b_stride_k;
  p.sbn = a.b_stride_n;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.c = a.c;
  p.ldc = a.ldc;
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.c_vec4 = out_vec4(a, c_transposed);
  p.c_transposed = c_transposed;
  p.epi = make_epilogue_params(a.epilogue);
  p.partial = plan.splits > 1 ? workspace : nullptr;
  p.partial_vec4 = a.n % 4 == 0;
  p.k_per_split = plan.k_per_split;
  p.tiles_m = plan.tiles_m;
  p.tiles_n = plan.tiles_n;
  if ((plan.splits > 1 || plan.streamk_blocks > 0) && workspace == nullptr)
    return cudaErrorInvalidValue;
  void* args[] = {&p};
  const int64_t tiles = static_cast<int64_t>(plan.tiles_m) * plan.tiles_n;
  if (plan.streamk_blocks > 0) {
    // The stream-k blocks take the last streamk_tiles tiles of the launch order; the
    // data-parallel grid below covers the ones before.
    const PipeKernel sk = pipe_kernel(a.dtype, ch.tile, ch.a_mode, ch.b_mode, ch.interior, true);
    if (sk.fn == nullptr) return cudaErrorNotSupported;
    StreamKParams& s = p.stream_k;
    s.first_tile = static_cast<int>(tiles - plan.streamk_tiles);
    s.k_tiles = static_cast<int>(ceil_div(a.k, ch.bk));
    s.iters = plan.streamk_iters;
    s.extra = plan.streamk_extra;
    s.arrivals = reinterpret_cast<int*>(workspace);
    s.slots =
        reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) + streamk_counter_bytes(plan));
    GEMMT_RETURN_IF_ERROR(
        cudaMemsetAsync(s.arrivals, 0, static_cast<std::size_t>(plan.streamk_tiles) * 4, stream));
    GEMMT_RETURN_IF_ERROR(cudaLaunchKernel(sk.fn, dim3(plan.streamk_blocks), dim3(ch.threads), args,
                                           ch.smem, stream));
    if (tiles == plan.streamk_tiles) return cudaSuccess;
  }
  const PipeKernel k = pipe_kernel(a.dtype, ch.tile, ch.a_mode, ch.b_mode, ch.interior, false);
  if (k.fn == nullptr) return cudaErrorNotSupported;
  const dim3 grid(static_cast<unsigned>(tiles - plan.streamk_tiles), 1,
                  static_cast<unsigned>(plan.splits));
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernel(k.fn, grid, dim3(ch.threads), args, ch.smem, stream));
  if (plan.splits > 1) return reduce_slices(a, workspace, plan.splits, stream);
  return cudaSuccess;
}

// ---- K-major B (a @ b.t()) ---------------------------------------------------------------
// The pipelined kernel reads a K-major B through transposing shared-memory stores; at 4096^3
// that layout ran at 0.84 of cuBLAS against 0.94 for an N-major B. When m is large enough
// that one pass over B costs a few percent of the product (2 * 4 * k * n bytes against
// 2 * m * n * k FLOPs: ~4% at m = 2048), B is first copied N-major, rows padded to 16 bytes,
// into the front of the workspace and the kernel runs on the copy. Split-k partials follow.
// A plan of the transposed product (SimtFamilyPlan::swapped) does the same for C^T = B^T A^T,
// whose B is the caller's A, and stores C column-major.
cudaError_t run_pipelined_staged(const GemmArgs& args, const SimtFamilyPlan& plan, void* workspace,
                                 cudaStream_t stream) {
  const GemmArgs a = plan.swapped ? transposed_problem(args) : args;
  if (!plan.staged_b)
    return run_pipelined(a, plan.pipe, static_cast<float*>(workspace), stream, plan.swapped);
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t pitch = staged_b_pitch(a);
  GEMMT_RETURN_IF_ERROR(copy_2d_bits(static_cast<int>(elem_bytes(a.dtype)), a.b, a.b_stride_k,
                                     a.b_stride_n, a.k, a.n, workspace, pitch, stream));
  const GemmArgs s = with_staged_b(a, workspace);
  float* partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + staged_b_bytes(a));
  return run_pipelined(s, plan.pipe, partial, stream, plan.swapped);
}

}  // namespace simt
}  // namespace gemmt
