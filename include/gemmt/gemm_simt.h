// Planning queries of the SIMT GEMM family (kernels/simt/), for the dispatcher and
// for benchmarks that want to report what ran. The launch entry points themselves are
// declared in gemmt/gemm.h.
#pragma once

#include <cstddef>

#include "gemmt/gemm.h"
#include "gemmt/gemm_simt_plan.h"

namespace gemmt {

// Deterministic in (args, v) and the current device, so gemm_simt_workspace_bytes and
// gemm_simt_run always agree. Returns a zero plan when the variant does not support args.
SimtPlan gemm_simt_plan(const GemmArgs& args, GemmVariant v);

namespace detail {
// Benchmark and test hooks: run the pipelined kernel with one of its tile configurations
// (the ones auto chooses among; `config` is a PipeTile of kernels/plan/simt_plan.h: 0 large,
// 1 medium, 2 small, 3 fat, 4 narrow), so each can be timed and checked on its own. Float32, no
// split-k. allow_interior = false keeps the general instance on problems that the
// whole-tiles instance would serve; stream_k < 0 lets the planner decide whether the last
// wave runs as stream-k, 0 never, > 0 whenever the configuration can. The plan says which
// tile ran and the workspace the run needs (pass at least that many bytes).
int gemm_simt_pipelined_config_count();
SimtPlan gemm_simt_plan_pipelined_config(const GemmArgs& args, int config,
                                         bool allow_interior = true, int stream_k = -1);
cudaError_t gemm_simt_run_pipelined_config(const GemmArgs& args, int config, void* workspace,
                                           cudaStream_t stream, bool allow_interior = true,
                                           int stream_k = -1);
// The gemv kernel (m == 1 or n == 1) with warps_per_row warps sharing each row of the
// row-dot kernel (1, 2, 4 or 8; 0: the planner's choice) and its L2 prefetch that many blocks
// ahead (prefetch_blocks; -1: the planner's choice, 0: none), so that each can be timed.
SimtPlan gemm_simt_plan_gemv(const GemmArgs& args, int warps_per_row);
cudaError_t gemm_simt_run_gemv(const GemmArgs& args, int warps_per_row, void* workspace,
                               cudaStream_t stream, int64_t prefetch_blocks = -1);
// A float32 K-major B (a @ b.t()) read one way, so that the ways can be timed against each
// other: 0 copies B N-major first, 1 reads it in place with 4-byte cp.async copies, 2 runs the
// product transposed (C^T = B^T A^T, C written column-major; A copied where the planner's rule
// copies the transposed product's B). No split-k; an empty plan (block_m 0) or
// cudaErrorNotSupported where B is not K-major.
SimtPlan gemm_simt_plan_k_major_b(const GemmArgs& args, int how);
cudaError_t gemm_simt_run_k_major_b(const GemmArgs& args, int how, void* workspace,
                                    cudaStream_t stream);
}  // namespace detail

// Number of k-slices kSplitK uses for args (1 when splitting would not help).
int gemm_simt_pick_splits(const GemmArgs& args);

}  // namespace gemmt
