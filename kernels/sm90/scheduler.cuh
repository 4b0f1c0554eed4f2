// The Hopper GEMM's persistent tile scheduler: work units (tile, k-slice) in a grouped
// raster order, so CTAs running at the same time share A and B panels in L2.
#pragma once

#include "sm90/config.cuh"

namespace gemmt {
namespace {

#if defined(GEMMT_SM90_DEVICE_CODE)

// The tile and the k-block range of work unit u.
struct Unit {
  int tile, split, kb_begin, kb_end;
};

__device__ __forceinline__ Unit unit_of(int u, const Params& p) {
  Unit w;
  w.tile = u / p.splits;
  w.split = u - w.tile * p.splits;
  w.kb_begin = w.split * p.kb_per_split;
  const int end = w.kb_begin + p.kb_per_split;
  w.kb_end = end < p.num_kb ? end : p.num_kb;
  return w;
}

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

#endif  // GEMMT_SM90_DEVICE_CODE

}  // namespace
}  // namespace gemmt
