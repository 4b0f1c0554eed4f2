// The batched-decode GEMM's planner (see decode_tile_plan.h).
#include "plan/decode_tile_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "gemmt/arith.h"
#include "plan/sm90_plan.h"

namespace gemmt {
namespace decode_tile {
namespace {

int64_t round_up(int64_t v, int64_t q) {
  return ceil_div(v, q) * q;
}

// The plan with `s` token tiles; not ok() when a tile would exceed the widest instance or the
// ring would hold fewer than three stages.
struct Force {
  int s = 0, cx = 0, cy = 0, stages = 0, exact = 0;
};
Force force() {
  Force f;
  const char* e = std::getenv("GEMMT_DT_FORCE");
  if (e != nullptr) std::sscanf(e, "%d,%d,%d,%d,%d", &f.s, &f.cx, &f.cy, &f.stages, &f.exact);
  return f;
}

Plan plan_with(const GemmArgs& a, int s) {
  Plan p;
  const Force f = force();
  const int64_t step = round_up(ceil_div(a.m, int64_t{s}), 8);
  int64_t width = round_up(step, 16);
  if (width > 192) width = 256;
  if (width > kMaxWidth) return p;
  const int64_t tiles = ceil_div(a.n, int64_t{kFeatures});
  // Token tiles share their weight rows in pairs at most; the feature tiles of a cluster
  // share the tokens, four of them where there are four (portable clusters: 8 CTAs).
  int cy = s <= 2 ? s : 1;
  int cx = 4;
  while (cx > 1 && (cx * cy > 8 || cx > tiles)) cx /= 2;
  if (f.cx > 0) cx = f.cx;
  if (f.cy > 0) cy = f.cy;
  if (s % cy != 0) return p;
  const int64_t b_box =
      f.exact == 2 ? round_up(ceil_div(step, int64_t{cx}), 8) : ceil_div(step, int64_t{cx});
  const int64_t b_rows = std::max(width, cx * b_box);
  const int64_t stage_bytes = kStageABytes + b_rows * 128;
  int64_t stages = std::min<int64_t>(kMaxStages, (kSmemLimit - kBarrierBytes - 1024) / stage_bytes);
  if (f.stages > 0 && f.stages < stages) stages = f.stages;
  // The epilogue stages both consumer warpgroups' accumulators in the ring.
  if (stages * stage_bytes < 2 * width * kEpiloguePitch * 4) return p;
  if (stages < 3) return p;
  p.token_tiles = s;
  p.step = static_cast<int>(step);
  p.width = static_cast<int>(width);
  p.cx = cx;
  p.cy = cy;
  p.b_box = static_cast<int>(b_box);
  p.b_rows = static_cast<int>(b_rows);
  p.stages = static_cast<int>(stages);
  p.feature_tiles = static_cast<int>(round_up(tiles, cx));
  p.grid = p.feature_tiles * s;
  p.smem_bytes = static_cast<int>(stages * stage_bytes + kBarrierBytes + 1024);
  const int64_t sms = std::max(1, a.sm_count);
  const double waves = static_cast<double>(ceil_div(int64_t{p.grid}, sms));
  p.cost = waves * static_cast<double>(stage_bytes) / kStageABytes;
  return p;
}

}  // namespace

bool supports(const GemmArgs& a) {
  if (a.dtype != ScalarType::kBFloat16 && a.dtype != ScalarType::kFloat16) return false;
  if (a.cc_major != 9) return false;
  if (a.m < 1 || a.m > kMaxTokens || a.n < 1 || a.k < 8 || a.k % 8 != 0) return false;
  if (a.n >= (int64_t{1} << 31) - kFeatures || a.k >= (int64_t{1} << 31)) return false;
  if (a.a_stride_k != 1 || a.b_stride_k != 1) return false;
  // Rows 16-byte aligned for TMA, and never overlapping.
  if ((a.m > 1 && (a.a_stride_m % 8 != 0 || a.a_stride_m < a.k)) ||
      (a.n > 1 && (a.b_stride_n % 8 != 0 || a.b_stride_n < a.k))) {
    return false;
  }
  if (!is_aligned(a.a, 16) || !is_aligned(a.b, 16)) return false;
  if (a.m > 1 && a.ldc < a.n) return false;
  if (a.epilogue.preact != nullptr && a.m > 1 && a.epilogue.ld_preact < a.n) return false;
  if (a.epilogue.bias_per_row) return false;
  return true;
}

Plan plan(const GemmArgs& a) {
  Plan best;
  if (!supports(a)) return best;
  for (int s = 1; s <= 4; ++s) {
    if (force().s > 0 && s != force().s) continue;
    const Plan p = plan_with(a, s);
    if (p.ok() && (!best.ok() || p.cost < best.cost - 1e-9)) best = p;
  }
  return best;
}

bool picked(const GemmArgs& a) {
  if (a.m <= 64 || !supports(a)) return false;
  const double weight_bytes = static_cast<double>(a.n) * static_cast<double>(a.k) * 2.0;
  if (weight_bytes < kMinWeightBytes) return false;
  if (static_cast<double>(a.m) >= sm90::ridge_tokens(a)) return false;
  return plan(a).ok();
}

}  // namespace decode_tile
}  // namespace gemmt
