// What the grouped GEMM's host side (grouped_gemm_sm90.cu) hands to the translation units that
// hold its kernel instances (grouped_instances_*.cu): the kernel parameters, the two tensor
// maps, and the instance's compile-time choices. Host code only.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gemmt/activation.h"
#include "gemmt/grouped_gemm.h"

namespace gemmt {
namespace sm90 {

// The kernel's shared memory (grouped_kernel.cuh), in this order: the operand ring (a stage:
// a_rows rows of A and bn rows of B, 128 bytes of K each), C's tile when it is staged (16-bit
// C), the ring's barriers (room for kGroupedMaxRing stages) and, for a split of rows, columns
// or K, the table of the groups' first tiles; 1 KB more aligns the ring to the 1024-byte
// period of the 128-byte swizzle.
constexpr int kGroupedSmemLimit = 227 * 1024;
constexpr int kGroupedMaxRing = 16;
constexpr int kGroupedBarrierBytes = 2 * kGroupedMaxRing * 8;
constexpr int kGroupedTableBytes = 2 * (kGroupedMaxGroups + 2) * 4;
// The ring of a CTA that shares its SM with another (128-wide 16-bit tiles).
constexpr int kGroupedPairStages = 3;

// FP8 block scales staged in the ring, a stage's k-block's: A's of the tile's 128 rows, then
// B's of its column block (128x128 scales; 129 floats padded to 16 bytes) or of each of its
// 128 columns (128x1 scales).
constexpr int kGroupedSquareScaleBytes = 132 * 4;
constexpr int kGroupedColsScaleBytes = 256 * 4;
// A stage's bytes of block scales: none without them.
constexpr int grouped_scale_bytes(bool block, bool block_cols) {
  return !block ? 0 : block_cols ? kGroupedColsScaleBytes : kGroupedSquareScaleBytes;
}

// The hand-over of a 64-row tile whose k-blocks the two consumer warpgroups share
// (GroupedParams::wg_split_k): each leaves the half of the tile's columns it does not store,
// as float32 sums, to the other. It takes the room of staged C, which such tiles do not use.
constexpr int grouped_exchange_bytes(int a_rows, int bn) {
  return a_rows * bn * 4;
}

constexpr int grouped_smem_bytes(int a_rows, int bn, int stages, bool staged_c, bool table,
                                 int scale_bytes = 0, bool exchange = false) {
  return stages * ((a_rows + bn) * 128 + scale_bytes) +
         (exchange   ? grouped_exchange_bytes(a_rows, bn)
          : staged_c ? a_rows * bn * 2
                     : 0) +
         kGroupedBarrierBytes + (table ? kGroupedTableBytes : 0) + 1024;
}

// The deepest ring that fits beside the rest: 6 stages on the 128 x 128 tile with the table, 7
// without it (one product, or one cut into k-slices), 5 / 6 with C staged; 4 (3) on the 256-wide
// tile, 5 (4) on the 192-wide one, 9 (8) with 64 rows of A, table or not, 8 with 64 rows of A
// whose k-blocks the warpgroups share.
constexpr int grouped_ring_stages(int a_rows, int bn, bool staged_c, bool table,
                                  int scale_bytes = 0, bool exchange = false) {
  int stages = kGroupedMaxRing;
  while (stages > 1 && grouped_smem_bytes(a_rows, bn, stages, staged_c, table, scale_bytes,
                                          exchange) > kGroupedSmemLimit) {
    --stages;
  }
  return stages;
}
static_assert(grouped_ring_stages(128, 128, false, true) == 6 &&
                  grouped_ring_stages(128, 128, false, false) == 7 &&
                  grouped_ring_stages(128, 128, true, false) == 6 &&
                  grouped_ring_stages(128, 256, true, true) == 3 &&
                  grouped_ring_stages(64, 128, false, true) == 9 &&
                  grouped_ring_stages(64, 128, false, false, 0, true) == 8,
              "the ring depths the comment above states");

// The kernel's parameters (include/gemmt/grouped_gemm.h has their meaning), with 32-bit
// extents: the host refuses products whose extents do not fit.
struct GroupedParams {
  int split, groups;
  const int* offs;
  int m, n, k;           // the split extent is the total
  int tiles_m, tiles_n;  // of the extents that are not split
  void* c;
  int64_t c_sg, ldc;
  int out;         // OutKind
  int scale;       // ScaleKind
  int block_cols;  // kBlock: B's scales are 128x1 (one a column and k-block), not 128x128
  const float* sa;
  int64_t sa_s0, sa_s1, sa_sg;
  const float* sb;
  int64_t sb_s0, sb_s1, sb_sg;
  const void* bias;
  int64_t bias_sg;
  Activation act;
  // k-slices of one product (split kNone, a group a slice): each slice's depth, a multiple of
  // the stage's K, slice g taking [g * k_slice, min(k, (g + 1) * k_slice)); 0 without.
  int k_slice;
  // A K-major A of 65-127 rows on lone CTAs (one product) as two 64-row boxes, the second
  // a_half = m - 64 rows below the first, so that no box crosses A's end; the rows the halves
  // share are computed and written twice, alike. 0: one box of the stage's rows.
  int a_half;
  // 64 rows of A a stage (GroupedLaunch::a_rows): 1 deals each tile's k-blocks to the two
  // consumer warpgroups in turn, which then add their sums through shared memory (the
  // exchange after the ring) and store half of the tile's columns each; 0 leaves the second
  // warpgroup idle.
  int wg_split_k;
  int stages;   // the depth of the operand ring (grouped_ring_stages, or kGroupedPairStages)
  int store_c;  // 1: C leaves through shared memory and TMA stores (the map c), 16-bit kinds
  // A split of K (16-bit kinds): 1 zeroes the stage of a group's last k-block to its end, both
  // warpgroups together (the form of before, for A/B runs); 0 only the rest of the last k-step
  // that holds the group's rows, each warpgroup what it reads (k_tail_steps).
  int full_k_tail;
  // A split of K: 1 deals the tiles out deepest group first, in a snake over the CTAs
  // (order_groups_by_depth); 0 in group order, round robin.
  int depth_order;
  // The two-set promoted FP8 loop: 1 stages a tile's C once the next tile's first k-block is
  // issued, 0 at the tile's end (the form of before, for A/B runs).
  int defer_store;
  // One FP8 product's last round split along K (grouped_plan::fp8_tail_slices; the one-set
  // promoted loops, grouped_kernel.cuh: kTail): units from
  // tail_first on are pieces, tail_slices a tile, piece s taking K [s * tail_depth, ...) (a
  // multiple of the stage's K). Each piece but a tile's last gives its float32 sums to a slot
  // of tail_partial (2 x 128 x bn / 2 floats, per giving piece and CTA of a pair) and raises
  // its warpgroup's flag in tail_flags (two a slot, zeroed before the launch); the last piece
  // adds them in slice order and stores C. tail_slices 1: no split.
  int tail_first, tail_slices, tail_depth;
  float* tail_partial;
  int* tail_flags;
};

struct GroupedLaunch {
  CUtensorMap a, b;
  CUtensorMap c;  // C's 3-D map (columns, rows, matrix) when p.store_c; unused otherwise
  GroupedParams p;
  int grid;
  bool a_mn, b_mn;
  int bn;       // 128 or 256 (192: the promoted FP8 tile)
  int promote;  // FP8 float32 sum of 128-deep partial products: 0 none, 1 one set of partial
                // sums, 2 two in runs of four k-blocks
  bool block;   // FP8: with 1x128 / 128x128 (or 128x1) block scales, staged in the ring
  int cluster;  // 1, 2 (CTA pairs) or 4 (64-row tiles) along M sharing B (FP8, one group)
  int per_sm;   // CTAs an SM: 1, or 2 (128-wide 16-bit tiles with K-major A)
  int a_rows;   // rows of A a stage holds (the box of map a) and a tile's rows: 128, or 64
                // (FP8 products of few rows, grouped_plan::fp8_row_tile)
};

// One per kind and tile width (16-bit) or operand pair (float8), each in its own translation
// unit (grouped_instances_*.cu), so that they compile side by side.
cudaError_t grouped_launch_bf16_128(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_bf16_256(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_f16_128(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_f16_256(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_e4m3(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_e5m2_e4m3(const GroupedLaunch& l, cudaStream_t stream);
cudaError_t grouped_launch_e4m3_e5m2(const GroupedLaunch& l, cudaStream_t stream);

}  // namespace sm90
}  // namespace gemmt
