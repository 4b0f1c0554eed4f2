// Test and benchmark hooks of the Hopper GEMM family (kernels/sm90/gemm_sm90.cu): run the
// kernel with a forced cluster shape, store path, split count or tile width, and ask what the
// cost model picks. tests/cuda/gemm_tc_selftest.cu uses them; the definitions are qualified
// with this header's names, so a signature that drifts from it fails to compile.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gemmt/gemm_args.h"

namespace gemmt {
namespace detail {

// CTAs per cluster: kPair shares each B tile between two CTAs stacked along M (granted only
// when the 128-row tile count is even and k is not split).
enum class Sm90Cluster : int { kAuto = 0, kSingle = 1, kPair = 2 };
// How C is written: register-to-global stores, or staged through shared memory and TMA
// (granted only when C rows are 16-byte aligned and k is not split).
enum class Sm90Store : int { kAuto = 0, kDirect = 1, kTma = 2 };

// The kernel on operands it reads in place (no staging, no split-k).
cudaError_t gemm_sm90_run_variant(const GemmArgs& args, cudaStream_t stream, Sm90Cluster cluster,
                                  Sm90Store store);
// True when the kernel reads the operands in place (gemm_sm90_run_variant runs them).
bool gemm_sm90_variant_supports(const GemmArgs& args);
// Which way round the product runs: the planner's choice, as given, or C^T = B^T A^T
// (values of sm90::Orientation, kernels/plan/sm90_plan.h).
enum class Sm90Orientation : int { kAuto = 0, kAsGiven = 1, kSwapped = 2 };
// gemm_sm90_run with `splits` k-slices (0: the model's; -1: stream-k as the planner runs it,
// -2: over clusters for two thirds of the tiles, so that small products are cut in two, -3:
// over every cluster that fits, so that small products are cut into many pieces, -4: the
// partial last wave alone over every cluster that fits; stream-k needs 256-wide tiles), tiles `bn`
// wide (64, 128 or 256; 0: the model's) and an orientation instead of the planner's choice, and the
// workspace it needs.
std::size_t gemm_sm90_split_workspace_bytes(const GemmArgs& args, int splits, int bn,
                                            Sm90Orientation orient = Sm90Orientation::kAuto);
cudaError_t gemm_sm90_run_splits(const GemmArgs& args, int splits, int bn, void* workspace,
                                 cudaStream_t stream,
                                 Sm90Orientation orient = Sm90Orientation::kAuto);
// Whether gemm_sm90_run_splits takes the problem with that tile width and orientation.
bool gemm_sm90_forced_supports(const GemmArgs& args, int bn, Sm90Orientation orient);
// The split count, tile width and orientation gemm_sm90_run picks, whether it runs
// stream-k, and whether on the partial last wave alone (splits -4 above).
int gemm_sm90_auto_splits(const GemmArgs& args);
bool gemm_sm90_auto_stream_k(const GemmArgs& args);
bool gemm_sm90_auto_stream_k_tail(const GemmArgs& args);
int gemm_sm90_auto_tile_n(const GemmArgs& args);
bool gemm_sm90_auto_swaps(const GemmArgs& args);

}  // namespace detail
}  // namespace gemmt
