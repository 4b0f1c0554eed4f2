// The decode GEMM's planner (see decode_plan.h).
#include "plan/decode_plan.h"

#include <algorithm>

#include "gemmt/arith.h"

namespace gemmt {
namespace decode {
namespace {

// Tiles of 8 tokens, rounded up to an instantiated count.
int token_tiles(int64_t m) {
  const int t = static_cast<int>((m + 7) / 8);
  return t <= 1 ? 1 : t <= 2 ? 2 : t <= 4 ? 4 : 8;
}

}  // namespace

bool decode_supports(const GemmArgs& a) {
  if (a.dtype != ScalarType::kBFloat16 && a.dtype != ScalarType::kFloat16) return false;
  if (a.cc_major < 8) return false;
  if (a.m < 1 || a.m > kMaxTokens || a.n < 1 || a.k < 8 || a.k % 8 != 0) return false;
  if (a.n > (int64_t{1} << 30) || a.k > (int64_t{1} << 30)) return false;
  // Both operands K-major, every 16-byte piece of a row aligned.
  if (a.a_stride_k != 1 || a.b_stride_k != 1) return false;
  if ((a.m > 1 && a.a_stride_m % 8 != 0) || (a.n > 1 && a.b_stride_n % 8 != 0)) return false;
  if (!is_aligned(a.a, 16) || !is_aligned(a.b, 16)) return false;
  if (a.m > 1 && a.ldc < a.n) return false;
  if (a.epilogue.preact != nullptr && a.m > 1 && a.epilogue.ld_preact < a.n) return false;
  if (a.epilogue.bias_per_row) return false;
  return true;
}

DecodePlan plan_decode(const GemmArgs& a, int ctas_per_sm) {
  return plan_decode_slices(a.m, a.n, ceil_div(a.k, kSliceK), a.sm_count, a.cc_major, ctas_per_sm);
}

DecodePlan plan_decode_slices(int64_t m, int64_t n, int64_t slices, int sm_count, int cc_major,
                              int ctas_per_sm) {
  DecodePlan best;
  const int64_t slots = std::max(1, sm_count) * std::max(1, ctas_per_sm);
  const int64_t total_slices = slices;
  const int max_cluster = cc_major >= 9 ? kMaxCluster : 1;
  double best_score = -1.0;
  for (int rw : {8, 4, 2}) {
    const int64_t blocks = ceil_div(n, 16 * rw);
    const int k_warps = kWarps / rw;
    for (int cl = 1; cl <= max_cluster; ++cl) {
      const int64_t per_cta = ceil_div(total_slices, cl);
      if (cl > 1 && per_cta < 8 * k_warps) break;
      const int64_t ctas = blocks * cl;
      const int64_t waves = ceil_div(ctas, slots);
      // Fraction of the slots' time that does work, with a small charge per extra cluster
      // rank (its partial sums cross the cluster) and per narrower row block (token reuse).
      double score = static_cast<double>(ctas) / static_cast<double>(waves * slots);
      score -= 0.01 * (cl - 1) + 0.02 * (rw == 8 ? 0 : rw == 4 ? 1 : 2);
      if (score > best_score + 1e-9) {
        best_score = score;
        best.row_warps = rw;
        best.cluster = cl;
        best.slices_per_cta = static_cast<int>(per_cta);
        best.ctas = static_cast<int>(ctas);
      }
    }
  }
  best.tiles = token_tiles(m);
  return best;
}

}  // namespace decode
}  // namespace gemmt
