// Hopper grouped and scaled GEMM: a list of products C_g = epilogue(scale * A_g B_g) run by one
// persistent grid (include/gemmt/grouped_gemm.h has the arguments). It serves grouped_mm (the
// groups of a mixture-of-experts layer, bf16 / fp16) and scaled_mm (float8, one group).
//
// The groups' extents can come from int32 offsets that stay on the device: each CTA reads them
// once, into a table of every group's first tile (a prefix sum over the groups' tile counts),
// and then walks the tiles t = blockIdx.x, + gridDim.x, ... over all groups, so that small
// and uneven groups share the SMs without a host synchronisation, and the launch can be
// captured in a CUDA graph. Empty groups have no tiles (a split of the contraction dimension
// still writes its zeros). One product can also run as groups that are slices of its K
// (p.k_slice), each writing float32 partial sums for a reduction after it: few-row FP8
// products, whose tiles alone would leave most SMs idle.
//
// The CTA is the dense Hopper kernel's (kernel.cuh) without its clusters and stream-k: one
// producer warp fills a TMA ring; two consumer warpgroups each own 64 rows of a 128 x kBN tile
// (wgmma from shared memory) and write C from registers with the group's row and column
// bounds, the scales, the bias and the activation applied; or, where the host asks for it (the
// weight gradient, whose tiles are a few k-blocks deep and bound by their stores), each warp
// stages its 16 lines in shared memory and leaves them to TMA stores that run on while the
// next tile computes (gg_store_staged).
//
// FP8 (K-major operands only, 128 of K a stage): without fast accumulation each 128-deep
// partial product is issued into fresh accumulators and added to the float32 sum, scaled by
// its 1x128 / 128x128 block scales where there are some; the tensor cores' own FP8 sum keeps
// too few bits for a long K. The promotion needs a second accumulator set, so those tiles are
// 128 wide; fast accumulation runs the plain loop.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "common/shared_memory.cuh"
#include "gemmt/arith.h"
#include "gemmt/grouped_gemm.h"
#include "gemmt/launch.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/grouped_launchers.h"
#include "sm90/ptx.cuh"
#include "sm90/scheduler.cuh"

