// The cluster decode GEMM's planner (see decode_cluster_plan.h).
#include "plan/decode_cluster_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemmt/arith.h"

namespace gemmt {
namespace decode_cluster {

int stages_for(int bn) {
  // 227 KB of shared memory a CTA, less 1 KB of alignment and the barriers.
  constexpr int kBudget = 227 * 1024 - 1024 - 256;
  const int stage = kTileRows * 128 + bn * 128;
  return std::min(8, kBudget / stage);
}

bool supports(const GemmArgs& a) {
  if (a.dtype != ScalarType::kBFloat16 && a.dtype != ScalarType::kFloat16) return false;
  if (a.cc_major != 9 || a.cc_minor != 0) return false;
  if (a.m < 1 || a.m > kMaxTokens || a.n < 1 || a.k < 8 || a.k % 8 != 0) return false;
  if (a.n > (int64_t{1} << 30) || a.k > (int64_t{1} << 30)) return false;
  if (a.a == nullptr || a.b == nullptr || a.c == nullptr) return false;
  // Both operands K-major with 16-byte aligned rows (TMA), not overlapping.
  if (a.a_stride_k != 1 || a.b_stride_k != 1) return false;
  if (a.m > 1 && (a.a_stride_m % 8 != 0 || a.a_stride_m < a.k)) return false;
  if (a.n > 1 && (a.b_stride_n % 8 != 0 || a.b_stride_n < a.k)) return false;
  if (!is_aligned(a.a, 16) || !is_aligned(a.b, 16)) return false;
  if (a.m > 1 && a.ldc < a.n) return false;
  if (a.epilogue.preact != nullptr && a.m > 1 && a.epilogue.ld_preact < a.n) return false;
  if (a.epilogue.bias_per_row) return false;
  return true;
}

Plan plan(const GemmArgs& a, const int* active) {
  Plan p;
  const int64_t tokens = (a.m + 7) / 8 * 8;
  p.bn = tokens <= 64 ? 64 : tokens <= 128 ? 128 : tokens <= 192 ? 192 : 256;
  p.stages = stages_for(p.bn);
  p.tiles = static_cast<int>(ceil_div(a.n, int64_t{kTileRows}));
  p.num_kb = static_cast<int>(ceil_div(a.k, int64_t{kBlockK}));
  const int64_t sms = std::max(1, a.sm_count);
  int cluster = 1;
  for (int cl = kMaxCluster; cl >= 2; --cl) {
    const int64_t resident = active != nullptr && active[cl] > 0 ? active[cl] : sms / cl;
    if (int64_t{p.tiles} <= resident && int64_t{p.tiles} * cl <= sms &&
        ceil_div(int64_t{p.num_kb}, int64_t{cl}) >= kMinKbPerCta) {
      cluster = cl;
      break;
    }
  }
  p.kb_per_cta = static_cast<int>(ceil_div(int64_t{p.num_kb}, int64_t{cluster}));
  // 9 k-blocks over 4 CTAs would be 3, 3, 3 and none: the cluster shrinks to ceil(9 / 3) = 3,
  // so that every CTA has work.
  p.cluster = static_cast<int>(ceil_div(int64_t{p.num_kb}, int64_t{p.kb_per_cta}));
  p.ctas = p.tiles * p.cluster;
  return p;
}

bool wanted(const GemmArgs& a) {
  if (!supports(a)) return false;
  const Plan p = plan(a);
  if (p.tiles > std::max(1, a.sm_count)) return false;
  return p.cluster >= 2 || a.m > 64;
}

bool schedule_new() {
  const char* v = std::getenv("GEMMT_DECODE_SCHEDULE");
  return v != nullptr && std::strcmp(v, "new") == 0;
}

}  // namespace decode_cluster
}  // namespace gemmt
