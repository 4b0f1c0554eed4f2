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

// Work unit u: its tile (index and grid position) and k-block range.
struct Unit {
  int tile, split, kb_begin, kb_end;
  int tm, tn;
};

__device__ __forceinline__ Unit unit_of(int u, const Params& p) {
  Unit w;
  w.tile = u / p.splits;
  w.split = u - w.tile * p.splits;
  w.kb_begin = w.split * p.kb_per_split;
  const int end = w.kb_begin + p.kb_per_split;
  w.kb_end = end < p.num_kb ? end : p.num_kb;
  tile_coords(w.tile, p, w.tm, w.tn);
  return w;
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