namespace gemmt {
namespace {

constexpr int kGgThreads = 384;
// Two CTAs an SM: the consumer warpgroups are warps 0-7 and the producer one warp after them,
// so that 2 x 288 threads leave 112 registers a thread (wgmma's 64 accumulators and their
// addressing fit; 384 threads would leave 80, too few, and setmaxnreg cannot give a one-warp
// producer's registers away).
constexpr int kGgPairThreads = 288;
template <int kPerSm>
constexpr int gg_threads() {
  return kPerSm == 1 ? kGgThreads : kGgPairThreads;
}
constexpr int kGgBM = 128;
// Named barriers 4 and 5: a consumer warpgroup's hand-over of a split tail's sums (1-3 zero
// the K tails of a split of K).
constexpr uint32_t kTailBarrier = 4;
// Named barrier 6: the two consumer warpgroups' exchange of a 64-row tile's sums
// (GroupedParams::wg_split_k).
constexpr uint32_t kExchangeBarrier = 6;
// The kernel's kBlock: FP8 block scales of A (1x128) with B's 128x128 ones, or with 128x1 ones
// (a scale a column and k-block: the blockwise weight gradient). The producer warp copies each
// k-block's scales into the ring beside it, so that the consumers read them from shared memory
// after the stage's wait: read from global memory at each promotion instead, they had the
// consumers wait on those loads (0.57 / 0.46 of the staged form's speed, docs/performance.md).
constexpr int kBlockNone = 0;
constexpr int kBlockSquare = 1;
constexpr int kBlockCols = 2;
constexpr int staged_scale_bytes(int block) {
  return sm90::grouped_scale_bytes(block != kBlockNone, block == kBlockCols);
}

// kARows: the rows of A a stage and a tile hold, 128, or 64 for FP8 products of few rows: with
// half of A's bytes a stage the ring holds 8-9 stages instead of 6, half again as much of B is
// in flight, and a product of 65-256 rows has twice the tiles to spread over the SMs. The two
// consumer warpgroups then take a tile's k-blocks in turn (GroupedParams::wg_split_k), or the
// second one idles (a product of at most 64 rows, the form of before).
template <int kKind, int kBN, int kARows = kGgBM>
struct GgCfg {
  static_assert(kBN == 128 || kBN == 192 || kBN == 256,
                "grouped tiles: 128 x 128, 128 x 192 (FP8 promoted) and 128 x 256");
  static_assert(kARows == kGgBM || (kARows == 64 && kBN == 128), "64 rows of A: 128-wide tiles");
  static constexpr int kElt = is_fp8_kind(kKind) ? 1 : 2;
  static constexpr int kBK = 128 / kElt;  // K per stage: one 128-byte row
  // The ring's depth is a launch parameter (sm90::grouped_ring_stages): C staged through shared
  // memory (16-bit C, the tile's rows by kBN) and the group table take the room of stages.
  static constexpr int kABytes = kARows * 128;
  static constexpr int kBBytes = kBN * 128;
  static constexpr int kAcc = kBN / 2;
  static constexpr int kCBytes = kARows * kBN * 2;
  static constexpr int kXBytes = sm90::grouped_exchange_bytes(kARows, kBN);
  static constexpr int smem_bytes(int stages, bool staged_c, bool table, int scale_bytes = 0,
                                  bool exchange = false) {
    return sm90::grouped_smem_bytes(kARows, kBN, stages, staged_c, table, scale_bytes, exchange);
  }
  static_assert(smem_bytes(sm90::grouped_ring_stages(kARows, kBN, false, true), false, true) <=
                    sm90::kGroupedSmemLimit,
                "a ring of one stage exceeds the shared memory of one CTA");
};

using GgParams = sm90::GroupedParams;

// One tile of one group: where its operands and its part of C are.
struct GgUnit {
  int g;
  int tm, tn;             // tile position within the group
  int begin;              // first row / column / k of the group's split range (0 unsplit)
  int rows, cols, depth;  // the group's extents
  int slice, piece;       // a split tail's piece: its slice of K and its tile (-1: a whole tile)
};

#if defined(GEMMT_SM90_DEVICE_CODE)

__device__ __forceinline__ int ceil_div_dev(int a, int b) {
  return (a + b - 1) / b;
}

// Groups in the table: a split of rows or columns adds a tail group, the rows / columns past
// the last offset, which belong to no group and are written as zeros (torch._grouped_mm's
// semantics).
__device__ __forceinline__ int table_groups(const GgParams& p) {
  const bool tail = p.split == static_cast<int>(GroupSplit::kRows) ||
                    p.split == static_cast<int>(GroupSplit::kCols);
  return p.groups + (tail ? 1 : 0);
}

// The group table (first tile, range start), built by the first warp from the offsets.
// Offsets are clamped into [0, total] and made non-decreasing, so bad offsets give wrong
// numbers but never an access outside the operands.
template <int kBN>
__device__ void build_group_table(const GgParams& p, int* first_tile, int* begin) {
  const int ng = table_groups(p);
  const int lane = threadIdx.x & 31;
  const int total = p.split == static_cast<int>(GroupSplit::kRows)   ? p.m
                    : p.split == static_cast<int>(GroupSplit::kCols) ? p.n
                                                                     : p.k;
  int carry = 0, prev_end = 0;
  for (int base = 0; base < ng; base += 32) {
    const int g = base + lane;
    int end = 0;
    if (g < p.groups) end = min(max(__ldg(p.offs + g), 0), total);
    if (g == p.groups && ng > p.groups) end = total;  // the tail group
    // Running maximum over the warp and what came before: the clamped group ends.
    int run = end;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, run, d);
      if (lane >= d) run = max(run, o);
    }
    run = max(run, prev_end);
    int start = __shfl_up_sync(0xffffffffu, run, 1);
    if (lane == 0) start = prev_end;
    const int extent = run - start;
    int tiles = 0;
    if (g < ng) {
      if (p.split == static_cast<int>(GroupSplit::kRows)) {
        tiles = ceil_div_dev(extent, kGgBM) * p.tiles_n;
      } else if (p.split == static_cast<int>(GroupSplit::kCols)) {
        tiles = p.tiles_m * ceil_div_dev(extent, kBN);
      } else {
        tiles = p.tiles_m * p.tiles_n;
      }
    }
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    if (g < ng) {
      first_tile[g] = carry + incl - tiles;
      begin[g] = start;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
    prev_end = __shfl_sync(0xffffffffu, run, 31);
  }
  if (lane == 0) {
    first_tile[ng] = carry;
    begin[ng] = prev_end;
  }
}

// A split of K (GroupedParams::depth_order): first_tile[s] becomes the group of rank s, the
// groups deepest first (ties in group order). A tile's time grows with its group's depth, and
// dealt in this order (gg_nth_unit) the deep tiles spread over the CTAs before the shallow
// ones fill the gaps: with skewed routing the first groups' tiles otherwise went to the same
// CTAs round after round. Run by every thread; the table is built.
__device__ __forceinline__ void order_groups_by_depth(const GgParams& p, int* first_tile,
                                                      const int* begin) {
  for (int g = threadIdx.x; g < p.groups; g += blockDim.x) {
    const int d = begin[g + 1] - begin[g];
    int rank = 0;
    for (int h = 0; h < p.groups; ++h) {
      const int e = begin[h + 1] - begin[h];
      rank += (e > d || (e == d && h < g)) ? 1 : 0;
    }
    first_tile[rank] = g;
  }
}

// The unit a CTA takes in its round i: round robin over the grid, every other round in reverse
// (a snake) where the units come deepest first, so that each CTA's rounds add up evenly.
__device__ __forceinline__ int gg_nth_unit(int i, int first, int stride, bool snake) {
  return i * stride + ((snake && (i & 1)) ? stride - 1 - first : first);
}

// Tile t of the whole list (false past the last). Within a group the tiles go down bands of
// 8 tile rows, one column at a time (scheduler.cuh's raster), so that concurrent CTAs share
// the group's B panel.
template <int kBN, bool kTail>
__device__ __forceinline__ bool gg_unit(int t, const GgParams& p, const int* first_tile,
                                        const int* begin, GgUnit& u) {
  int lt = t;
  int tiles_m = p.tiles_m, tiles_n = p.tiles_n;
  u.rows = p.m;
  u.cols = p.n;
  u.depth = p.k;
  u.begin = 0;
  u.slice = -1;
  u.piece = 0;
  if (p.split == static_cast<int>(GroupSplit::kNone)) {
    int whole = t;  // the tile of unit t
    if (kTail && p.tail_slices > 1 && t >= p.tail_first) {
      const int j = t - p.tail_first;
      u.piece = j / p.tail_slices;
      u.slice = j - u.piece * p.tail_slices;
      whole = p.tail_first + u.piece;
    }
    const int per = tiles_m * tiles_n;
    if (whole >= per * p.groups) return false;
    u.g = whole / per;
    lt = whole - u.g * per;
    if (p.k_slice > 0) {
      u.begin = u.g * p.k_slice;
      u.depth = min(p.k_slice, p.k - u.begin);
    }
    if (kTail && u.slice >= 0) {
      u.begin = u.slice * p.tail_depth;
      u.depth = min(p.tail_depth, p.k - u.begin);
    }
  } else if (p.split == static_cast<int>(GroupSplit::kDepth) && p.depth_order != 0) {
    // Every group has the same tiles; first_tile holds the groups deepest first
    // (order_groups_by_depth).
    const int per = tiles_m * tiles_n;
    if (t >= per * p.groups) return false;
    const int s = t / per;
    u.g = first_tile[s];
    lt = t - s * per;
    u.begin = begin[u.g];
    u.depth = begin[u.g + 1] - u.begin;
  } else {
    const int ng = table_groups(p);
    if (t >= first_tile[ng]) return false;
    int lo = 0, hi = ng - 1;  // the last group whose first tile is <= t
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (first_tile[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    u.g = lo;
    lt = t - first_tile[lo];
    u.begin = begin[lo];
    const int extent = begin[lo + 1] - u.begin;
    if (p.split == static_cast<int>(GroupSplit::kRows)) {
      u.rows = extent;
      tiles_m = ceil_div_dev(extent, kGgBM);
    } else if (p.split == static_cast<int>(GroupSplit::kCols)) {
      u.cols = extent;
      tiles_n = ceil_div_dev(extent, kBN);
    } else {
      u.depth = extent;
    }
    if (lo == p.groups) u.depth = 0;  // the tail: zeros
  }
  band_raster(lt, 8, tiles_m, tiles_n, u.tm, u.tn);
  return true;
}

// Zeroes the K rows [valid, end) of a stage's MN-major operand (a split of the contraction
// dimension ends inside it, and the rest belongs to the next group): each K row is a
// 128-byte line of every 64-wide box, by `threads` threads together (tid of them). (A split of
// the contraction dimension takes MN-major operands only: grouped_gemm_sm90_supported.)
template <int kElt>
__device__ __forceinline__ void zero_k_tail(uint32_t base, int boxes, int valid, int end, int tid,
                                            int threads) {
  constexpr int kRows = 128 / kElt;  // K extent of the stage
  const int tail = end - valid;
  // Per box, its tail rows' 16-byte chunks (a few a thread: no division in the loop).
  for (int box = 0; box < boxes; ++box) {
    for (int i = tid; i < tail * 8; i += threads) {
      const uint32_t addr = base + box * (kRows * 128) + (valid + (i >> 3)) * 128 + (i & 7) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
    }
  }
}

// The wgmma k-steps (16 deep for 16-bit kinds) of a stage that hold a group's last `valid`
// rows: only the rows up to their end need zeros, the steps past it having their products
// overwritten. GroupedParams::full_k_tail takes all four (the stage zeroed to its end).
template <int kElt>
__device__ __forceinline__ int k_tail_steps(int valid, int full_k_tail) {
  constexpr int kStepRows = 32 / kElt;
  constexpr int kSteps = 128 / 32;
  if (valid >= kSteps * kStepRows || full_k_tail != 0) return kSteps;
  return (valid + kStepRows - 1) / kStepRows;
}

// Four consecutive scales of a 128-long run (A's rows of a tile, B's columns with 128x1
// scales) into dst, lane l taking elements 4l..4l+3 of the run that starts at `first` (of
// `count`) and steps by `stride`: one 16-byte copy where the run is contiguous (`vec`: unit
// stride, 16-byte aligned; `first` a multiple of 4, as every tile's first row and column is)
// and wholly in range, else four 4-byte copies, the elements past the end repeating the last
// one (their sums are dropped). The single copy matters: the producer warp issues these
// beside the stage's operands, and with four copies and their addresses a stage, it was busy
// 92% of the time and the consumers waited on it.
__device__ __forceinline__ void stage_scale_run(uint32_t dst, const float* src, int first,
                                                int count, int64_t stride, bool vec, int lane) {
  if (vec && first % 4 == 0 && first + 128 <= count) {
    cp_async_16(dst + 16 * lane, src + first + 4 * lane);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = min(first + 4 * lane + i, count - 1);
    cp_async_4(dst + 4 * (4 * lane + i), src + e * stride);
  }
}

// Whether a run of scales with this stride can be copied 16 bytes at a time from any k-block
// of any group (stage_scale_run).
__device__ __forceinline__ bool scale_runs_vec(const float* base, int64_t stride, int64_t kb_stride,
                                               int64_t group_stride) {
  return stride == 1 && kb_stride % 4 == 0 && group_stride % 4 == 0 && is_aligned<16>(base);
}

// Group g's block scales (the tail group of a split of rows, rows past the last offset whose
// sums are dropped, reads the last group's): found once a tile, not at every k-block. One
// product (kGroups false: CTA pairs) has none to find; its producer warp's 40 registers have no
// room for them (the 128x1 instance spilled).
template <bool kGroups>
struct GgBlockScales {
  const float* sa;
  const float* sb;
  __device__ __forceinline__ GgBlockScales(const GgParams& p, int g) {
    if constexpr (kGroups) {
      const int64_t gs = min(g, p.groups - 1);
      sa = p.sa + gs * p.sa_sg;
      sb = p.sb + gs * p.sb_sg;
    } else {
      sa = p.sa;
      sb = p.sb;
    }
  }
};

// The block scales of k-block kb into a stage (kBlockSquare, kBlockCols), by the producer
// warp: A's scales of the tile's rows, then B's of the tile's columns (128x1) or of the column
// blocks it spans (128x128: one for a 128-wide tile, two for a 192-wide one, whose columns
// start on a block or halfway through one; past N's last block the last again). Any strides
// (`vec`: scale_runs_vec of A's, B's).
template <bool kCols, bool kGroups, int kBN>
__device__ __forceinline__ void stage_block_scales(const GgParams& p, uint32_t dst,
                                                   const GgBlockScales<kGroups>& gb, int a_row,
                                                   int b_col, int kb, const bool (&vec)[2],
                                                   int lane) {
  const float* const sa = gb.sa + static_cast<int64_t>(kb) * p.sa_s1;
  const float* const sb = gb.sb + static_cast<int64_t>(kb) * p.sb_s0;
  stage_scale_run(dst, sa, a_row, p.m, p.sa_s0, vec[0], lane);
  if constexpr (kCols) {
    stage_scale_run(dst + 4 * 128, sb, b_col, p.n, p.sb_s1, vec[1], lane);
  } else if (lane < (kBN + 127) / 128) {
    const int block = min(b_col / 128 + lane, (p.n - 1) / 128);
    cp_async_4(dst + 4 * (128 + lane), sb + block * p.sb_s1);
  }
}

// The column pairs whose scale factors an edge tile loads at once (GgScales::column_pairs_clamped):
// a divisor of every tile's pairs (16, 24, 32).
constexpr int kEdgePairs = 8;

// The FP8 scale factors of a consumer's block: tensorwise scales (both strides 0) are one
// product for the whole tile, read once instead of at every element; row / column scales
// give each thread its two rows' factors, and its columns' factors come in pairs.
struct GgScales {
  bool per_elem;    // row / column scales that differ from element to element
  float sr[2];      // rows h = 0, 1 of this thread (the tensorwise product when !per_elem)
  const float* sb;  // column 0 of the tile's group (per_elem only)
  int64_t sb_s1;
  bool pairs;  // the columns' factors load as aligned float2 pairs

  // Group g's factors (the tail group of rows past the last offset, whose sums are zero,
  // reads the last group's).
  __device__ __forceinline__ void load(const GgParams& p, int g, int row_base, int row_first,
                                       int rows, int col_base) {
    const bool row_col = p.scale == static_cast<int>(ScaleKind::kRowCol);
    const int64_t gs = min(g, p.groups - 1);
    const float* const sa = p.sa + gs * p.sa_sg;
    const float* const sbg = p.sb + gs * p.sb_sg;
    per_elem = row_col && (p.sa_s0 != 0 || p.sb_s1 != 0);
    const float one = row_col && !per_elem ? __ldg(sa) * __ldg(sbg) : 1.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = max(min(row_first + 8 * h, rows - 1), 0);
      sr[h] = per_elem ? __ldg(sa + static_cast<int64_t>(row_base + r) * p.sa_s0) : one;
    }
    sb = per_elem ? sbg + static_cast<int64_t>(col_base) * p.sb_s1 : nullptr;
    sb_s1 = p.sb_s1;
    pairs = !per_elem || (p.sb_s1 == 1 && reinterpret_cast<uintptr_t>(sb) % 8 == 0);
  }
  // The column factors of a whole block's pairs c0 + 8 j, c0 + 8 j + 1 (pairs only), all
  // loaded before any is used so that their latencies overlap.
  template <int kPairs>
  __device__ __forceinline__ void column_pairs(int c0, float2 (&f)[kPairs]) const {
    if (per_elem) {
#pragma unroll
      for (int j = 0; j < kPairs; ++j)
        f[j] = __ldg(reinterpret_cast<const float2*>(sb + c0 + 8 * j));
    } else {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) f[j] = make_float2(1.f, 1.f);
    }
  }
  // As column_pairs at a tile's edge, any stride: the columns past `cols` read column cols - 1
  // (their products are not stored), so that every load is issued before any is used. (Loaded
  // and applied element by element behind each column's bound, the edge tile of a 2048-wide
  // output on the 192-wide tile waited on 48 loads in turn, and the whole product ran at half
  // the 128-wide tile's speed.)
  template <int kPairs>
  __device__ __forceinline__ void column_pairs_clamped(int c0, int cols,
                                                       float2 (&f)[kPairs]) const {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int c = c0 + 8 * j;
      f[j] = per_elem ? make_float2(__ldg(sb + static_cast<int64_t>(min(c, cols - 1)) * sb_s1),
                                    __ldg(sb + static_cast<int64_t>(min(c + 1, cols - 1)) * sb_s1))
                      : make_float2(1.f, 1.f);
    }
  }
};

