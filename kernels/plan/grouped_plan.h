// Planning of the grouped and scaled Hopper GEMM (kernels/sm90/grouped_kernel.cuh): the tile
// width, CTAs an SM, the epilogue and the size of its persistent grid. Plain host C++, tested
// on CPU.
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

// CTAs an SM, 1 or 2, where the two-CTA kernel can run (16-bit operands, a K-major A): two
// CTAs (128-wide tiles, a 3-stage ring) overlap one's epilogue and ramp-up with the other's
// products. Measured on an H200 against one CTA (random-routing group sizes): 1.06-1.16x on
// Qwen3-like products (K 768-2048, N 1536-2048, 64-256 rows a group), 1.10-1.13x on
// DeepSeek-V3-like ones (K 7168, N 2048); 0.94-0.97x on exactly 256-row groups, 0.87x on
// 16-row groups, 0.97-1.01x at N >= 4096. So two on a split of rows below N 4096 with more
// than 32 rows a group.
int ctas_per_sm(const Shape& s);

// Whether C leaves a one-CTA tile through shared memory and TMA stores, where both epilogues
// can run (a 16-bit C with nothing to apply, 16-byte multiples). Staged stores run on while
// the next tile computes but take a stage of the ring. Measured on an H200 against the
// register epilogue: the weight gradient (a split of the contraction dimension, a few
// k-blocks a tile and then a whole tile to write) 2.0x; N >= 4096 1.03-1.11x; 16 rows a
// group 1.08-1.15x; 0.90-0.93x on 1536-wide products with 64-256 uneven rows a group.
bool staged_c(const Shape& s);

// The promoted FP8 tile (a float32 sum of 128-deep partial products, row / column or tensor
// scales; one product, CTA pairs along M): 128 x 128; 128 x 192, whose two consumer
// warpgroups hold 96 partial sums beside 96 float32 sums a thread and read less of each
// operand per product; or 192 x 128, three consumer warpgroups of 64 rows, so that while one
// adds its partial sums two have products queued. Time ~ waves of CTA pairs x the tile's area
// / its rate. Rates measured on an H200 on LLM products: 128 x 192 ran its waves 1.10-1.13x
// faster than 128 x 128 (rate 1.12); 192 x 128 ran them 1.02-1.09x (median 1.045) faster
// than 128 x 192 (rate 1.17). A wider tile wins unless its coarser tiles leave more of the
// last wave idle.
struct PromotedTile {
  int rows, cols;
};
PromotedTile promoted_tile(const Shape& s, int sm_count);

// An upper bound on the tiles of the list with this width (exact without a split): a split
// of rows or columns adds at most one partial tile per group, and one for the rows or
// columns past the last offset, which are written as zeros.
int64_t max_tiles(const Shape& s, int bn);

}  // namespace grouped_plan
}  // namespace gemmt
