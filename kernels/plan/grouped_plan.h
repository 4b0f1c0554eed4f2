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
// tiles still fill every SM; narrower outputs, and lists with too few tiles (one decode
// product, a few wide experts), take 128 so that more SMs stream the weights. A split of rows
// is counted as its total rows, except where the groups stream their weights
// (streams_small_groups): there each group takes a row of tiles of its own
// (split_tiles_estimate), and 256 wins once its tiles fill 95% of the SMs, since a stage of it
// holds 32 KB of the weight (four stages, 128 KB in flight a CTA, against 96 KB in the 128-wide
// tile's six); but not where it computes 5% more columns than the 128-wide tile. Measured on
// an H200 against torch._grouped_mm (each form in the same rounds, bench moe's and held-out
// experts, 2-32 rows a group, forward and grad_input): on the 32 points where this changed the
// choice, median 1.244 -> 1.336 (bench moe's experts) and 1.319 -> 1.348 (held-out ones);
// 1408-column outputs on 256-wide tiles ran 1.04-1.16 against 1.19-1.22 (so they keep 128);
// with 64 rows a group 256 won at half of the points (so such groups are counted as before).
// The expert layers' decode forward, kernels only: Mixtral-like at 32 tokens 1.005 -> 0.772 ms
// (2.8 -> 3.7 TB/s of weight), Qwen3-MoE-like 0.328 -> 0.299 ms.
int tile_width(const Shape& s, int sm_count);
// A split of rows whose groups average at most 32 rows: products that stream their weights.
bool streams_small_groups(const Shape& s);
// The tiles of a split of rows at width bn, each group taking a row of tiles of its own (at
// least the total rows' count; it assumes every group has rows, and errs towards more).
int64_t split_tiles_estimate(const Shape& s, int bn);

// Whether C leaves a one-CTA tile through shared memory and TMA stores, where both epilogues
// can run (a 16-bit C with nothing to apply, 16-byte multiples). Staged stores run on while
// the next tile computes but take a stage of the ring. Measured on an H200 (same process,
// torch._grouped_mm's shapes of Mixtral, DBRX, Qwen3-MoE and DeepSeek-V3, 2-8192 rows a
// group, balanced and Zipf routing): with more than 32 rows a group, staged stores on one
// CTA an SM ran 0.99-1.35x the planner of before (two CTAs with the register epilogue below N
// 4096; worst case against torch 0.81 -> 0.99), the register epilogue on one CTA at most 3.5%
// ahead of them (64 rows a group); with at most 32 the register epilogue ran 0.96-1.09x the
// staged one (median 1.02, ahead at 21 of 24 points). The weight gradient (a split of the
// contraction dimension: a few k-blocks a tile, then a whole tile to write) 2.0x. Without a
// split, N >= 4096.
bool staged_c(const Shape& s);

// CTAs an SM, 1 or 2, where the two-CTA kernel can run (16-bit operands, a K-major A, C from
// registers): one wherever C is staged (`staged`: staged_c, where C can be). Otherwise two
// CTAs (128-wide tiles, a 3-stage ring) overlap one's epilogue and ramp-up with the other's
// products: on a split of rows below N 4096 with more than 32 rows a group (measured on an
// H200 against one CTA with the register epilogue: 0.98-1.16x).
int ctas_per_sm(const Shape& s, bool staged);

// The width of the promoted FP8 tile (a float32 sum of 128-deep partial products, row /
// column or tensor scales; one product, CTA pairs along M): 128 with two sets of partial sums
// (each k-block's products run while the one before is added to the float32 sum), or 192 with
// one (96 partial sums beside 96 float32 sums a thread; each k-block waited for, while the
// other warpgroup's products run); with 128x128 block scales too. The one with fewer waves x
// width, the 192-wide tile's counted at 10/11 (7/8 with block scales): it ran 1.09-1.11x the
// 128-wide tile's rate where their waves come out even (1.13x with block scales; H200, 21 LLM
// products at 8192 tokens: 192 alone 0.992 / 1.001 / 0.964 of torch._scaled_mm tensorwise /
// rowwise / blockwise, 128 alone 0.916 / 0.927 / 0.859). The 192-wide tile's last round counts
// as the share of it that its pieces take where fp8_tail_slices cuts it (the two-set loop has
// no split tail): 4096 x 4096 outputs, which kept 128 (2.8% faster than 192 uncut), now take
// 192 (tensorwise 0.92 -> 0.975 of torch._scaled_mm), and products of 129-256 rows, one round
// of tile pairs, take 192 cut along K (200 tokens: median 0.69 -> 0.81 tensorwise, 0.90 ->
// 1.13 rowwise). Lone CTAs (fp8_cluster) take 128 with one set.
int promoted_tile_width(const Shape& s, int sm_count, bool block_scales = false);

