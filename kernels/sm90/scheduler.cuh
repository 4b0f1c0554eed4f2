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
__device__ __forceinline__ void tile_coords(int t, const Params& p, int& tm, int& tn) {
  const int per_group = p.group * p.tiles_n;
  const int g = t / per_group;
  const int first = g * p.group;
  const int rows = min(p.tiles_m - first, p.group);
  const int r = t - g * per_group;
  tm = first + r % rows;
  tn = r / rows;
}

// What a unit does with its accumulators: store them (a whole tile, or a split-k slice's
// partial), or, as a piece of a stream-k tile, hand them to the tile's owner (kSkGive) or
// add the other piece's before storing (kSkTake).
enum class Role : int { kStore = 0, kSkGive = 1, kSkTake = 2 };

// Work unit: its tile (index and grid position), k-block range and role.
struct Unit {
  int tile, split, kb_begin, kb_end;
  int tm, tn;
  Role role;
  int sk_tile;  // the tile's index among the stream-k tiles (kSkGive / kSkTake)
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

// Unit i of cluster `cluster` (false past its last); the producer and the consumers walk
// the same sequence. First the whole tiles dealt round-robin (units cluster, cluster +
// clusters, ...), then the cluster's range of the stream-k tiles' k-blocks, laid end to end
// in tile order. A range is at least one tile long (the launch makes the stream-k tiles at
// least as many as the clusters), so a tile falls into at most two ranges: its first
// k-blocks end the range of cluster c, its last ones start the range of c + 1. The range is
// walked from its end, so cluster c computes its piece of the shared tile first and hands
// it over (kSkGive), while c + 1 computes its own last and adds c's (kSkTake): the partial
// is ready by then, and a cluster only ever waits on a lower-numbered one, which was
// launched before it. Stateless, like the plain round-robin it extends: the whole-tile
// units cost what they did before stream-k existed.
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
  const int64_t total = p.sk_kb_total;
  const int64_t lo = total * cluster / clusters;
  const int64_t hi = total * (cluster + 1) / clusters;
  const int nk = p.num_kb;
  const int64_t t = (hi - 1) / nk - piece;
  const int64_t start = t * nk;
  if (start + nk <= lo) return false;
  w.split = 0;
  w.kb_begin = static_cast<int>((lo > start ? lo : start) - start);
  w.kb_end = static_cast<int>((hi < start + nk ? hi : start + nk) - start);
  w.sk_tile = static_cast<int>(t);
  w.tile = p.sk_dp_units + w.sk_tile;
  w.role = w.kb_begin > 0 ? Role::kSkTake : (w.kb_end < nk ? Role::kSkGive : Role::kStore);
  tile_coords(w.tile, p, w.tm, w.tn);
  return true;
}

// First row and column of this CTA's block of the unit's tile (the CTAs of a pair stack
// along M); the producer and the consumers derive their coordinates from it alike.
template <int kCluster, int kBN>
__device__ __forceinline__ int2 tile_origin(const Unit& w, uint32_t rank) {
  return make_int2((w.tm * kCluster + static_cast<int>(rank)) * kBM, w.tn * kBN);
}

#endif  // GEMMT_SM90_DEVICE_CODE

}  // namespace
}  // namespace gemmt