// A consumer's 64 x kBN block of C from its accumulators, straight from registers: scales,
// bias, activation, the group's bounds. (Staged through shared memory by warpgroup rounds with
// barriers and written back by the threads it ran 10-30% slower: docs/performance.md, tried and
// not kept. gg_store_staged has no barrier beyond the warp and does not wait for its stores.)
template <typename T, bool kScaled, int kAcc>
__device__ __forceinline__ void gg_store(const GgParams& p, const GgUnit& u,
                                         const float (&acc)[kAcc], int row0, int col0, int warp,
                                         int lane) {
  const bool split_rows = p.split == static_cast<int>(GroupSplit::kRows);
  const bool split_cols = p.split == static_cast<int>(GroupSplit::kCols);
  // C_g's origin: a split of rows or columns writes a range of one C, the others a C a group.
  T* cg = static_cast<T*>(p.c) + (split_rows || split_cols ? 0 : u.g * p.c_sg);
  const int row_base = split_rows ? u.begin : 0;
  const int col_base = split_cols ? u.begin : 0;
  cg += static_cast<int64_t>(row_base) * p.ldc + col_base;
  const bool pair_aligned =
      (p.ldc % 2 == 0) && (reinterpret_cast<uintptr_t>(cg) % (2 * sizeof(T)) == 0);
  EpilogueView<T> epi;
  epi.bias = p.bias == nullptr || u.g >= p.groups
                 ? nullptr
                 : static_cast<const T*>(p.bias) + static_cast<int64_t>(u.g) * p.bias_sg;
  epi.act = p.act;
  epi.active = epi.bias != nullptr || p.act != Activation::kNone;
  const int row_first = row0 + warp * 16 + (lane >> 2);
  // 16-bit kinds, and FP8 block scales (applied at each promotion), have none here: the
  // factors below are the constant 1.
  GgScales sc{};
  if constexpr (kScaled) {
    sc.load(p, u.g, row_base, row_first, u.rows, col_base);
  } else {
    sc.sr[0] = sc.sr[1] = 1.f;
    sc.pairs = true;
  }
  if (pair_aligned && sc.pairs && col0 + 2 * kAcc <= u.cols) {
    // A block of whole columns: packed pairs, no per-element bounds (a weight gradient of a
    // few tokens an expert is bound by these stores alone; an FP8 tile's by its scale loads),
    // only each line's row checked (a few-row FP8 product's k-slices, 33-48 or 65-112 rows,
    // had run 1.1-1.3x slower through the per-element path).
    auto block = [&](auto with_epi) {
      float2 cf[kAcc / 4];
      sc.column_pairs(col0 + 2 * (lane & 3), cf);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_first + 8 * h;
        if (r >= u.rows) continue;
        T* const line = cg + static_cast<int64_t>(r) * p.ldc;
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j) {
          const int c = col0 + 8 * j + 2 * (lane & 3);
          const float v0 = acc[4 * j + 2 * h] * (sc.sr[h] * cf[j].x);
          const float v1 = acc[4 * j + 2 * h + 1] * (sc.sr[h] * cf[j].y);
          if constexpr (decltype(with_epi)::value) {
            store_c_pair<T>(line + c, true, true, v0, v1, 1.f, 0.f, epi, r, c);
          } else {
            store_c_pair<T>(line + c, true, true, v0, v1, 1.f, 0.f);
          }
        }
      }
    };
    if (epi.active) {
      block(std::true_type{});
    } else {
      block(std::false_type{});
    }
    return;
  }
  // At the edge, eight column pairs at a time, their factors loaded before any is used.
