// The SIMT GEMM family's entry points (gemmt/gemm.h, gemmt/gemm_simt.h): each plans with
// kernels/plan/simt_plan.cpp and runs exactly that plan through the launchers of
// kernels/simt/, so what gemm_simt_supports, gemm_simt_workspace_bytes and gemm_simt_run
// decide comes from one function.
//
// The family is a ladder (docs/architecture.md has the map):
//   1. ladder_1_naive.cu             one thread per C element, operands from global memory
//   2. ladder_2_smem_tiled.cu        32x32 shared-memory tiles
//   3. ladder_3_register_blocked.cu  128x128 block tile, 8x8 outputs per thread in registers
//   4. ladder_4_warp_tiled.cu        warp-shaped layout, 16-byte shared loads, padded tiles
//   5. ladder_5_pipelined.cuh        cp.async ring, fragment double buffering, tile per problem
//                                    (instances: pipelined_*.cu; launch: pipelined_launch.cu)
//   5b. stream_k.cuh                 the last, partial wave as even runs of k-tiles
//   6. split_k_reduce.cu             k-slices and their fixed-order reduction
//   7. gemv.cu                       m == 1 or n == 1, and float32 of 2-4 rows
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/gemm_simt.h"
#include "plan/simt_plan.h"
#include "simt/launchers.h"

