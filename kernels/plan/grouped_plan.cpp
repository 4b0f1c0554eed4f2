#include "plan/grouped_plan.h"

#include <algorithm>

namespace gemmt {
namespace grouped_plan {
namespace {

constexpr int kBM = 128;
constexpr int kSplitRows = 1;
constexpr int kSplitCols = 2;
constexpr int kSplitDepth = 3;
// Groups of at most this many rows on average stream their weights (streams_small_groups).
constexpr int64_t kStreamRowsAGroup = 32;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

int64_t max_tiles(const Shape& s, int bn) {
  const int64_t tm = ceil_div(s.m, kBM), tn = ceil_div(s.n, bn);
  switch (s.split) {
    case kSplitRows:
      return s.m == 0 || s.n == 0 ? 0 : (tm + s.groups + 1) * tn;
    case kSplitCols:
      return s.m == 0 || s.n == 0 ? 0 : tm * (tn + s.groups + 1);
    case kSplitDepth:
      return static_cast<int64_t>(s.groups) * tm * tn;
    default:
      return static_cast<int64_t>(s.groups) * tm * tn;
  }
}

int64_t split_tiles_estimate(const Shape& s, int bn) {
  const int64_t tm = ceil_div(s.m, kBM), tn = ceil_div(s.n, bn);
  return std::max(tm, std::min<int64_t>(std::max(s.groups, 1), s.m)) * tn;
}

bool streams_small_groups(const Shape& s) {
  return s.split == kSplitRows && s.m <= kStreamRowsAGroup * static_cast<int64_t>(s.groups);
}

int tile_width(const Shape& s, int sm_count) {
  if (s.n <= 128) return 128;
  if (streams_small_groups(s)) {
    // Each group's row of tiles, counted; not where 256-wide tiles compute 5% more columns
    // than 128-wide ones (1408 of them: 1536 against 1408).
    if (ceil_div(s.n, 256) * 256 * 20 > ceil_div(s.n, 128) * 128 * 21) return 128;
    return split_tiles_estimate(s, 256) * 100 >= static_cast<int64_t>(sm_count) * 95 ? 256 : 128;
  }
  // Tiles of the list at 256 wide, counting a split of rows or columns as its total extent
  // (groups that share a partial tile add to it, so this errs towards 128).
  Shape whole = s;
  if (s.split == kSplitRows || s.split == kSplitCols) whole.groups = -1;
  return max_tiles(whole, 256) >= sm_count ? 256 : 128;
}

int promoted_tile_width(const Shape& s, int sm_count, bool block_scales) {
  if (fp8_cluster(s) == 1) return 128;  // lone CTAs: their one instance
  // Time ~ rounds x width / rate, rounds of CTA pairs (two tile rows a unit); the 192-wide tile
  // (one set) at 11/10 of the 128-wide one's rate (two sets), 8/7 with block scales. The
  // 192-wide tile's last round counts as the share of it its pieces take where it is cut
  // along K (fp8_tail_slices; the two-set loop has no split tail).
  const int64_t slots = sm_count / 2 > 0 ? sm_count / 2 : 1;
  const int64_t pair_rows = ceil_div(ceil_div(s.m, kBM), 2);
  auto rounds_by_width = [&](int bn, bool tail) {
    const int64_t units = pair_rows * ceil_div(s.n, bn);
    const int slices = tail ? fp8_tail_slices(units, slots, ceil_div(s.k, 128)) : 1;
    const double rounds = slices > 1 ? static_cast<double>(units / slots) + 1.0 / slices
                                     : static_cast<double>(ceil_div(units, slots));
    return rounds * bn;
  };
  const double num = block_scales ? 8 : 11, den = block_scales ? 7 : 10;
  return rounds_by_width(128, false) * num < rounds_by_width(192, true) * den ? 128 : 192;
}

int promoted_group_tile_width(const Shape& s, int sm_count, bool block_scales) {
  // Fewer than 256 rows a group on average: the products stream their weights, and the
  // narrower tile's larger count spreads the streams over more SMs.
  const int64_t rows_a_group = s.split == kSplitRows ? s.m / std::max(s.groups, 1) : s.m;
  if (rows_a_group < 2 * kBM) return 128;
  // Time ~ waves x width / rate, waves of lone CTAs over the tiles the list can hold at most
  // (max_tiles); the 192-wide tile at 11/10 of the 128-wide one's rate, 8/7 with block scales.
  const int64_t slots = sm_count > 0 ? sm_count : 1;
  auto waves_by_width = [&](int bn) { return ceil_div(max_tiles(s, bn), slots) * bn; };
  const int64_t num = block_scales ? 8 : 11, den = block_scales ? 7 : 10;
  return waves_by_width(128) * num < waves_by_width(192) * den ? 128 : 192;
}

int fp8_cluster(const Shape& s) {
  return s.m <= kBM ? 1 : 2;
}

int fp8_row_tile(const Shape& s, int sm_count) {
  if (s.m <= 64) return 64;
  if (s.m <= kBM) return 128;  // lone 128-row tiles, cut along K (fp8_k_slices): as fast or faster
  const int64_t tiles64 = ceil_div(s.m, 64) * ceil_div(s.n, 128);
  const int64_t tiles128 = ceil_div(s.m, kBM) * ceil_div(s.n, 128);
  constexpr int64_t kMaxDepth = 8192;
  return tiles64 <= sm_count && 2 * tiles128 <= sm_count && s.k <= kMaxDepth ? 64 : 128;
}

int fp8_row_tile_cluster(const Shape& s) {
  return s.m <= 64 ? 1 : s.m <= kBM ? 2 : 4;
}

int fp8_k_slices(const Shape& s, int sm_count) {
  if (fp8_cluster(s) != 1 || s.groups != 1 || s.split != 0 || sm_count < 1) return 1;
  constexpr int64_t kMaxSlices = 4;
  constexpr int64_t kMinBlocksASlice = 8;
  const int64_t tiles = ceil_div(s.m, kBM) * ceil_div(s.n, 128);
  const int64_t blocks = ceil_div(s.k, 128);
  int64_t slices = std::min({kMaxSlices, sm_count / tiles, blocks / kMinBlocksASlice});
  return static_cast<int>(std::max<int64_t>(slices, 1));
}

int fp8_tail_slices(int64_t units, int64_t slots, int64_t k_blocks) {
  if (slots < 1 || units < 1) return 1;
  constexpr int64_t kMaxSlices = 4;
  constexpr int64_t kMinBlocksAPiece = 4;
  constexpr double kMinSaving = 0.03;
  const int64_t tail = units % slots;
  if (tail == 0 || 2 * tail > slots) return 1;
  const int64_t slices = std::min({kMaxSlices, slots / tail, k_blocks / kMinBlocksAPiece});
  if (slices < 2) return 1;
  const double rounds = static_cast<double>(ceil_div(units, slots));
  if ((1.0 - 1.0 / static_cast<double>(slices)) / rounds < kMinSaving) return 1;
  return static_cast<int>(slices);
}

bool staged_c(const Shape& s) {
  switch (s.split) {
    case kSplitDepth:
      return true;
    case kSplitRows:
      return s.m > int64_t{32} * s.groups;
    default:
      return s.n >= 4096;
  }
}

int ctas_per_sm(const Shape& s, bool staged) {
  if (staged) return 1;
  const bool many_rows = s.m > int64_t{32} * s.groups;
  return s.split == kSplitRows && s.n < 4096 && many_rows ? 2 : 1;
}

}  // namespace grouped_plan
}  // namespace gemmt
