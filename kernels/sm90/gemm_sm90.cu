// The Hopper GEMM family's host side (the kernel: kernels/sm90/kernel.cuh): tensor maps,
// staging of operands TMA cannot read, launches, split-k, and the entry points of gemmt/gemm.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "common/strided_copy.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/gemm_tc_hooks.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/sm90_plan.h"
#include "sm90/launchers.h"
#include "sm90/tensor_map.h"

namespace gemmt {
namespace {

// ---- Host side ---------------------------------------------------------------------
// Planning (tensor maps, tile width, split-k, staging): kernels/plan/sm90_plan.cpp.
using namespace sm90;
using sm90::Launch;
using sm90::Maps;

// Whether this build holds the kernels (compiled for sm_90a); the planner refuses every
// problem otherwise.
#if defined(GEMMT_HAS_SM90A)
constexpr bool kKernelsBuilt = true;
#else
constexpr bool kKernelsBuilt = false;
#endif

// Tensor maps are encoded by the driver, which refuses to work for a thread that has no
// current context (CUDA_ERROR_INVALID_CONTEXT). The runtime makes its primary context
// current only at a thread's first runtime call that needs one, so a thread whose first CUDA
// work is a gemmt product has none: the autograd engine's worker thread, or any thread
// started after the library's kernel attributes were set (those calls happen once per
// process). cudaSetDevice binds the primary context of the current device.
cudaError_t bind_current_context() {
  static const auto get_current =
      reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(driver_entry_point("cuCtxGetCurrent"));
  CUcontext ctx = nullptr;
  if (get_current != nullptr && get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) {
    return cudaSuccess;
  }
  int device = 0;
  GEMMT_RETURN_IF_ERROR(cudaGetDevice(&device));
  return cudaSetDevice(device);
}

}  // namespace

namespace {

// GEMMT_SM90_LAST_TILE=0 keeps the last 128-row tile in place (read at each call, for A/B
// runs of sm90::last_tile_row).
bool shift_last_tile() {
  const char* env = std::getenv("GEMMT_SM90_LAST_TILE");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

// Launches the product for arguments make_plan accepts. cluster: 0 automatic, 1 single
// CTAs, 2 B-multicast pairs (granted only where sm90::cluster_ctas gives them). store: 0
// automatic, 1 direct register-to-global stores, 2 TMA stores (granted only when C rows are
// 16-byte aligned). sp.splits > 1 needs `partial` (partial_bytes) and adds the reduction pass.
cudaError_t run_planned(const Problem& pr, cudaStream_t stream, detail::Sm90Cluster cluster,
                        detail::Sm90Store store, const SplitPlan& sp, float* partial) {
  const GemmArgs& args = pr.args;
  Plan plan;
  if (!make_plan(pr, &plan, kKernelsBuilt)) return cudaErrorNotSupported;
  const bool split = sp.splits > 1;
  if ((split || sp.stream_k) && partial == nullptr) return cudaErrorInvalidValue;
  if (sp.stream_k && pr.bn != kBNWide) return cudaErrorNotSupported;
  GEMMT_RETURN_IF_ERROR(bind_current_context());
  Maps maps;
  std::memset(&maps, 0, sizeof(maps));
  if (!encode_map(&maps.a, args.a, plan.a, plan.kind) ||
      !encode_map(&maps.b, args.b, plan.b, plan.kind)) {
    return cudaErrorNotSupported;
  }
  MapShape c_shape;
  const bool c_tma_ok = !split && store != detail::Sm90Store::kDirect &&
                        staged_store_possible(pr) && c_tma_shape(pr, &c_shape) &&
                        encode_map(&maps.c, args.c, c_shape, plan.kind);
  // The kernel applies an epilogue only on the staged path (a split's reduction applies it).
  if (!args.epilogue.empty() && !split && !c_tma_ok) return cudaErrorNotSupported;
  const int cl = cluster == detail::Sm90Cluster::kSingle ? 1 : cluster_ctas(pr, split);
  Launch l;
  l.cluster = cl;
  l.tma_store = c_tma_ok;
  l.split = sp;
  l.partial = split || sp.stream_k ? partial : nullptr;
  l.shift_last_tile = shift_last_tile();
  cudaError_t launched;
  switch (plan.kind) {
    case kBF16:
      launched = launch_kind<kBF16>(pr, plan, maps, l, stream);
      break;
    case kF16:
      launched = launch_kind<kF16>(pr, plan, maps, l, stream);
      break;
    default:
      launched = launch_tf32(pr, plan, maps, l, stream);
      break;
  }
  GEMMT_RETURN_IF_ERROR(launched);
  if (!split) return cudaSuccess;
  // The slices are in C's orientation; the reduction writes C as the caller described it.
  GemmArgs out = args;
  if (pr.c_trans) std::swap(out.m, out.n);
  return gemm_reduce_k_slices(out, partial, sp.splits, stream);
}

}  // namespace

// Variant knobs for tests and benchmarks (see run_planned); no staging, no split-k.
cudaError_t detail::gemm_sm90_run_variant(const GemmArgs& args, cudaStream_t stream,
                                          detail::Sm90Cluster cluster, detail::Sm90Store store) {
  return run_planned(problem_for(args), stream, cluster, store, SplitPlan{1, 0}, nullptr);
}

bool detail::gemm_sm90_variant_supports(const GemmArgs& args) {
  return make_plan(problem_for(args), nullptr, kKernelsBuilt);
}

// ---- Operands TMA cannot read in place ----------------------------------------------------
// TMA needs 16-byte aligned bases and row strides, which a view at an odd offset or with an
// odd leading dimension (a 4097-wide matrix of 16-bit values) does not have, and tf32 wgmma
// reads B K-major only (a row-major B is usually read in place through swap_for_tf32, but
// not always). Such an operand is first rewritten K-major, rows padded to 16 bytes, into the
// workspace by one bandwidth-bound pass (a few percent of the product's time at the sizes
// where wgmma pays), then the product runs on the copy.
namespace {
cudaError_t stage_k_major(const GemmArgs& args, const void* in, int64_t s_r, int64_t s_p,
                          int64_t rows, void* out, cudaStream_t stream) {
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  return copy_2d_bits(static_cast<int>(elt), in, s_r, s_p, rows, args.k, out,
                      copy_pitch(args.k, elt), stream);
}

}  // namespace

namespace {

// Stages what must be staged, then runs the product with `splits` k-slices, tiles bn wide
// (0: chosen by the cost model) and the given orientation.
cudaError_t run_with(const GemmArgs& args, int splits, int bn, Orientation orient, void* workspace,
                     cudaStream_t stream) {
  const Problem pr = problem_with(args, bn, orient);
  if (!problem_supported(pr, kKernelsBuilt)) return cudaErrorNotSupported;
  const GemmArgs& t = pr.args;
  const Staging st = staging_for(t);
  const SplitPlan sp = split_plan_or_auto(pr, splits);
  const Workspace w = workspace_for(t, st, sp);
  if (w.total() > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  Problem staged = pr;
  staged.args = staged_args(t, st, ws);
  if (st.a) {
    GEMMT_RETURN_IF_ERROR(stage_k_major(t, t.a, t.a_stride_m, t.a_stride_k, t.m,
                                        const_cast<void*>(staged.args.a), stream));
  }
  if (st.b) {
    GEMMT_RETURN_IF_ERROR(stage_k_major(t, t.b, t.b_stride_n, t.b_stride_k, t.n,
                                        const_cast<void*>(staged.args.b), stream));
  }
  float* partial =
      w.partial_bytes > 0 ? reinterpret_cast<float*>(ws + w.a_bytes + w.b_bytes) : nullptr;
  return run_planned(staged, stream, detail::Sm90Cluster::kAuto, detail::Sm90Store::kAuto, sp,
                     partial);
}

}  // namespace

bool gemm_sm90_supports(const GemmArgs& args) {
  return problem_supported(problem_for(args), kKernelsBuilt);
}

bool gemm_sm90_streams_single_row(const GemmArgs& args) {
  return streams_single_row(args) && gemm_sm90_supports(args);
}

std::size_t gemm_sm90_workspace_bytes(const GemmArgs& args) {
  return workspace_bytes_with(args, 0, 0, Orientation::kAuto, kKernelsBuilt);
}

cudaError_t gemm_sm90_run(const GemmArgs& args, void* workspace, cudaStream_t stream) {
  return run_with(args, 0, 0, Orientation::kAuto, workspace, stream);
}

// The hooks' orientation is the planner's, value for value (passed by static_cast).
static_assert(static_cast<int>(detail::Sm90Orientation::kAuto) ==
                  static_cast<int>(Orientation::kAuto) &&
              static_cast<int>(detail::Sm90Orientation::kAsGiven) ==
                  static_cast<int>(Orientation::kAsGiven) &&
              static_cast<int>(detail::Sm90Orientation::kSwapped) ==
                  static_cast<int>(Orientation::kSwapped));

std::size_t detail::gemm_sm90_split_workspace_bytes(const GemmArgs& args, int splits, int bn,
                                                    Sm90Orientation orient) {
  return workspace_bytes_with(args, splits, bn, static_cast<Orientation>(orient), kKernelsBuilt);
}

cudaError_t detail::gemm_sm90_run_splits(const GemmArgs& args, int splits, int bn, void* workspace,
                                         cudaStream_t stream, Sm90Orientation orient) {
  return run_with(args, splits, bn, static_cast<Orientation>(orient), workspace, stream);
}

bool detail::gemm_sm90_forced_supports(const GemmArgs& args, int bn, Sm90Orientation orient) {
  return problem_supported(problem_with(args, bn, static_cast<Orientation>(orient)), kKernelsBuilt);
}

bool detail::gemm_sm90_auto_swaps(const GemmArgs& args) {
  return problem_for(args).c_trans;
}

int detail::gemm_sm90_auto_splits(const GemmArgs& args) {
  const Problem pr = problem_for(args);
  return split_plan_or_auto(pr, 0).splits;
}

bool detail::gemm_sm90_auto_stream_k(const GemmArgs& args) {
  const Problem pr = problem_for(args);
  return split_plan_or_auto(pr, 0).stream_k;
}

bool detail::gemm_sm90_auto_stream_k_tail(const GemmArgs& args) {
  return split_plan_or_auto(problem_for(args), 0).stream_k_tail();
}

int detail::gemm_sm90_auto_tile_n(const GemmArgs& args) {
  return problem_for(args).bn;
}

}  // namespace gemmt