#pragma unroll
  for (int j0 = 0; j0 < kAcc / 4; j0 += kEdgePairs) {
    float2 cf[kEdgePairs];
    sc.column_pairs_clamped(col0 + 8 * j0 + 2 * (lane & 3), u.cols, cf);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_first + 8 * h;
      if (r >= u.rows) continue;
      T* const line = cg + static_cast<int64_t>(r) * p.ldc;
#pragma unroll
      for (int jj = 0; jj < kEdgePairs; ++jj) {
        const int j = j0 + jj;
        const int c = col0 + 8 * j + 2 * (lane & 3);
        if (c >= u.cols) continue;
        const bool second = c + 1 < u.cols;
        store_c_pair<T>(line + c, second, pair_aligned, acc[4 * j + 2 * h] * (sc.sr[h] * cf[jj].x),
                        acc[4 * j + 2 * h + 1] * (sc.sr[h] * cf[jj].y), 1.f, 0.f, epi, r, c);
      }
    }
  }
}

template <bool kScaled, int kAcc>
__device__ __forceinline__ void gg_store_any(const GgParams& p, const GgUnit& u,
                                             const float (&acc)[kAcc], int row0, int col0, int warp,
                                             int lane) {
  if (p.out == static_cast<int>(OutKind::kBF16)) {
    gg_store<__nv_bfloat16, kScaled>(p, u, acc, row0, col0, warp, lane);
  } else if (p.out == static_cast<int>(OutKind::kF16)) {
    gg_store<__half, kScaled>(p, u, acc, row0, col0, warp, lane);
  } else {
    gg_store<float, kScaled>(p, u, acc, row0, col0, warp, lane);
  }
}

// Two values of C's 16-bit type in one register, the first in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack_c_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  } else {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  }
}

// FP8 scales applied to the accumulators in place (before a staged store): columns past `cols`
// take the last column's factors, and the map clips them.
template <int kAcc>
__device__ __forceinline__ void gg_scale_in_place(const GgScales& sc, float (&acc)[kAcc], int col0,
                                                  int cols, int lane) {
  // Column pairs j0 .. j0 + kPairs - 1 times their factors cf.
  auto apply = [&](int j0, const auto& cf) {
    constexpr int kPairs = sizeof(cf) / sizeof(float2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int jj = 0; jj < kPairs; ++jj) {
        acc[4 * (j0 + jj) + 2 * h] *= sc.sr[h] * cf[jj].x;
        acc[4 * (j0 + jj) + 2 * h + 1] *= sc.sr[h] * cf[jj].y;
      }
    }
  };
  const int c0 = col0 + 2 * (lane & 3);
  if (sc.pairs && col0 + 2 * kAcc <= cols) {
    float2 cf[kAcc / 4];
    sc.column_pairs(c0, cf);
    apply(0, cf);
    return;
  }
  // At the edge, eight pairs at a time (their 16 addresses beside the 256-wide tile's sums).
#pragma unroll
  for (int j0 = 0; j0 < kAcc / 4; j0 += kEdgePairs) {
    float2 cf[kEdgePairs];
    sc.column_pairs_clamped(c0 + 8 * j0, cols, cf);
    apply(j0, cf);
  }
}

// A warp's 16 x (2 kAcc) lines of C (rows `row`.., columns `col0`.. of matrix `batch` of the
// map), staged in the warp's own buffer and written by TMA stores that overlap whatever the
// warp does next: the rows leave as whole 128-byte lines instead of the register path's 16-byte
// pieces, and the map clips C's edges. The buffer holds kAcc / 32 boxes of 16 x 64, each in
// the 128-byte swizzle of the map (16-byte chunk c of row r at chunk c ^ (r % 8)), so that the
// eight rows of each stmatrix land in distinct banks. Nothing is applied: the caller sends only
// tiles without bias or activation here, FP8 scales already applied (gg_scale_in_place).
template <typename T, int kAcc>
__device__ __forceinline__ void gg_store_staged(const CUtensorMap* map, uint32_t buf,
                                                const float (&acc)[kAcc], int row, int col0,
                                                int batch, int cols, int lane) {
  // The warp's previous tile has left the buffer (long since, in the common case).
  if (lane == 0) bulk_wait_read_all();
  __syncwarp();
  const int r = (lane & 7) + (lane & 8);  // the row this lane addresses
  const int half = lane >> 4;             // which of the two 16-byte chunks
#pragma unroll
  for (int j = 0; j < kAcc / 4; j += 2) {
    const int chunk = j + half;
    const uint32_t addr =
        buf + (chunk >> 3) * (16 * 128) + r * 128 + (((chunk & 7) ^ (r & 7)) << 4);
    stmatrix_x4(addr, pack_c_pair<T>(acc[4 * j], acc[4 * j + 1]),
                pack_c_pair<T>(acc[4 * j + 2], acc[4 * j + 3]),
                pack_c_pair<T>(acc[4 * j + 4], acc[4 * j + 5]),
                pack_c_pair<T>(acc[4 * j + 6], acc[4 * j + 7]));
  }
  fence_proxy_async_smem();
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int b = 0; b < kAcc / 32; ++b) {
      if (col0 + 64 * b < cols) tma_store_3d(map, buf + b * (16 * 128), col0 + 64 * b, row, batch);
    }
    bulk_commit();
  }
}