namespace gemmt {
namespace {

simt::SimtFamilyPlan family_plan(const GemmArgs& args, GemmVariant v, int gemv_wpr = 0) {
  return simt::plan_simt(args, v, simt::device_pipe_catalog(), gemv_wpr);
}

cudaError_t plan_status(const simt::SimtFamilyPlan& fp) {
  if (fp.error == simt::kPlanOk) return cudaSuccess;
  return fp.error == simt::kPlanNotSupported ? cudaErrorNotSupported
                                             : static_cast<cudaError_t>(fp.error);
}

// What every run entry point does before it launches: report a failed plan, finish at once on
// an empty C, and scale C by beta when k == 0. std::nullopt: launch.
std::optional<cudaError_t> before_launch(const GemmArgs& args, const simt::SimtFamilyPlan& fp,
                                         cudaStream_t stream) {
  const cudaError_t status = plan_status(fp);
  if (status != cudaSuccess) return status;
  if (args.m == 0 || args.n == 0) return cudaSuccess;
  if (args.k == 0) return gemm_scale_c(args, stream);
  return std::nullopt;
}

simt::SimtFamilyPlan k_major_b_plan(const GemmArgs& args, int how) {
  if (how < 0 || how > 2) return simt::SimtFamilyPlan{};  // kPlanNotSupported
  return simt::plan_k_major_b(args, static_cast<simt::KMajorB>(how), simt::device_pipe_catalog());
}

bool config_hook_ok(const GemmArgs& args, int config) {
  return args.dtype == ScalarType::kFloat32 && args.m > 0 && args.n > 0 && args.k > 0 &&
         config >= 0 && config < simt::kNumPipeTiles;
}

simt::PipePlan config_plan(const GemmArgs& args, int config, bool allow_interior, int stream_k) {
  simt::PipeOptions opt;
  opt.only_tile = config;
  opt.allow_interior = allow_interior;
  opt.stream_k = stream_k;
  return simt::plan_pipelined(args, opt, simt::device_pipe_catalog());
}

}  // namespace

namespace detail {

int gemm_simt_pipelined_config_count() {
  return simt::kNumPipeTiles;
}

SimtPlan gemm_simt_plan_pipelined_config(const GemmArgs& args, int config, bool allow_interior,
                                         int stream_k) {
  if (!config_hook_ok(args, config)) return SimtPlan{};
  const simt::PipePlan pp = config_plan(args, config, allow_interior, stream_k);
  return pp.error == simt::kPlanOk ? simt::describe(pp) : SimtPlan{};
}

cudaError_t gemm_simt_run_pipelined_config(const GemmArgs& args, int config, void* workspace,
                                           cudaStream_t stream, bool allow_interior, int stream_k) {
  if (args.dtype != ScalarType::kFloat32 || args.m <= 0 || args.n <= 0 || args.k <= 0) {
    return cudaErrorNotSupported;
  }
  if (config < 0 || config >= simt::kNumPipeTiles) return cudaErrorInvalidValue;
  const simt::PipePlan pp = config_plan(args, config, allow_interior, stream_k);
  return simt::run_pipelined(args, pp, static_cast<float*>(workspace), stream);
}

SimtPlan gemm_simt_plan_gemv(const GemmArgs& args, int warps_per_row) {
  const simt::SimtFamilyPlan fp = family_plan(args, GemmVariant::kGemv, warps_per_row);
  return fp.error == simt::kPlanOk ? fp.summary : SimtPlan{};
}

cudaError_t gemm_simt_run_gemv(const GemmArgs& args, int warps_per_row, void* workspace,
                               cudaStream_t stream, int64_t prefetch_blocks) {
  if (warps_per_row < 0 || warps_per_row > 8 || (warps_per_row & (warps_per_row - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  simt::SimtFamilyPlan fp = family_plan(args, GemmVariant::kGemv, warps_per_row);
  if (const auto done = before_launch(args, fp, stream)) return *done;
  // A forced prefetch only where the planner would allow one at some distance.
  if (prefetch_blocks >= 0 && fp.gemv.prefetch_blocks > 0)
    fp.gemv.prefetch_blocks = prefetch_blocks;
  return simt::run_gemv(args, fp.gemv, static_cast<float*>(workspace), stream);
}

SimtPlan gemm_simt_plan_k_major_b(const GemmArgs& args, int how) {
  const simt::SimtFamilyPlan fp = k_major_b_plan(args, how);
  return fp.error == simt::kPlanOk ? fp.summary : SimtPlan{};
}

cudaError_t gemm_simt_run_k_major_b(const GemmArgs& args, int how, void* workspace,
                                    cudaStream_t stream) {
  if (how < 0 || how > 2) return cudaErrorInvalidValue;
  const simt::SimtFamilyPlan fp = k_major_b_plan(args, how);
  if (const auto done = before_launch(args, fp, stream)) return *done;
  return simt::run_pipelined_staged(args, fp, workspace, stream);
}

}  // namespace detail

bool gemm_simt_supports(const GemmArgs& args, GemmVariant v) {
  // A device error in the plan (an instance the GPU refused) is reported by the run.
  return family_plan(args, v).error != simt::kPlanNotSupported;
}

SimtPlan gemm_simt_plan(const GemmArgs& args, GemmVariant v) {
  const simt::SimtFamilyPlan fp = family_plan(args, v);
  return fp.error == simt::kPlanOk ? fp.summary : SimtPlan{};
}

int gemm_simt_pick_splits(const GemmArgs& args) {
  return std::max(1, gemm_simt_plan(args, GemmVariant::kSplitK).splits);
}

std::size_t gemm_simt_workspace_bytes(const GemmArgs& args, GemmVariant v) {
  return gemm_simt_plan(args, v).workspace_bytes;
}

bool gemm_simt_wants_split_k(const GemmArgs& args) {
  return simt::simt_wants_split_k(args, simt::device_pipe_catalog());
}

bool gemm_simt_gemv_picks_few_rows(const GemmArgs& args) {
  return simt::gemv_picks_few_rows(args);
}

cudaError_t gemm_simt_run(const GemmArgs& args, GemmVariant v, void* workspace,
                          cudaStream_t stream) {
  const simt::SimtFamilyPlan fp = family_plan(args, v);
  if (const auto done = before_launch(args, fp, stream)) return *done;
  switch (v) {
    case GemmVariant::kNaive:
      return simt::run_naive(args, stream);
    case GemmVariant::kSmemTiled:
      return simt::run_smem_tiled(args, stream);
    case GemmVariant::kRegisterBlocked:
      return simt::run_register_blocked(args, stream);
    case GemmVariant::kWarpTiled:
      return simt::run_warp_tiled(args, stream);
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK:
      return simt::run_pipelined_staged(args, fp, workspace, stream);
    case GemmVariant::kGemv:
      return simt::run_gemv(args, fp.gemv, static_cast<float*>(workspace), stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace gemmt
