// Planning of the grouped and scaled Hopper GEMM (kernels/sm90/grouped_kernel.cuh): the tile
// width and the size of its persistent grid. Plain host C++, tested on CPU.
#pragma once

#include <cstdint>

namespace gemmt {
namespace grouped_plan {

// The product as the host knows it: split (GroupSplit) names the extent the device-side
// offsets cut into `groups` ranges, whose total it is; the host never reads the offsets.
struct Shape {
  int64_t m = 0, n = 0, k = 0;
  int groups = 1;
  int split = 0;
};

// 128 or 256. The 256-wide tile reads A once for twice the columns, so it wins wherever its
// tiles still fill every SM; narrower outputs, and lists with too few tiles (small experts,
// decode), take 128 so that more SMs stream the weights.
int tile_width(const Shape& s, int sm_count);

// An upper bound on the tiles of the list with this width (exact without a split): a split
// of rows or columns adds at most one partial tile per group, and one for the rows or
// columns past the last offset, which are written as zeros.
int64_t max_tiles(const Shape& s, int bn);

}  // namespace grouped_plan
}  // namespace gemmt