// The sums of a 64-row tile whose k-blocks the two consumer warpgroups shared
// (GroupedParams::wg_split_k), into kept: warpgroup cw keeps half of the tile's columns (the
// first warpgroup the first half, acc's first kAcc / 2 values), hands the other half to its
// partner through xbuf and adds the partner's to its own. Thread t of either warpgroup holds
// the same fragments, so the halves meet thread by thread, laid out a 16-byte word of every
// thread after another so that a warp's accesses hit distinct banks. The buffer is free again
// when this returns.
template <int kAcc>
__device__ __forceinline__ void gg_exchange_sums(const float (&acc)[kAcc], float (&kept)[kAcc / 2],
                                                 uint32_t xbuf, int cw, int t) {
  constexpr int kHalf = kAcc / 2;
  constexpr uint32_t kHalfBytes = 128 * kHalf * 4;
  auto run = [&](auto keeps_first) {
    constexpr int kKeep = decltype(keeps_first)::value ? 0 : kHalf;
    constexpr int kGive = kHalf - kKeep;
    const uint32_t out = xbuf + cw * kHalfBytes, in = xbuf + (cw ^ 1) * kHalfBytes;
#pragma unroll
    for (int q = 0; q < kHalf / 4; ++q) {
      const float* g = &acc[kGive + 4 * q];
      st_shared_v4(out + (q * 128 + t) * 16, __float_as_uint(g[0]), __float_as_uint(g[1]),
                   __float_as_uint(g[2]), __float_as_uint(g[3]));
    }
    named_barrier_sync(kExchangeBarrier, 256);
#pragma unroll
    for (int q = 0; q < kHalf / 4; ++q) {
      const uint4 v = ld_shared_v4(in + (q * 128 + t) * 16);
      kept[4 * q] = acc[kKeep + 4 * q] + __uint_as_float(v.x);
      kept[4 * q + 1] = acc[kKeep + 4 * q + 1] + __uint_as_float(v.y);
      kept[4 * q + 2] = acc[kKeep + 4 * q + 2] + __uint_as_float(v.z);
      kept[4 * q + 3] = acc[kKeep + 4 * q + 3] + __uint_as_float(v.w);
    }
    named_barrier_sync(kExchangeBarrier, 256);
  };
  if (cw == 0) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

#endif  // GEMMT_SM90_DEVICE_CODE

// kAMn / kBMn: M-major A, N-major B (16-bit kinds only). kPromote (1: one set of partial sums,
// 2: two): FP8 partial products of 128 of K join a float32 sum (kBlock: scaled by their block
// scales, kBlockSquare or kBlockCols). kCluster == 2: CTA pairs
// stacked along M (one group, no split) that share each B stage, each fetching half of it
// for both by multicast, which halves B's L2 traffic; a stage is refilled once the consumers
// of both CTAs have released it. kCluster == 4 (64-row tiles): four CTAs, a quarter each.
// kPerSm == 2: two CTAs an SM (128-wide 16-bit tiles, a ring of at most kPairStages, consumer
// registers halved), so that one CTA's epilogue and ramp-up run beside the other's products.
// kARows == 64: A's stages and the tiles hold 64 rows (GgCfg), for one FP8 product of few rows,
// on lone CTAs, pairs or clusters of four; the consumer warpgroups share each tile's k-blocks
// (p.wg_split_k), or the second one only hands the stages back.
template <int kKind, bool kAMn, bool kBMn, int kBN, int kPromote, int kBlock, int kCluster,
          int kPerSm = 1, int kARows = kGgBM>
__global__ void __launch_bounds__(gg_threads<kPerSm>(), kPerSm)
    sm90_grouped_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                             const __grid_constant__ CUtensorMap tma_b,
                             const __grid_constant__ CUtensorMap tma_c, const GgParams p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using Cfg = GgCfg<kKind, kBN, kARows>;
  static_assert(kARows == kGgBM || (kPerSm == 1 && !kAMn && kPromote < 2 && kBlock == kBlockNone),
                "64 rows of A: one CTA an SM, K-major A, at most one set of partial sums, no "
                "block scales");
  constexpr bool kRows64 = kARows == 64;
  static_assert(kCluster == 1 || kCluster == 2 || (kCluster == 4 && kRows64),
                "clusters: pairs, or four 64-row tiles");
  // C through shared memory and TMA (the host sets it for a 16-bit C with no bias or activation
  // and a mappable C; FP8 scales are applied in registers first, block scales at each
  // promotion). The ring is then p.stages deep, the staging after it. (Not with 128x1 scales of
  // B: beside their two sets of partial sums the staging made ptxas spill.)
  constexpr bool kCanStage = kBlock != kBlockCols;
  constexpr int kScaleBytes = staged_scale_bytes(kBlock);  // a stage's block scales
  const bool staged_c = kCanStage && p.store_c != 0;
  const bool wg_split_k = kRows64 && p.wg_split_k != 0;
  const int stages = p.stages;
  constexpr int kBK = Cfg::kBK;
  constexpr int kMnBox = 64 * 128;  // an MN-major box: 64 of M/N by 64 rows of K (16-bit)
  static_assert(!is_fp8_kind(kKind) || (!kAMn && !kBMn), "fp8 wgmma reads K-major operands");
  // The promoted FP8 sum needs a second accumulator set: 128-wide tiles, or 192-wide with one
  // set of partial sums (2 x 96 accumulators a thread).
  // kPromote: 1 one set of partial sums, 2 two in runs of four k-blocks.
  static_assert(kPromote >= 0 && kPromote <= 2, "kPromote: 0, 1 or 2 sets of partial sums");
  // The split tail (GroupedParams::tail_slices) is built into the one-set promoted loops only:
  // with its hand-over in them the two-set loop ran 17% slower even where no tail was split
  // (H200, 4096 x 4096 outputs), and the host asks for it nowhere else.
  constexpr bool kTail = kPromote == 1;
  static_assert(kPromote == 0 || kBN == 128 || (kBN == 192 && kPromote == 1),
                "the promoted FP8 sum needs a second accumulator set");
  static_assert(kBN != 192 || kPromote == 1, "the 192-wide tile serves the promoted FP8 sum only");
  static_assert(kPerSm == 1 || (kBN == 128 && kPromote == 0 && kCluster == 1),
                "two CTAs an SM: 128-wide tiles, no promotion, no pairs");
  static_assert(!kBlock || kPromote == 2 || (kBlock == kBlockSquare && kBN == 192),
                "block scales: two sets of partial sums, or 128x128 ones on the 192-wide tile");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_a = base;
  const uint32_t smem_b = base + stages * Cfg::kABytes;
  const uint32_t smem_c = smem_b + stages * Cfg::kBBytes;
  // C's staging, or the warpgroups' exchange of sums (wg_split_k), never both.
  const uint32_t smem_scales = smem_c + (wg_split_k ? Cfg::kXBytes : staged_c ? Cfg::kCBytes : 0);
  const uint32_t bars = smem_scales + stages * kScaleBytes;
  int* const first_tile =
      reinterpret_cast<int*>(smem_raw + (bars + sm90::kGroupedBarrierBytes - smem_addr(smem_raw)));
  int* const group_begin = first_tile + kGroupedMaxGroups + 2;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (stages + s); };

  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  const int warp_in_wg = warp & 3;
  // The first consumer thread: after the producer warpgroup, or first of all (kPerSm == 2).
  constexpr int kConsumerBase = kPerSm == 1 ? 128 : 0;
  const bool producer = kPerSm == 1 ? warp < 4 : warp == 2 * 4;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < stages; ++s) {
      // The producer warp's 32 cp.async arrivals (staged block scales) and its leader's.
      mbar_init(full_bar(s), kBlock ? 33 : 1);
      // With the k-blocks dealt between the warpgroups only one of them reads a stage.
      mbar_init(empty_bar(s), (wg_split_k ? kConsumerWarps / 2 : kConsumerWarps) * kCluster);
    }
    fence_barrier_init();
  }
  grid_dependency_wait();
  if (p.split != static_cast<int>(GroupSplit::kNone) && threadIdx.x < 32) {
    build_group_table<kBN>(p, first_tile, group_begin);
  }
  __syncthreads();
  const bool depth_order = p.split == static_cast<int>(GroupSplit::kDepth) && p.depth_order != 0;
  if (depth_order) {
    order_groups_by_depth(p, first_tile, group_begin);
    __syncthreads();
  }
  // The peer may multicast into our ring and arrive on our barriers only once they exist.
  if constexpr (kCluster > 1) cluster_sync();
  allow_dependent_launch();
  const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0u;
  const int first_unit = static_cast<int>(blockIdx.x) / kCluster;
  const int unit_stride = static_cast<int>(gridDim.x) / kCluster;
  // This CTA's tile of unit t: a pair's units are tile pairs (p.tiles_m counts them).
  auto unit = [&](int t, GgUnit& u) {
    if (!gg_unit<kBN, kTail>(t, p, first_tile, group_begin, u)) return false;
    if constexpr (kCluster > 1) u.tm = u.tm * kCluster + static_cast<int>(rank);
    return true;
  };

  if (producer) {
    if constexpr (kPerSm == 1) setmaxnreg_dec<40>();
    if (kPerSm != 1 || warp_in_wg == 0) {
      const bool leader = elect_one();
      if (leader) {
        prefetch_tmap(&tma_a);
        prefetch_tmap(&tma_b);
        if (staged_c) prefetch_tmap(&tma_c);
      }
      int stage = 0;
      uint32_t phase = 0;
      constexpr bool kGroupScales = kCluster == 1;  // block scales: groups on lone CTAs
      const bool scale_vec[2] = {
          scale_runs_vec(p.sa, p.sa_s0, p.sa_s1, kGroupScales ? p.sa_sg : 0),
          scale_runs_vec(p.sb, p.sb_s1, p.sb_s0, kGroupScales ? p.sb_sg : 0)};
      GgUnit u;
      for (int round = 0; unit(gg_nth_unit(round, first_unit, unit_stride, depth_order), u);
           ++round) {
        const bool split_rows = p.split == static_cast<int>(GroupSplit::kRows);
        const bool split_cols = p.split == static_cast<int>(GroupSplit::kCols);
        const bool split_depth = p.split == static_cast<int>(GroupSplit::kDepth);
        const int a_row = (split_rows ? u.begin : 0) + u.tm * kARows;
        const int b_col = (split_cols ? u.begin : 0) + u.tn * kBN;
        // A 3-D operand's third coordinate is the group; a 2-D one (split, or cut into
        // k-slices) has one matrix.
        const bool depth_range = split_depth || p.k_slice > 0 || (kTail && u.slice >= 0);
        const int a_g = split_rows || depth_range ? 0 : u.g;
        const int b_g = split_cols || depth_range ? 0 : u.g;
        const int k_first = depth_range ? u.begin : 0;
        const int num_kb = ceil_div_dev(u.depth, kBK);
        // A split of K over MN-major operands runs a tile's k-blocks backwards, the group's
        // last (partial) one first (the consumers' loop says why).
        const bool backwards = kAMn && kBMn && split_depth;
        const GgBlockScales<kGroupScales> group_scales(p, u.g);
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(empty_bar(stage), phase ^ 1u);
          const uint32_t fb = full_bar(stage);
          const int k0 = k_first + (backwards ? num_kb - 1 - kb : kb) * kBK;
          const uint32_t sa = smem_a + stage * Cfg::kABytes;
          const uint32_t sb = smem_b + stage * Cfg::kBBytes;
          if (leader) {
            mbar_arrive_expect_tx(fb, Cfg::kABytes + Cfg::kBBytes);
            if constexpr (!kAMn) {
              if (kARows == kGgBM && p.a_half > 0) {
                tma_load_3d(sa, &tma_a, fb, k0, a_row, a_g);
                tma_load_3d(sa + 64 * 128, &tma_a, fb, k0, a_row + p.a_half, a_g);
              } else {
                tma_load_3d(sa, &tma_a, fb, k0, a_row, a_g);
              }
            } else {
              tma_load_3d(sa, &tma_a, fb, a_row, k0, a_g);
              tma_load_3d(sa + kMnBox, &tma_a, fb, a_row + 64, k0, a_g);
            }
            if constexpr (kCluster > 1) {
              static_assert(!kBMn, "CTA pairs take a K-major B");
              tma_load_3d_multicast(sb + rank * (Cfg::kBBytes / kCluster), &tma_b, fb, k0,
                                    b_col + static_cast<int>(rank) * (kBN / kCluster), b_g,
                                    (1u << kCluster) - 1u);
            } else if constexpr (!kBMn) {
              tma_load_3d(sb, &tma_b, fb, k0, b_col, b_g);
            } else {
#pragma unroll
              for (int j = 0; j < kBN / 64; ++j) {
                tma_load_3d(sb + j * kMnBox, &tma_b, fb, b_col + 64 * j, k0, b_g);
              }
            }
          }
          // The scales after the operands, whose copies start first.
          if constexpr (kBlock != kBlockNone) {
            stage_block_scales<kBlock == kBlockCols, kGroupScales, kBN>(
                p, smem_scales + stage * kScaleBytes, group_scales, a_row, b_col, k0 / kBK,
                scale_vec, lane);
            cp_async_mbar_arrive(fb);
          }
          if (++stage == stages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
    __syncwarp();
  } else {
    if constexpr (kPerSm == 1) setmaxnreg_inc<232>();
    const int tid = static_cast<int>(threadIdx.x) - kConsumerBase;
    // From the broadcast warp index, so that the compiler keeps what derives from it (the
    // operands' descriptors) in uniform registers: derived from threadIdx, each wgmma's two
    // descriptors were rebuilt and moved to uniform registers at every step, about 30
    // instructions a k-block, and the promoted FP8 loops were bound by their issue.
    const int cw = (warp - kConsumerBase / 32) >> 2;
    // The first row of this warpgroup's half of a tile (GroupedParams::a_half).
    const int half_row = cw == 0 || kRows64 ? 0 : (p.a_half > 0 ? p.a_half : 64);
    constexpr uint32_t kAStep = (kAMn ? 16 * 128 : 32) >> 4;
    constexpr uint32_t kBStep = (kBMn ? 16 * 128 : 32) >> 4;
    constexpr uint32_t kALbo = kAMn ? kMnBox : 16;
    constexpr uint32_t kBLbo = kBMn ? kMnBox : 16;
    constexpr uint32_t kAHalf = (64 * 128) >> 4;  // the second warpgroup's rows of A
    auto release = [&](int s) {
      if constexpr (kCluster == 1) {
        if (lane == 0) mbar_arrive_local(empty_bar(s));
      } else {
        if (lane < kCluster) mbar_arrive_cluster(empty_bar(s), lane);
      }
    };
    // Stage 0's descriptors, their lower words (the upper ones are the same constant); a
    // stage's lie its bytes / 16 further on (the 14-bit address field never carries: shared
    // memory ends below 256 KB).
    const uint64_t desc_hi = make_desc(0u, 0u, 1024);
    const uint32_t a_lo0 =
        static_cast<uint32_t>(make_desc(smem_a, kALbo, 1024)) + (kRows64 ? 0 : cw * kAHalf);
    const uint32_t b_lo0 = static_cast<uint32_t>(make_desc(smem_b, kBLbo, 1024));
    auto descs = [&](int s, uint64_t& da, uint64_t& db) {
      da = desc_hi | (a_lo0 + static_cast<uint32_t>(s) * (Cfg::kABytes >> 4));
      db = desc_hi | (b_lo0 + static_cast<uint32_t>(s) * (Cfg::kBBytes >> 4));
    };
    int stage = 0;
    uint32_t phase = 0;
    float acc[Cfg::kAcc];
    // Whether this warp's lines of tile eu go out through shared memory and TMA stores (the
    // host asks for it): the map clips at C's last row, not at a group's, so a split of rows
    // sends a warp whose lines cross its group's end (unless that is C's end) to the checked
    // path.
    auto stages_c = [&](const GgUnit& eu) {
      if constexpr (!kCanStage) return false;
      const bool split_rows = p.split == static_cast<int>(GroupSplit::kRows);
      const int wrow = eu.tm * kARows + half_row + warp_in_wg * 16;
      return staged_c && (!split_rows || wrow + 16 <= eu.rows || eu.begin + eu.rows == p.m);
    };
    // This warp's lines of tile eu from acc through its staging buffer (stages_c), FP8 row /
    // column and tensor scales applied first.
    auto store_staged = [&](const GgUnit& eu) {
      if constexpr (kCanStage) {
        const bool split_rows = p.split == static_cast<int>(GroupSplit::kRows);
        const int wrow = eu.tm * kARows + half_row + warp_in_wg * 16;
        const uint32_t buf = smem_c + (cw * 4 + warp_in_wg) * (16 * kBN * 2);
        const int row = (split_rows ? eu.begin : 0) + wrow;
        const int batch = split_rows ? 0 : eu.g;
        if (row < p.m) {
          if constexpr (is_fp8_kind(kKind) && !kBlock) {
            GgScales sc;
            sc.load(p, eu.g, split_rows ? eu.begin : 0, wrow + (lane >> 2),
                    split_rows ? eu.rows : p.m, 0);
            gg_scale_in_place(sc, acc, eu.tn * kBN, p.n, lane);
          }
          if (p.out == static_cast<int>(OutKind::kF16)) {
            gg_store_staged<__half>(&tma_c, buf, acc, row, eu.tn * kBN, batch, p.n, lane);
          } else {
            gg_store_staged<__nv_bfloat16>(&tma_c, buf, acc, row, eu.tn * kBN, batch, p.n, lane);
          }
        }
      }
      fence_accumulators(acc);
    };
    // Tile eu's C from acc, staged or from registers (scales, bias, activation, bounds).
    auto store = [&](const GgUnit& eu) {
      if (stages_c(eu)) {
        store_staged(eu);
      } else {
        gg_store_any<is_fp8_kind(kKind) && !kBlock>(p, eu, acc, eu.tm * kARows + half_row,
                                                    eu.tn * kBN, warp_in_wg, lane);
        fence_accumulators(acc);
      }
    };
    // The two-set promoted FP8 loop stages a tile's C once the next tile's first k-block is
    // issued (flush), so that the tensor cores run its products while the warpgroup scales,
    // converts and stages C: partial sums are fresh registers, only the float32 sum is C's.
    // (Only the staged store, and one k-block: with both sets in flight, beside the 192-wide
    // tile's one set, or with the register path's bias and bounds, ptxas spilled.)
    constexpr bool kDeferStore = kPromote == 2;
    GgUnit stored_u{};
    bool pending = false;
    auto flush = [&]() {
      if (pending) store_staged(stored_u);
      pending = false;
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;
    };
    GgUnit u;
    for (int round = 0; unit(gg_nth_unit(round, first_unit, unit_stride, depth_order), u);
         ++round) {
      const int num_kb = ceil_div_dev(u.depth, kBK);
      const bool split_depth = p.split == static_cast<int>(GroupSplit::kDepth);
      if constexpr (!kDeferStore) {
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;
      }
      int prev_stage = -1;
      // The stage of the next k-block of the promoted FP8 loops (K-major operands, so never a
      // split of K to zero): waited for, and its descriptors.
      auto stage_descs = [&](uint64_t& da, uint64_t& db) {
        mbar_wait(full_bar(stage), phase);
        descs(stage, da, db);
      };
      auto advance = [&]() {
        prev_stage = stage;
        if (++stage == stages) {
          stage = 0;
          phase ^= 1u;
        }
      };
      // A warpgroup whose 64 rows all lie past the group's end (a group's last tile, rows
      // split by uneven offsets) issues no products and only hands each stage back, once the
      // stage is full, so that it never runs a round ahead of the other warpgroup. The other
      // warpgroup's 64 rows then have the SM's tensor cores alone: a tail of up to 64 rows
      // costs about half a tile instead of a whole one. In a CTA pair over a few rows (FP8 with
      // 33-128 of them) the second CTA's warpgroups only hand back the stages of B they
      // fetch for the first. (Both warpgroups stay where they zero the stages' K tails
      // together, and in the two-set loops, which the branch would make spill.)
      if constexpr (kPromote < 2) {
        const bool zeroes_tails = kAMn && kBMn && split_depth;
        if (!zeroes_tails && !wg_split_k &&
            ((kRows64 && cw == 1) || u.tm * kARows + half_row >= u.rows)) {
          for (int kb = 0; kb < num_kb; ++kb) {
            mbar_wait(full_bar(stage), phase);
            release(stage);
            advance();
          }
          continue;
        }
      }
      // Block scales: this thread's two rows' factors of the k-block in stage st, times B's
      // block scale with 128x128 ones (read after its wait, before its release).
      auto block_scales = [&](int st, float& f0, float& f1) {
        const uint32_t sc = smem_scales + st * kScaleBytes;
        const int lr = half_row + warp_in_wg * 16 + (lane >> 2);
        f0 = __uint_as_float(ld_shared_b32(sc + 4 * lr));
        f1 = __uint_as_float(ld_shared_b32(sc + 4 * (lr + 8)));
        if constexpr (kBlock == kBlockSquare) {
          const float sbv = __uint_as_float(ld_shared_b32(sc + 4 * 128));
          f0 *= sbv;
          f1 *= sbv;
        }
      };
      // The partial sums of a k-block into the float32 sum, times f0 / f1 (this thread's two
      // rows).
      auto promote = [&](float (&part)[Cfg::kAcc], float f0, float f1) {
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = fmaf(part[i], (i & 2) ? f1 : f0, acc[i]);
      };
      // As promote, the eight-column groups before `first` times B's scale s0, the rest s1
      // (128x128 scales of B on the 192-wide tile).
      auto promote_two_blocks = [&](float (&part)[Cfg::kAcc], float f0, float f1, float s0,
                                    float s1, auto first) {
        constexpr int kFirst = decltype(first)::value;
        const float r0[2] = {f0 * s0, f0 * s1}, r1[2] = {f1 * s0, f1 * s1};
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) {
          const int b = i / 4 < kFirst ? 0 : 1;
          acc[i] = fmaf(part[i], (i & 2) ? r1[b] : r0[b], acc[i]);
        }
      };
      // As promote, times each column's scale of the k-block in stage st (128x1 scales of B),
      // read from the ring as it is needed.
      auto promote_cols = [&](float (&part)[Cfg::kAcc], float f0, float f1, int st) {
        const uint32_t cols = smem_scales + st * kScaleBytes + 4 * (128 + 2 * (lane & 3));
#pragma unroll
        for (int j = 0; j < Cfg::kAcc / 4; ++j) {
          const float2 cs = ld_shared_v2_f32(cols + 4 * 8 * j);
          acc[4 * j] = fmaf(part[4 * j] * cs.x, f0, acc[4 * j]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1] * cs.y, f0, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2] * cs.x, f1, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3] * cs.y, f1, acc[4 * j + 3]);
        }
      };
      // k-block kb's products issued into fresh partial sums (its stage waited for first).
      auto issue_partial = [&](int kb, float (&part)[Cfg::kAcc]) {
        uint64_t da, db;
        stage_descs(da, db);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          wgmma_step<kKind, 0, 0, kBN>(part, da + kk * kAStep, db + kk * kBStep, kk != 0 ? 1u : 0u);
        }
        wgmma_commit();
      };
      if constexpr (kRows64) {
        if (wg_split_k) {
          // A 64-row tile's k-blocks in turn, the even ones to the first warpgroup: each
          // promotes its k-block while the other's products run. Each walks its own k-blocks
          // and steps the ring's stage and phase past the other's, without a branch on the
          // k-block in the loop (a branch there made ptxas serialise the products kept in
          // flight across k-blocks, C7520). A pair's CTA whose rows lie past the product's end
          // only hands back the stages of B it fetches for the other.
          const bool idle = u.tm * kARows >= u.rows;
          if (cw == 1 && num_kb > 0) advance();
          auto skip_other = [&](int kb) {
            advance();
            if (kb + 1 < num_kb) advance();
          };
          if (idle) {
            for (int kb = cw; kb < num_kb; kb += 2) {
              mbar_wait(full_bar(stage), phase);
              release(stage);
              skip_other(kb);
            }
          } else if constexpr (kPromote == 1) {
            for (int kb = cw; kb < num_kb; kb += 2) {
              float part[Cfg::kAcc];
              issue_partial(kb, part);
              wgmma_wait<0>();
              fence_accumulators(part);
              release(stage);
              promote(part, 1.f, 1.f);
              skip_other(kb);
            }
          } else {
            int held = -1;  // the stage the products in flight read
            for (int kb = cw; kb < num_kb; kb += 2) {
              uint64_t da, db;
              stage_descs(da, db);
              wgmma_fence();
#pragma unroll
              for (int kk = 0; kk < 4; ++kk) {
                wgmma_step<kKind, 0, 0, kBN>(acc, da + kk * kAStep, db + kk * kBStep, 1u);
              }
              wgmma_commit();
              if (kb > cw) {
                wgmma_wait<1>();
                release(held);
              }
              held = stage;
              skip_other(kb);
            }
            wgmma_wait<0>();
            fence_accumulators(acc);
            if (held >= 0) release(held);
          }
          if (!idle) {
            float kept[Cfg::kAcc / 2];
            gg_exchange_sums(acc, kept, smem_c, cw, tid & 127);
            gg_store_any<is_fp8_kind(kKind)>(p, u, kept, u.tm * kARows, u.tn * kBN + cw * (kBN / 2),
                                             warp_in_wg, lane);
            fence_accumulators(acc);
          }
          continue;
        }
      }
      if constexpr (kPromote == 1) {
        // One set of partial sums, waited for at each k-block: the two consumer warpgroups
        // drift apart, so one promotes while the other's products run (row / column and tensor
        // scales, applied in the epilogue; 128x128 block scales here, the 192-wide tile's
        // columns in two blocks that split at its column 128 or 64: eight-column groups
        // [0, 16) or [0, 8) take the first block's scale).
        float part[Cfg::kAcc];
        const bool split_at_64 = (u.tn * kBN) % 128 != 0;
        for (int kb = 0; kb < num_kb; ++kb) {
          issue_partial(kb, part);
          float f0 = 1.f, f1 = 1.f, s0 = 1.f, s1 = 1.f;
          if constexpr (kBlock == kBlockSquare) {
            const uint32_t sc = smem_scales + stage * kScaleBytes;
            const int lr = half_row + warp_in_wg * 16 + (lane >> 2);
            f0 = __uint_as_float(ld_shared_b32(sc + 4 * lr));
            f1 = __uint_as_float(ld_shared_b32(sc + 4 * (lr + 8)));
            s0 = __uint_as_float(ld_shared_b32(sc + 4 * 128));
            s1 = __uint_as_float(ld_shared_b32(sc + 4 * 129));
          }
          wgmma_wait<0>();
          fence_accumulators(part);
          release(stage);
          if constexpr (kBlock == kBlockSquare) {
            if (split_at_64) {
              promote_two_blocks(part, f0, f1, s0, s1, std::integral_constant<int, 8>{});
            } else {
              promote_two_blocks(part, f0, f1, s0, s1, std::integral_constant<int, 16>{});
            }
          } else {
            promote(part, 1.f, 1.f);
          }
          advance();
        }
      } else if constexpr (kPromote == 2) {
        // Two sets of partial sums, k-blocks in runs of up to four: each k-block's products run
        // while the warpgroup adds the one before it to the float32 sum, so only a run's last
        // k-block is waited for with nothing queued behind it. No group is in flight across
        // the loop's back edge: ptxas serialises every wgmma of a loop whose iterations read
        // the sums of a group issued by the iteration before (C7514). Row / column and tensor
        // scales are applied in the epilogue, block scales here (the 128x1 ones of B read from
        // the stage, so it is released after the promotion).
        float part0[Cfg::kAcc], part1[Cfg::kAcc];
        int stage0 = 0, stage1 = 0;                    // the stage each set reads
        float g0[2] = {1.f, 1.f}, g1[2] = {1.f, 1.f};  // each set's rows' block scales
        auto issue = [&](int kb, float (&part)[Cfg::kAcc], int& st, float (&g)[2]) {
          issue_partial(kb, part);
          if constexpr (kBlock != kBlockNone) block_scales(stage, g[0], g[1]);
          st = stage;
          advance();
        };
        auto retire = [&](float (&part)[Cfg::kAcc], int st, const float (&g)[2]) {
          fence_accumulators(part);
          if constexpr (kBlock == kBlockCols) {
            promote_cols(part, g[0], g[1], st);
            release(st);
          } else {
            release(st);
            promote(part, g[0], g[1]);
          }
        };
        int kb = 0;
        for (; kb + 4 <= num_kb; kb += 4) {
          issue(kb, part0, stage0, g0);
          if (kb == 0) flush();
          issue(kb + 1, part1, stage1, g1);
          wgmma_wait<1>();
          retire(part0, stage0, g0);
          issue(kb + 2, part0, stage0, g0);
          wgmma_wait<1>();
          retire(part1, stage1, g1);
          issue(kb + 3, part1, stage1, g1);
          wgmma_wait<1>();
          retire(part0, stage0, g0);
          wgmma_wait<0>();
          retire(part1, stage1, g1);
        }
        // The last one to three k-blocks, a shorter run.
        const int left = num_kb - kb;
        if (left == 1) {
          issue(kb, part0, stage0, g0);
          if (kb == 0) flush();
          wgmma_wait<0>();
          retire(part0, stage0, g0);
        } else if (left >= 2) {
          issue(kb, part0, stage0, g0);
          if (kb == 0) flush();
          issue(kb + 1, part1, stage1, g1);
          wgmma_wait<1>();
          retire(part0, stage0, g0);
          if (left == 3) {
            issue(kb + 2, part0, stage0, g0);
            wgmma_wait<1>();
            retire(part1, stage1, g1);
            wgmma_wait<0>();
            retire(part0, stage0, g0);
          } else {
            wgmma_wait<0>();
            retire(part1, stage1, g1);
          }
        }
      } else {
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(full_bar(stage), phase);
          // Steps `keep` to 3 replace the sums instead of adding to them; the steps run from
          // the last to the first, so the sums start from step `keep`'s products.
          int keep = 4;
          if constexpr (kAMn && kBMn) {
            // A split of K: the group's last k-block comes first (the producer runs the
            // tile's k-blocks backwards). Its steps wholly past the group's end read the next
            // group's rows, unzeroed, and the first step that holds its rows overwrites them;
            // only the rest of that step is zeroed, by each warpgroup in its rows of A and in
            // B (both write the same zeros to B), so that no barrier spans the two. (Steps not
            // issued instead of overwritten: the branch made ptxas fence every k-block's
            // wgmma, 0.79-0.81x on long contractions.)
            const int valid = u.depth - (num_kb - 1) * kBK;
            if (split_depth && kb == 0 && valid < kBK) {
              const int steps = k_tail_steps<Cfg::kElt>(valid, p.full_k_tail);
              const int end = steps * (kBK / 4);
              if (valid < end && p.full_k_tail != 0) {
                // The form of before (A/B runs): the two warpgroups zero the stage together.
                zero_k_tail<Cfg::kElt>(smem_a + stage * Cfg::kABytes, 2, valid, end, tid, 256);
                zero_k_tail<Cfg::kElt>(smem_b + stage * Cfg::kBBytes, kBN / 64, valid, end, tid,
                                       256);
                __syncwarp();
                fence_proxy_async_smem();
                named_barrier_sync(1, 256);
              } else if (valid < end) {
                const int t = tid & 127;
                zero_k_tail<Cfg::kElt>(smem_a + stage * Cfg::kABytes + cw * kMnBox, 1, valid, end,
                                       t, 128);
                zero_k_tail<Cfg::kElt>(smem_b + stage * Cfg::kBBytes, kBN / 64, valid, end, t, 128);
                __syncwarp();
                fence_proxy_async_smem();
                named_barrier_sync(2 + cw, 128);
              }
              keep = steps - 1;
            }
          }
          // The whole descriptors from the stage's address here: built from stage 0's words
          // (descs), ptxas re-derived the shared-memory base (S2UR) in every k-block, and the
          // weight gradients of Mixtral-sized experts (two k-blocks a tile) ran 10% slower.
          const uint64_t da = make_desc(smem_a + stage * Cfg::kABytes, kALbo, 1024) + cw * kAHalf;
          const uint64_t db = make_desc(smem_b + stage * Cfg::kBBytes, kBLbo, 1024);
          wgmma_fence();
#pragma unroll
          for (int kk = 3; kk >= 0; --kk) {
            wgmma_step<kKind, kAMn ? 1 : 0, kBMn ? 1 : 0, kBN>(
                acc, da + kk * kAStep, db + kk * kBStep, kk < keep ? 1u : 0u);
          }
          wgmma_commit();
          // Every group but this one has finished: the previous stage goes back.
          if (kb > 0) {
            wgmma_wait<1>();
            release(prev_stage);
          }
          prev_stage = stage;
          if (++stage == stages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
      if constexpr (kPromote == 0) {
        wgmma_wait<0>();
        fence_accumulators(acc);
        if (num_kb > 0) release(prev_stage);
      }
      // A piece of a split tail (GroupedParams::tail_slices): all but the tile's last give
      // their sums and are done; the last adds them, in slice order (the same sum at every
      // run), and stores the tile.
      if constexpr (kTail) {
        if (u.slice >= 0) {
          const int gives = p.tail_slices - 1;
          auto slot = [&](int slice) {
            return (u.piece * gives + slice) * kCluster + static_cast<int>(rank);
          };
          auto slot_sums = [&](int q) {
            return reinterpret_cast<float4*>(p.tail_partial) + static_cast<int64_t>(q) * 32 * kBN;
          };
          if (u.slice < gives) {
            fixup_give<Cfg::kAcc>(slot_sums(slot(u.slice)), tid,
                                  p.tail_flags + 2 * slot(u.slice) + cw, acc, kTailBarrier + cw);
            continue;
          }
          for (int j = 0; j < gives; ++j) {
            fixup_take<Cfg::kAcc>(slot_sums(slot(j)), tid, p.tail_flags + 2 * slot(j) + cw, acc,
                                  kTailBarrier + cw);
          }
        }
      }
      if constexpr (kDeferStore) {
        if (num_kb == 0) flush();
        if (p.defer_store != 0 && stages_c(u)) {
          stored_u = u;
          pending = true;
        } else {
          store(u);
        }
      } else {
        store(u);
      }
    }
    if constexpr (kDeferStore) flush();
    // C's last stores complete before the CTA (and its shared memory) goes.
    if (staged_c && lane == 0) bulk_wait_all();
  }
  // No CTA may leave while its peer can still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync();
#endif  // GEMMT_SM90_DEVICE_CODE
}

}  // namespace
}  // namespace gemmt