// The promoted FP8 tile's width for groups (a batch, or a split of rows; lone CTAs, one set of
// partial sums at either width): 128 below 256 rows a group on average (weight-streaming
// products, where more tiles keep more SMs streaming), else the same waves x width / rate rule
// as promoted_tile_width over the tiles the list can hold at most (max_tiles), on sm_count
// lone CTAs.
int promoted_group_tile_width(const Shape& s, int sm_count, bool block_scales = false);

// CTAs of an FP8 product (row / column or tensor scales) stacked in pairs along M, sharing B
// (2), or each alone (1). A pair covers 256 rows: over at most 128 its second CTA has none,
// and half the SMs would do the products (33-64 tokens of a 28672 x 8192 weight ran at
// 0.41-0.55x torch._scaled_mm, twice the time the weight's bytes take; H200).
int fp8_cluster(const Shape& s);

// The rows of an FP8 product's tiles (one product, row / column or tensor scales): 64 or 128. 64 up
// to 64 rows (lone CTAs, the second consumer warpgroup idle), 128 for 65-128 rows (lone CTAs cut
// along K: fp8_k_slices). Beyond, 64-row tiles in clusters that share B (fp8_row_tile_cluster),
// whose two consumer warpgroups take each tile's k-blocks in turn, where one round of them holds
// every tile, the 128-row tile pairs would fill less than half the SMs, and K is at most 8192: a
// product of 129-256 rows on a weight of a few thousand columns, whose 128-row pairs are cut along
// K to fill the SMs (fp8_tail_slices) and wait on the pieces' hand-over. Measured on an H200 (each
// form in its own process against torch._scaled_mm, twice): 160-256 rows x 3072 x 3072, in pairs
// 1.22-1.37x the 128-row pairs (tensorwise 0.51-0.57 -> 0.62-0.75 of torch, rowwise 0.70-0.72 ->
// 0.88-0.99); 100-128 rows 0.93-1.01x the lone 128-row tiles, so they keep them. A 64-row tile
// reads nearly twice the bytes from L2 a flop of the 128 x 192 pair: two rounds (160 x 5120 x 5120,
// 200 x 5120 x 5120) ran 0.70-0.80x, deep products (K 14336-27648) as low as 0.5x. The second
// warpgroup idle instead (GEMMT_FP8_WG_SPLIT=0): 0.86-0.97x the shared form.
int fp8_row_tile(const Shape& s, int sm_count);

// CTAs a cluster of 64-row FP8 tiles (fp8_row_tile 64), stacked along M and sharing each stage
// of B by multicast: 1 up to 64 rows, 2 up to 128, 4 beyond (a quarter of B from L2 a CTA).
// Measured on an H200 against pairs, each in its own process on the held-out widths at
// 160-256 rows: 1.00-1.20x (160-200 x 3072 x 3072 tensorwise 0.63-0.72 -> 0.70-0.80 of
// torch._scaled_mm; level at 256 rows, where both have four tiles).
int fp8_row_tile_cluster(const Shape& s);

// k-slices of an FP8 product on lone CTAs (fp8_cluster 1, row / column or tensor scales): its
// 128 x 128 tiles of at most 128 rows leave most SMs idle (a 4096-wide weight has 32), so K is
// cut into ranges of whole k-blocks, each written as float32 partial sums that a second pass
// adds (applying the bias and activation). As many slices as keep every unit in one wave, at
// most 4, each at least 8 k-blocks deep. Measured on an H200 (33-128 rows, 1-8 slices each):
// 4096 x 4096 1.1-1.3x and 4096 x 14336 1.3-1.9x with 4; 6144 x 4096 and 8192 x 8192 1.0-1.1x
// with 2 and slower with more; 14336 x 4096 (112 tiles) and 28672 x 8192 slower with any,
// the partials' bytes costing more than the idle SMs.
int fp8_k_slices(const Shape& s, int sm_count);

// Slices of K for the units of one FP8 product's last round (a tail): `units` tiles (pairs of
// tiles on CTA pairs) dealt over `slots` CTAs (pairs) leave units % slots of them to a last
// round in which the other SMs idle (all of them, where they fill less than one round: a
// product of 129-256 rows has one tile pair a column block); cut along K into s pieces, each
// CTA then takes one piece and the last piece of a tile adds the others' float32 sums (a
// hand-over through L2) before it stores C, so that round takes about 1/s of its time. 1 (no
// split) where the tail fills more than half a round, where a piece would hold fewer than
// four 128-deep k-blocks (k_blocks of the product), or where the rounds saved are under 3% of
// the product's (a split costs its hand-overs and a flag reset before the launch); at most 4.
int fp8_tail_slices(int64_t units, int64_t slots, int64_t k_blocks);

// An upper bound on the tiles of the list with this width (exact without a split): a split
// of rows or columns adds at most one partial tile per group, and one for the rows or
// columns past the last offset, which are written as zeros.
int64_t max_tiles(const Shape& s, int bn);

}  // namespace grouped_plan
}  // namespace gemmt
