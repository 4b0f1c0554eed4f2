#include "plan/fp64_plan.h"

namespace gemmt {
namespace fp64_plan {

int dmma_cta_width(int64_t m, int64_t n, bool swap, int sm_count, int narrow_per_sm) {
  if (narrow_per_sm < 2) return 128;
  if (!swap) return 64;
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128);
  return tiles < sm_count ? 64 : 128;
}

}  // namespace fp64_plan
}  // namespace gemmt
