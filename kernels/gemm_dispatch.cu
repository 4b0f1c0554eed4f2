// Chooses and launches a GEMM kernel: the `auto` policy lives here, the kernels in
// kernels/simt/ (exact FP32 ladder, split-k, gemv), gemm_sm80_mma.cu, kernels/sm90/ and
// kernels/fp64/ (float64).
#include "gemmt/gemm.h"
#include "plan/decode_plan.h"

namespace gemmt {
namespace {

bool is_tensor_core_problem(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat16 || a.dtype == ScalarType::kBFloat16 ||
         (a.dtype == ScalarType::kFloat32 && a.allow_tf32);
}

// Every family applies a GemmEpilogue (bias, activation, pre-activation output) where it
// writes C (split-k: in its reduction) except gemv, whose outputs are single dot products
// finished in several places; epilogue products with m == 1 or n == 1 go to the others.
bool applies_epilogue(GemmVariant v) {
  return v != GemmVariant::kGemv;
}

}  // namespace

// Here rather than with its kernel (gemm_decode.cu), which a build may compile on first use
// (include/gemmt/deferred.h, group decode): asking is not using.
bool gemm_decode_supports(const GemmArgs& args) {
  return decode::decode_supports(args);
}

bool gemm_supports(const GemmArgs& args, GemmVariant v) {
  if (!args.epilogue.empty() && v != GemmVariant::kAuto && !applies_epilogue(v)) return false;
  switch (v) {
    case GemmVariant::kAuto:
      return true;
    case GemmVariant::kMmaSync:
      return args.cc_major >= 8 && gemm_sm80_supports(args);
    case GemmVariant::kWgmma:
      return gemm_sm90_supports(args);
    case GemmVariant::kDecode:
      return gemm_decode_supports(args);
    case GemmVariant::kDmma:
      return gemm_fp64_dmma_supports(args);
    case GemmVariant::kSimtFp64:
      return gemm_fp64_simt_supports(args);
    case GemmVariant::kCount:
      return false;
    default:
      return gemm_simt_supports(args, v);
  }
}

GemmVariant gemm_pick(const GemmArgs& args) {
  // float64 has one family: the FP64 tensor cores where the GPU has them (sm_80+), double
  // FMAs elsewhere. Both take every shape and stride.
  if (args.dtype == ScalarType::kFloat64) {
    return gemm_supports(args, GemmVariant::kDmma) ? GemmVariant::kDmma : GemmVariant::kSimtFp64;
  }
  // Decode-sized products (small m) stream B. The decode kernel is not picked: measured on
  // H100 (docs/performance.md) it reaches 0.6-0.8 of cuBLAS for m <= 16 and about 0.3 for
  // m = 32-64 (its token loads go through L1 per warp), while the wgmma kernel with its
  // split planner streams the same weights at 0.8-1.07.
  // m == 1 goes to gemv, except for the 16-bit weights that the wgmma kernel's narrow tile
  // streams faster (gemm_sm90_streams_single_row).
  // float32 with 2-4 rows against a K-major B, or 2 against an N-major one, goes to gemv too,
  // which reads each element of B once for all of them (gemv_picks_few_rows).
  if ((args.m == 1 || args.n == 1 || gemm_simt_gemv_picks_few_rows(args)) &&
      gemm_supports(args, GemmVariant::kGemv)) {
    const bool narrow_tile = is_tensor_core_problem(args) && gemm_sm90_streams_single_row(args);
    return narrow_tile ? GemmVariant::kWgmma : GemmVariant::kGemv;
  }
  if (is_tensor_core_problem(args)) {
    if (gemm_supports(args, GemmVariant::kWgmma)) return GemmVariant::kWgmma;
    if (gemm_supports(args, GemmVariant::kMmaSync)) return GemmVariant::kMmaSync;
  }
  // Split-k when the SIMT planner's cost model gives the problem more than one k-slice.
  if (gemm_simt_wants_split_k(args)) return GemmVariant::kSplitK;
  return GemmVariant::kPipelined;
}

std::size_t gemm_workspace_bytes(const GemmArgs& args, GemmVariant v) {
  if (v == GemmVariant::kAuto) v = gemm_pick(args);
  switch (v) {
    case GemmVariant::kWgmma:
      return gemm_sm90_workspace_bytes(args);
    case GemmVariant::kMmaSync:
    case GemmVariant::kDecode:
    case GemmVariant::kDmma:
    case GemmVariant::kSimtFp64:
    case GemmVariant::kCount:
      return 0;
    default:
      return gemm_simt_workspace_bytes(args, v);
  }
}

cudaError_t gemm_run(const GemmArgs& args, GemmVariant v, void* workspace, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (v == GemmVariant::kAuto) v = gemm_pick(args);
  if (!gemm_supports(args, v)) return cudaErrorNotSupported;
  switch (v) {
    case GemmVariant::kDmma:
    case GemmVariant::kSimtFp64:
      return gemm_fp64_run(args, v == GemmVariant::kDmma, stream);  // k == 0 included
    default:
      break;
  }
  if (args.k == 0) return gemm_scale_c(args, stream);
  switch (v) {
    case GemmVariant::kMmaSync:
      return gemm_sm80_run(args, stream);
    case GemmVariant::kWgmma:
      return gemm_sm90_run(args, workspace, stream);
    case GemmVariant::kDecode:
      return gemm_decode_run(args, stream);
    default:
      return gemm_simt_run(args, v, workspace, stream);
  }
}

}  // namespace gemmt
