#include "plan/fp8_decode_plan.h"

#include <algorithm>

namespace gemmt {
namespace fp8_decode_plan {

int k_split(int64_t n, int64_t k, int sm_count, bool float8_form) {
  const int64_t row_blocks = std::max<int64_t>(1, (n + kRows - 1) / kRows);
  const int64_t kblocks = (k + kBlockK - 1) / kBlockK;
  const int64_t sms = std::max<int64_t>(1, sm_count);
  const int64_t budget = float8_form ? sms : sms * 5 / 4;  // CTAs the grid may have
  int64_t split = std::max<int64_t>(1, budget / row_blocks);
  split = std::min<int64_t>(split, kMaxSplit);
  split = std::min<int64_t>(split, std::max<int64_t>(1, kblocks / kMinBlocksPerRank));
  return static_cast<int>(split);
}

}  // namespace fp8_decode_plan
}  // namespace gemmt
