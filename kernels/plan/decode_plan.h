// Planning of the decode GEMM (kernels/gemm_decode.cu, m <= 64): which problems it takes and
// how it splits the work (features per CTA, the cluster size along K). Plain host C++.
#pragma once

#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {
namespace decode {

constexpr int kWarps = 8;        // warps per CTA
constexpr int kSliceBytes = 64;  // bytes of a W row per slice: 16 per lane-quarter
constexpr int kSliceK = 32;      // K elements per slice of the 16-bit types
constexpr int kMaxCluster = 8;   // portable cluster size
constexpr int kMaxTokens = 64;   // m limit: 8 token tiles of 8
// Two CTAs of 256 threads per SM: registers allow it for every instance (<= 128 per thread),
// and the shared memory of the partial sums (<= 32 KB) does too.
constexpr int kCtasPerSm = 2;

struct DecodePlan {
  int tiles = 0;      // token tiles of 8: 1, 2, 4 or 8
  int row_warps = 0;  // 8, 4 or 2: 16 * row_warps features per CTA
  int cluster = 1;
  int slices_per_cta = 0;
  int ctas = 0;
};

// bf16 / fp16, sm_80+, 1 <= m <= 64, both operands K-major with 16-byte aligned rows,
// k % 8 == 0, bias per column only. gemm_decode_supports and the run both ask this.
bool decode_supports(const GemmArgs& a);

// Features per CTA and the cluster size along K: enough CTAs for `ctas_per_sm` per SM in
// as few waves as possible, the widest row block first (more W rows share each token load),
// each CTA keeping at least 8 slices per K warp so its loads reach a steady state.
DecodePlan plan_decode(const GemmArgs& a, int ctas_per_sm = kCtasPerSm);

// The same split for m tokens against n weight rows of `slices` K slices, on `sm_count` SMs of
// compute capability `cc_major` (clusters from 9): what the FP8 decode kernel
// (kernels/fp8/scaled_decode_fp8.cu), whose slices hold twice the elements, plans with.
DecodePlan plan_decode_slices(int64_t m, int64_t n, int64_t slices, int sm_count, int cc_major,
                              int ctas_per_sm = kCtasPerSm);

}  // namespace decode
}  // namespace gemmt
