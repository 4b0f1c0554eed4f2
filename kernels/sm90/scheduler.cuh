// The Hopper GEMM's persistent tile scheduler: work units (tile, k-slice) in a grouped
// raster order, so CTAs running at the same time share A and B panels in L2.
#pragma once

#include "sm90/config.cuh"

namespace gemmt {
namespace {

#if defined(GEMMT_SM90_DEVICE_CODE)

// Grouped raster over the tile grid: `group` tile rows are walked top to bottom before
// moving one tile column right, so the CTAs running at the same time share A and B panels
// in L2.
__device__ __forceinline__ void band_raster(int t, int band, int tiles_m, int tiles_n, int& tm,
                                            int& tn) {
  const int per_band = band * tiles_n;
  const int g = t / per_band;
  const int first = g * band;
  const int rows = min(tiles_m - first, band);
  const int r = t - g * per_band;
  tm = first + r % rows;
  tn = r / rows;
}

__device__ __forceinline__ void tile_coords(int t, const Params& p, int& tm, int& tn) {
  band_raster(t, p.group, p.tiles_m, p.tiles_n, tm, tn);
}

// What a unit does with its accumulators: store them (a whole tile, or a split-k slice's
// partial), or, as a piece of a stream-k tile, hand them to the tile's last piece (kSkGive)
// or, as that last piece, add the other pieces' before storing (kSkTake).
enum class Role : int { kStore = 0, kSkGive = 1, kSkTake = 2 };

// Work unit: its tile (index and grid position), k-block range and role.
struct Unit {
  int tile, split, kb_begin, kb_end;
  int tm, tn;
  Role role;
  int sk_tile;  // the tile's index among the stream-k tiles
};

__device__ __forceinline__ Unit unit_of(int u, const Params& p) {
  Unit w;
  w.tile = u / p.splits;
  w.split = u - w.tile * p.splits;
  w.kb_begin = w.split * p.kb_per_split;
  const int end = w.kb_begin + p.kb_per_split;
  w.kb_end = end < p.num_kb ? end : p.num_kb;
  w.role = Role::kStore;
  w.sk_tile = 0;
  tile_coords(w.tile, p, w.tm, w.tn);
  return w;
}

// End (exclusive) of cluster q's range of the stream-k k-blocks, which are laid end to end
// in tile order and cut into one equal range per cluster; q's range starts where q - 1's ends.
__device__ __forceinline__ int64_t sk_range_end(const Params& p, int q, int clusters) {
  return static_cast<int64_t>(p.sk_kb_total) * (q + 1) / clusters;
}

// Unit i of cluster `cluster` (false past its last); the producer and the consumers walk
// the same sequence. First the whole tiles dealt round-robin (units cluster, cluster +
// clusters, ...), then the cluster's range of the stream-k k-blocks, walked from its end.
// A tile is cut where ranges meet: its last piece (the one holding its last k-block) stores
// C after adding the float32 partials of the others (kSkTake); every other piece hands its
// partial over (kSkGive). Only a range's last piece can end inside a tile, so a cluster
// gives at most once, and it gives first: the piece at the end of its range is the first it
// walks. The taker walks its piece last and waits only on lower-numbered clusters, which
// were launched before it. Ranges at least a tile long cut a tile in two at most; shorter
// ones (fewer tiles than clusters) also leave pieces in the middle of a tile, each a whole
// range. Stateless, like the plain round-robin it extends: the whole-tile units cost what
// they did before stream-k existed.
// kStreamK: compiled for the wide tile only, the one stream-k runs on.
template <bool kStreamK>
__device__ __forceinline__ bool unit_at(int i, const Params& p, int cluster, int clusters,
                                        Unit& w) {
  const int u = cluster + i * clusters;
  if (u < p.sk_dp_units) {
    w = unit_of(u, p);
    return true;
  }
  if (!kStreamK || p.sk_kb_total == 0) return false;
  const int piece = i - p.sk_dp_units / clusters;
  const int64_t lo = cluster == 0 ? 0 : sk_range_end(p, cluster - 1, clusters);
  const int64_t hi = sk_range_end(p, cluster, clusters);
  const int nk = p.num_kb;
  const int64_t t = (hi - 1) / nk - piece;
  const int64_t start = t * nk;
  if (hi <= lo || start + nk <= lo) return false;
  w.split = 0;
  w.kb_begin = static_cast<int>((lo > start ? lo : start) - start);
  w.kb_end = static_cast<int>((hi < start + nk ? hi : start + nk) - start);
  w.sk_tile = static_cast<int>(t);
  w.tile = p.sk_dp_units + w.sk_tile;
  w.role = w.kb_end < nk ? Role::kSkGive : (w.kb_begin > 0 ? Role::kSkTake : Role::kStore);
  tile_coords(w.tile, p, w.tm, w.tn);
  return true;
}

// The clusters that gave pieces of a taker's tile: q = cluster - 1, cluster - 2, ... while
// q's range ends past the tile's first k-block. Calls f(q) for each, nearest first.
template <typename F>
__device__ __forceinline__ void for_each_giver(const Params& p, const Unit& w, int cluster,
                                               int clusters, F&& f) {
  const int64_t start = static_cast<int64_t>(w.sk_tile) * p.num_kb;
  for (int q = cluster - 1; q >= 0 && sk_range_end(p, q, clusters) > start; --q) f(q);
}

// Where the second of a K-major B tile's two boxes (kHalf rows each) starts, in rows from the
// tile's first: kHalf, or, where that box would cross the end of B's n rows, moved back to end
// there (rounded up to 8 rows, a 128B-swizzle atom, so that its rows keep their place in the
// stage) over rows of the first box, which it rewrites with the same data. Boxes that cross
// the end cost time in proportion to their missing rows (measured: sm90::last_tile_row).
template <int kHalf>
__device__ __forceinline__ int second_b_box(int n0, int n) {
  const int rest = n - n0 - kHalf;  // rows of B the second box has to cover
  if (rest >= kHalf || rest <= 0) return kHalf;
  return (rest + 7) & ~7;
}

// First row and column of this CTA's block of the unit's tile (the CTAs of a pair stack
// along M, and the last row of tiles ends at row m: Params::last_m0); the producer and the
// consumers derive their coordinates from it alike.
template <int kCluster, int kBN>
__device__ __forceinline__ int2 tile_origin(const Unit& w, uint32_t rank, const Params& p) {
  return make_int2(min((w.tm * kCluster + static_cast<int>(rank)) * kBM, p.last_m0), w.tn * kBN);
}

#endif  // GEMMT_SM90_DEVICE_CODE

}  // namespace
}  // namespace gemmt
