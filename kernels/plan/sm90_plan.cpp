// The Hopper GEMM family's planner (see sm90_plan.h).
#include "plan/sm90_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/copy_layout.h"
#include "common/gemm_tc_kind.h"
#include "gemmt/arith.h"

namespace gemmt {
namespace sm90 {

namespace {
// The SMs the plan is for; at least one, so that a device reporting none still gets a plan.
int64_t sm_count_of(const GemmArgs& args) {
  return args.sm_count > 0 ? args.sm_count : 1;
}
}  // namespace

double l2_budget_bytes(const GemmArgs& args) {
  return kL2BudgetOnReference * l2_ratio(args.device);
}

uint32_t b_box_rows(int bn) {
  return bn == kBNNarrow ? kBNNarrow : static_cast<uint32_t>(bn / 2);
}

bool map_shape(int64_t inner, int64_t outer, int64_t outer_stride, int elt, uint32_t box_inner,
               uint32_t box_outer, MapShape* shape) {
  uint64_t stride_bytes;
  if (outer == 1) {
    // The stride of a single row is never used, but the encoder still checks it.
    stride_bytes = static_cast<uint64_t>((inner * elt + 15) / 16 * 16);
  } else {
    if (outer_stride < inner) return false;  // overlapping rows (broadcast views)
    stride_bytes = static_cast<uint64_t>(outer_stride) * elt;
    if (stride_bytes % 16 != 0 || stride_bytes >= (uint64_t{1} << 40)) return false;
  }
  shape->dims[0] = static_cast<uint64_t>(inner);
  shape->dims[1] = static_cast<uint64_t>(outer);
  shape->stride_bytes = stride_bytes;
  shape->box[0] = box_inner;
  shape->box[1] = box_outer;
  return true;
}

bool map_operand(const void* ptr, int64_t stride_k, int64_t stride_mn, int64_t mn, int64_t k,
                 int kind, uint32_t box_rows, bool mn_ok, MapShape* shape, bool* mn_major) {
  if (!is_aligned(ptr, 16)) return false;
  const int elt = kind == kTF32 ? 4 : 2;
  const uint32_t row_elts = 128u / elt;
  // A K-major box stops at the operand's last row, rounded up to the 8-row swizzle atom: a
  // decode-sized x (m of 1..64 under a 128-row box) then moves only its own rows instead of a
  // box of mostly zero fill. The stage rows past it keep whatever they held; they only feed
  // accumulator rows (or columns) beyond m (or n), which are never stored.
  const uint32_t real_rows = static_cast<uint32_t>(std::min<int64_t>(box_rows, (mn + 7) / 8 * 8));
  if (stride_k == 1 && map_shape(k, mn, stride_mn, elt, row_elts, real_rows, shape)) {
    *mn_major = false;
    return true;
  }
  if (mn_ok && stride_mn == 1 && map_shape(mn, k, stride_k, elt, row_elts, row_elts, shape)) {
    *mn_major = true;
    return true;
  }
  return false;
}

bool map_a(const GemmArgs& args, int kind, MapShape* shape, bool* mn_major) {
  return map_operand(args.a, args.a_stride_k, args.a_stride_m, args.m, args.k, kind, kBM, true,
                     shape, mn_major);
}

bool map_b(const GemmArgs& args, int kind, int bn, MapShape* shape, bool* mn_major) {
  return map_operand(args.b, args.b_stride_k, args.b_stride_n, args.n, args.k, kind, b_box_rows(bn),
                     kind != kTF32, shape, mn_major);
}

int64_t k_blocks(const GemmArgs& args) {
  const int64_t per_kb = 128 / static_cast<int64_t>(element_size(args.dtype));
  return (args.k + per_kb - 1) / per_kb;
}

uint32_t stage_tx_bytes(const Plan& plan) {
  constexpr uint32_t kFullA = kBM * 128;
  const uint32_t a = plan.a_mn ? kFullA : plan.a.box[1] * 128;
  const uint32_t full_b = static_cast<uint32_t>(plan.bn) * 128;
  const uint32_t b_boxes = plan.bn == kBNNarrow ? 1 : 2;
  const uint32_t b = plan.b_mn ? full_b : b_boxes * plan.b.box[1] * 128;
  return a + b;
}

int64_t tile_count(const GemmArgs& args, int bn) {
  return ((args.m + kBM - 1) / kBM) * ((args.n + bn - 1) / bn);
}

SplitPlan split_plan(const GemmArgs& args, int64_t splits) {
  SplitPlan sp;
  const int64_t num_kb = k_blocks(args);
  sp.kb_per_split = static_cast<int>(num_kb);
  if (splits > num_kb) splits = num_kb;
  if (splits < 2) return sp;
  const int64_t per = (num_kb + splits - 1) / splits;
  sp.kb_per_split = static_cast<int>(per);
  sp.splits = static_cast<int>((num_kb + per - 1) / per);
  return sp;
}

namespace {

// Per-SM times of one k-block on H100 (gemm_tc_selftest --sweep), and the memory model. The
// k-block times are tensor-core bound, so another GPU's are these at its SM clock
// (kb_us); kKbUsWide is the H100's dense 16-bit peak (4.2 MFLOP in 0.56 us on each of 132
// SMs: 989 TFLOP/s).
constexpr double kKbUsWide = 0.56;  // 128x256x(128 B of K): tensor-core bound
// A medium k-block took 0.53-0.60 of a wide one in 16-bit and 0.63 in tf32 on H100
// (--sweep: 512 x 11008 x 4096, 512 x 28672 x 8192, 2048 x 11008 x 4096, per wave).
constexpr double kKbUsMedium = 0.31;  // 128x128x(128 B of K), 16-bit
// 128x192x(128 B of K), 16-bit: three quarters of the wide tile's work per k-block, at a
// lower rate per column (both warpgroups still read the whole B stage). H100, sk-sweep:
// 512 x 11008 x 4096 took 76.4 us as two waves of 232 such tiles against 97.5 us as two of
// 172 wide ones (0.78), and 80.0 us as three of 344 medium ones.
constexpr double kKbUsThreeQuarter = 0.44;
constexpr double kKbUsMediumTf32 = 0.35;    // the same in tf32
constexpr double kKbUsNarrow = 0.20;        // 128x64x(128 B of K), 16-bit
constexpr double kKbUsNarrowTf32 = 0.35;    // the same in tf32 (A often through registers)
constexpr double kUnitFixedKb = 3.0;        // ring fill and epilogue, in k-blocks
constexpr double kBytesPerUs = 2.6e6;       // DRAM, bytes per microsecond (H100)
constexpr double kStreamingSmShare = 0.48;  // busy SMs that reach kBytesPerUs (H100)
constexpr double kReduceFixedUs = 3.0;      // the extra launch and its tail
// Stream-k: the flags' memset, and per CTA one 128 KB partial written and one read back.
constexpr double kStreamKFixedUs = 1.5 + 3.0;
constexpr double kStreamKMargin = 0.97;
// Under this many waves of wide tiles, stream-k spreads the partial last wave alone.
constexpr int64_t kStreamKTailWaves = 5;
// From kStreamKTailWaves on, the partial last wave alone is spread where a tile has this many
// k-blocks (K of 8192 to 20480 in 16-bit) and the last wave is this full (long_k_last_wave).
constexpr int64_t kLastWaveMinKb = 128;
constexpr int64_t kLastWaveMaxKb = 320;
constexpr double kLastWaveMinFill = 0.4;
constexpr double kLastWaveMaxFill = 0.9;
// Past this many waves the last one's idle share is under 2% of the product.
constexpr int64_t kLastWaveMaxWaves = 32;
// Between these many k-blocks, many medium tiles outrun the wide ones (short_k_ping_pong).
constexpr int64_t kPingPongMinKb = 5;
constexpr int64_t kPingPongMaxKb = 8;

// A k-block time measured on the H100 (ref_us), at the device's SM clock.
double kb_us(const GemmArgs& args, double ref_us) {
  return ref_us / sm_clock_ratio(args.device);
}

}  // namespace

double dram_bytes_per_us(const GemmArgs& args) {
  return kBytesPerUs * dram_ratio(args.device);
}

double streaming_sm_share(const GemmArgs& args) {
  return std::min(1.0, kStreamingSmShare * dram_ratio(args.device));
}

namespace {

// The time to read A and B from memory with `units` units of work in flight. Narrow tiles
// run as single CTAs: every 128-row M tile streams its B columns for itself, and a B too
// large for L2 then comes from DRAM once per M tile. (Measured on H100: 256x8192x28672 as
// 2 x 128 narrow tiles ran at 0.61 of cuBLAS, 1.65x its one-read floor.) Medium and wide
// tiles share B within a CTA pair and across the raster group: 512 x 28672 x 8192 ran in
// 343 us on medium tiles, under the 361 us of reading B twice. DRAM is streamed at its full
// rate only with loads in flight from about half of the SMs or more.
double memory_floor_us(const GemmArgs& args, int bn, double units) {
  const double sms = static_cast<double>(sm_count_of(args));
  const double elt = static_cast<double>(element_size(args.dtype));
  const double b_bytes = static_cast<double>(args.n) * args.k * elt;
  const double b_reads =
      bn == kBNNarrow && b_bytes > l2_budget_bytes(args) ? std::ceil(args.m / double(kBM)) : 1.0;
  const double operand_bytes = static_cast<double>(args.m) * args.k * elt + b_bytes * b_reads;
  const double stream_share =
      std::min(1.0, std::min(units, sms) / (streaming_sm_share(args) * sms));
  return operand_bytes / (dram_bytes_per_us(args) * stream_share);
}

// The wide tiles' time with `whole_waves` waves run as tiles and the rest spread by k-blocks,
// one range per SM; a range holds two pieces (three at most), each with the fixed cost of a
// unit.
double spread_cost_us(const GemmArgs& args, int64_t whole_waves) {
  const int64_t sms = sm_count_of(args);
  const int64_t tiles = tile_count(args, kBNWide);
  const double nk = static_cast<double>(k_blocks(args));
  const double sk_kb = static_cast<double>(tiles - whole_waves * sms) * nk / sms;
  const double compute =
      (whole_waves * (nk + kUnitFixedKb) + sk_kb + 2 * kUnitFixedKb) * kb_us(args, kKbUsWide) +
      kStreamKFixedUs;
  return std::max(compute, memory_floor_us(args, kBNWide, static_cast<double>(tiles)));
}

}  // namespace

// The widths the three-quarter tile's kernel has instructions for (kernels/sm90/ptx.cuh:
// wgmma_step_trimmed): multiples of 16 below 192 with a K-major B, of 64 with an MN-major one.
static_assert(trimmed_tile_width(1, false, kBNThreeQuarter) == 16, "");
static_assert(trimmed_tile_width(129, false, kBNThreeQuarter) == 144, "");
static_assert(trimmed_tile_width(176, false, kBNThreeQuarter) == 176, "");
static_assert(trimmed_tile_width(177, false, kBNThreeQuarter) == kBNThreeQuarter, "");
static_assert(trimmed_tile_width(65, true, kBNThreeQuarter) == 128, "");
static_assert(trimmed_tile_width(129, true, kBNThreeQuarter) == kBNThreeQuarter, "");
static_assert(trimmed_tile_width(5000, false, kBNThreeQuarter) == kBNThreeQuarter, "");

double trimmed_tile_share(const GemmArgs& args, int bn) {
  const int kind = tc_kind_of(args);
  if (bn != kBNThreeQuarter || (kind != kBF16 && kind != kF16)) return 1.0;
  if (args.n <= kBNMedium || args.n >= bn) return 1.0;
  return trimmed_tile_width(args.n, false, bn) / static_cast<double>(bn);
}

double split_cost_us(const GemmArgs& args, int bn, const SplitPlan& sp) {
  const double sms = static_cast<double>(sm_count_of(args));
  const double units = static_cast<double>(tile_count(args, bn)) * sp.splits;
  const double waves = std::ceil(units / sms);
  const bool tf32 = tc_kind_of(args) == kTF32;
  const double kb_ref_us = bn == kBNWide           ? kKbUsWide
                           : bn == kBNThreeQuarter ? kKbUsThreeQuarter
                           : bn == kBNMedium       ? (tf32 ? kKbUsMediumTf32 : kKbUsMedium)
                                                   : (tf32 ? kKbUsNarrowTf32 : kKbUsNarrow);
  const double elt = static_cast<double>(element_size(args.dtype));
  const double compute = waves * (sp.kb_per_split + kUnitFixedKb) *
                         kb_us(args, kb_ref_us * trimmed_tile_share(args, bn));
  // (An earlier rule rated products of one M tile by the busy share of their last wave, after
  // 4096x11008 weights with m <= 64 ran at 0.47-0.74 of cuBLAS on 64-wide tiles in 1.3 waves.
  // Those tiles then loaded 128-row A boxes of mostly zero fill; with boxes trimmed to the
  // operand (map_operand) and such products swapped (swap_for_small_m), the same tiles at
  // m = 128 ran 10-18% faster than the wide split that rule preferred.)
  double t = std::max(compute, memory_floor_us(args, bn, units));
  if (sp.splits > 1) {
    const double mn = static_cast<double>(args.m) * args.n;
    const double c_bytes = mn * elt * (args.beta != 0.f ? 2.0 : 1.0);
    // Each slice's float32 partial is written by the kernel and read back by the reduction.
    t += (mn * 8.0 * sp.splits + c_bytes) / dram_bytes_per_us(args) + kReduceFixedUs;
  }
  return t;
}

int64_t sk_slots(const GemmArgs& args) {
  // At least the two CTAs of one pair, which the launch runs even on a device reporting one SM.
  return std::max<int64_t>(2, args.sm_count);
}

double stream_k_cost_us(const GemmArgs& args) {
  const int64_t sms = sm_count_of(args);
  const int64_t tiles = tile_count(args, kBNWide);
  // Only behind at least one whole wave. Spread over every tile, the CTAs' ranges start at
  // different k offsets, so the tiles of one B column stop reading its slabs together, and a
  // B larger than L2 is read from DRAM once per M tile (512 x 14336 x 4096: 1.7 waves, 12%
  // slower than whole tiles on H100). Nor with a single M tile, where that cannot happen:
  // 256 x 11008 x 4096 (86 tiles) took 63 us spread over all 132 SMs against 55 us as whole
  // tiles on 86, as the weight streamed from DRAM at 1.8 TB/s at best with the wide tile's
  // four stages in flight per SM (gemm_tc_selftest --sk-shape, ncu).
  if (tiles < 2 * sms || tiles % sms == 0) return std::numeric_limits<double>::infinity();
  return spread_cost_us(args, tiles / sms - 1);
}

// Where stream-k runs (stream_k_cost_us), which waves it spreads: the last two, or under
// kStreamKTailWaves waves the partial last one alone, the whole waves before it running as
// tiles. Measured on H100 (gemm_tc_selftest --sk-ab, 82 products; 8c4dd9f:benchmarks/results/
// h100_2026-11-27_stream_k_tail/): of the 16 products between two and five waves where the
// planner takes stream-k, the last wave alone ran faster on 14, by up to 15% (2048 tokens
// through a 5120 -> 13824 layer and its backward, 2.42 waves: 8-9%; 1536 x 7168 x 18432,
// 2.55 waves: 15%; 512 x 28672 x 8192: 2-4%) and slower on two (1.2% and 3.8%). With more
// waves the two forms were level (2048 x 11008 x 4096, 5.21 waves: 1.4-2.0% slower alone),
// and without stream-k (fewer than two waves, or long k with a whole last wave) the tail
// alone lost as often as it won: at 512 x 11008 x 4096 (1.30 waves) its pieces of a third of
// a tile each ran 12% slower than the 128x192 tile.
bool stream_k_tail_only(const GemmArgs& args) {
  const int64_t sms = sm_count_of(args);
  return tile_count(args, kBNWide) < kStreamKTailWaves * sms;
}

// Five to 32 waves of wide tiles, 16-bit, a long k (kLastWaveMinKb to kLastWaveMaxKb
// k-blocks) and a last wave 40% to 90% full: stream-k on the last wave alone, whatever the
// model says (it prices stream-k on the last two waves, and then mostly keeps whole tiles).
// There the whole tiles' last wave idles (1 - fill) of a long unit, while the spread one cuts
// each of its tiles in two at most. Measured on H100 (gemm_tc_selftest --sk-ab 4
// --sk-ab-many-waves, 87 Linear products of 2048 to 8192 tokens, 6 to 61 waves; 148efb3:benchmarks/
// results/h100_2026-11-27_last_wave_long_k/): on the 19 products in the window the last wave
// alone took 0.985 of the planner's choice (median; 0.93-1.003, 17 faster), on the 12 of an
// earlier run (h100_2026-11-27_stream_k_tail/1_first_build_ab/) 0.989 (0.92-1.03, 8 faster);
// in `python -m gemmt bench linear` the 20 prefill products it covers went from 0.987-1.052
// of cuBLAS to 1.009-1.064 (four runs a side). Outside the window the spread does not pay: at
// 56 to 64 k-blocks its two hand-overs cost about what the last wave idles (0.99-1.04), under
// 40% fill each tile is cut in three or more (1.00-1.06 at 30%), from 448 k-blocks on (K of
// 28672 and 32000) it ran 2-10% slower, its pieces at unrelated k offsets sharing no operand
// slabs in L2 as whole tiles do, and a 128256-entry vocabulary's grad_weight over 8192 tokens
// (121 waves, where the last wave is under 1% of the time) ran 0.7-1.0% slower.
bool long_k_last_wave(const GemmArgs& args) {
  const int64_t sms = sm_count_of(args);
  const int64_t tiles = tile_count(args, kBNWide);
  const int64_t kb = k_blocks(args);
  const double fill = static_cast<double>(tiles % sms) / static_cast<double>(sms);
  return tc_kind_of(args) != kTF32 && tiles >= kStreamKTailWaves * sms &&
         tiles < kLastWaveMaxWaves * sms && kb >= kLastWaveMinKb && kb <= kLastWaveMaxKb &&
         fill >= kLastWaveMinFill && fill <= kLastWaveMaxFill;
}

double ridge_tokens(const GemmArgs& args) {
  constexpr double kWideKbFlops = 2.0 * kBM * kBNWide * 64;  // 64 16-bit elements of K
  const double flops_per_us =
      static_cast<double>(sm_count_of(args)) * kWideKbFlops / kb_us(args, kKbUsWide);
  return flops_per_us / dram_bytes_per_us(args);
}

bool batched_decode_roofline(const GemmArgs& args) {
  const int kind = tc_kind_of(args);
  if ((kind != kBF16 && kind != kF16) || args.m <= kBNNarrow || args.m > 2 * kBM) return false;
  const double b_bytes =
      static_cast<double>(args.n) * args.k * static_cast<double>(element_size(args.dtype));
  return b_bytes > l2_budget_bytes(args) && static_cast<double>(args.m) < ridge_tokens(args);
}

bool split_search_open(const GemmArgs& args, int bn) {
  if (tile_count(args, bn) * 2 <= sm_count_of(args) || batched_decode_roofline(args)) return true;
  // The same class run swapped (swap_for_batched_decode): the tokens are the columns.
  GemmArgs t = args;
  std::swap(t.m, t.n);
  return batched_decode_roofline(t);
}

bool no_split_past_half_the_sms(const GemmArgs& args) {
  return !split_search_open(args, choose_tile(args).bn);
}

bool stream_k_from_two_waves(const GemmArgs& args) {
  return std::isfinite(stream_k_cost_us(args));
}

TileChoice best_splits(const GemmArgs& args, int bn) {
  const int64_t tiles = tile_count(args, bn);
  const int64_t sms = sm_count_of(args);
  TileChoice best;
  best.bn = bn;
  best.sp = split_plan(args, 1);
  best.us = split_cost_us(args, bn, best.sp);
  // Stream-k only where it is modelled clearly faster: 4096^3 (3.9 waves) gains nothing.
  // The margin stands for the pieces' lower rate, which the model leaves out: measured on
  // H100 (gemm_tc_selftest --sk-ab), the stream-k part took 1.1-1.5 times its k-blocks'
  // whole-tile time, and 2048 x 8192 x 28672 (3.9 waves, modelled at 0.974) ran 16-21% slower
  // as stream-k. (Counting that rate instead of the margin hands long-k products to the
  // medium tile, whose model is optimistic there: 00ebbda:benchmarks/results/
  // h100_2026-11-27_stream_k_schedules/.)
  if (bn == kBNWide && long_k_last_wave(args)) {
    best.us = spread_cost_us(args, tiles / sms);
    best.sp.stream_k = true;
    best.sp.sk_clusters = 1;
  } else if (bn == kBNWide) {
    const double sk = stream_k_cost_us(args);
    if (sk < kStreamKMargin * best.us) {
      best.us = sk;
      best.sp.stream_k = true;
      best.sp.sk_clusters = stream_k_tail_only(args) ? 1 : 0;
    }
  }
  // Not even for a product that streams one operand: measured on H100 (gemm_tc_selftest
  // --decode-sweep), 86 narrow tiles of a 11008-row weight streamed it at 2.2 TB/s unsplit and
  // at 2.0 TB/s in 3 slices, 112 tiles of a 14336-row one at 2.3-2.4 against 1.9-2.2 in 7.
  if (!split_search_open(args, bn)) return best;
  int64_t max_splits = std::min<int64_t>(kMaxSplits, k_blocks(args) / kMinKbPerSplit);
  for (int64_t s = 2; s <= max_splits; ++s) {
    const SplitPlan sp = split_plan(args, s);
    if (sp.splits != s) continue;  // rounds to a count already tried
    const double t = split_cost_us(args, bn, sp);
    if (t < best.us) {
      best.us = t;
      best.sp = sp;
    }
  }
  return best;
}

// The best of the wide, medium and three-quarter tiles (each at its best split), or the
// medium tile where short_k_ping_pong takes it: what the narrow tile is weighed against.
TileChoice wider_tiles(const GemmArgs& args) {
  TileChoice best = best_splits(args, kBNWide);
  const TileChoice medium = best_splits(args, kBNMedium);
  if (medium.us < best.us) best = medium;
  if (tc_kind_of(args) != kTF32) {  // no tf32 instances of the three-quarter tile
    const TileChoice three_quarter = best_splits(args, kBNThreeQuarter);
    if (three_quarter.us < best.us) best = three_quarter;
  }
  if (short_k_ping_pong(args)) best = medium;
  return best;
}

// One row of tiles (m <= kBM, 16-bit) against a weight that comes from DRAM and fits twice
// over in narrow tiles: the narrow tile in two k-slices. Each of its stages carries the
// tokens' 128 rows (16 KB) beside 8 KB of weight, so one CTA streams the weight well under
// the DRAM rate and the weight needs every SM; the model, which has the SMs' half reach the
// full rate, prices this as unsplit. Measured on H100 (gemm_tc_selftest --decode-sweep,
// 128 tokens, W^T K-major): against 4096 x 11008 and 4096 x 14336, two slices of narrow
// tiles took 49.5 and 58.3 us, unsplit ones 53.4-54.1 and 61.8-62.5 us, the best medium
// split 55.3 and 62.3 us; the fastest of the 17 configurations timed at both shapes.
bool narrow_weight_stream(const GemmArgs& args) {
  const int64_t sms = sm_count_of(args);
  const double b_bytes =
      static_cast<double>(args.n) * args.k * static_cast<double>(element_size(args.dtype));
  return tc_kind_of(args) != kTF32 && args.m <= kBM && b_bytes > l2_budget_bytes(args) &&
         tile_count(args, kBNNarrow) * 2 <= sms && k_blocks(args) >= 2 * kMinKbPerSplit;
}

// Few wide tiles (at most half of the SMs, so the narrow tile is weighed against the wider
// ones) and a narrow split the model prices below the wider tiles: the narrow tile at that
// split. Weighed whole, it lost to medium tiles in 4-6 k-slices that ran slower: through a
// 2048 x 4096 weight (16 MB, from L2 on the H200) at 100-256 tokens the tuner's timings of
// every schedule put narrow tiles in 2-3 slices first, 1.10-1.20x faster; with this rule the
// default plan ran 0.99-1.03 of cuBLAS at 100-128 tokens (0.73-0.78 before) and 0.85-0.92 at
// 200-256 (0.75-0.78; benchmarks/results/h200_tune/tune_nvidia_h200_2026-11-29.json, docs/
// performance.md).
bool narrow_split_search(const GemmArgs& args) {
  const int kind = tc_kind_of(args);
  if (kind != kBF16 && kind != kF16) return false;  // measured in 16-bit only
  if (args.n <= kBNNarrow || tile_count(args, kBNWide) * 2 > sm_count_of(args)) return false;
  if (narrow_weight_stream(args)) return false;
  const TileChoice narrow = best_splits(args, kBNNarrow);
  return narrow.sp.splits > 1 && narrow.us < wider_tiles(args).us;
}

// A short k (5 to 8 k-blocks) over two waves of medium tiles or more: the medium tile,
// whatever the model says. There the epilogue weighs as much as the main loop; the wide tile
// stores C while its tensor cores wait, the medium one runs ping-pong and stores one tile
// while the other warpgroup computes the next. The model prices both with the same fixed
// cost a unit, which never took the medium tile there. Measured on H100 (gemm_tc_selftest
// --sk-ab-short-k, three runs; f05de3e:benchmarks/results/h100_2026-11-27_short_k_medium/), the
// medium tiles' time over the whole wide tiles': grad_weight products g^T @ x (both operands
// MN-major) for 15 weights of hidden sizes 3584 to 8192, 4 to 54 waves of wide tiles, 0.92
// (320 tokens) to 0.98 (512) on average, faster on 112 of 120 timings; the forward and
// grad_input products of layers with 320 to 512 features on the k side (K-major A, 4096 and
// 8192 tokens) 0.95-0.96 on average, faster on 32 of 36. Not over 256 tokens or fewer (1.007-
// 1.016 on average; writing C bounds both tiles) nor from 12 k-blocks on (0.999-1.038), where
// the wide main loop's rate tells. In `python -m gemmt bench linear` the 512-token
// grad_weight products went from 0.96-1.05 of cuBLAS to 1.03-1.22.
bool short_k_ping_pong(const GemmArgs& args) {
  const int64_t sms = sm_count_of(args);
  const int64_t kb = k_blocks(args);
  return tc_kind_of(args) != kTF32 && kb >= kPingPongMinKb && kb <= kPingPongMaxKb &&
         tile_count(args, kBNMedium) >= 2 * sms;
}

TileChoice choose_tile(const GemmArgs& args) {
  struct Key {
    int64_t m = -1, n = -1, k = -1;
    int dtype = -1, sms = -1;
    bool beta = false;
    DeviceInfo dev;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && dtype == o.dtype && sms == o.sms &&
             beta == o.beta && dev.l2_bytes == o.dev.l2_bytes &&
             dev.memory_clock_khz == o.dev.memory_clock_khz &&
             dev.memory_bus_bits == o.dev.memory_bus_bits && dev.sm_clock_khz == o.dev.sm_clock_khz;
    }
  };
  // Two entries: a decode-sized product is planned both as given and swapped
  // (swap_for_small_m) on every call, which would evict a single entry each time.
  thread_local Key keys[2];
  thread_local TileChoice answers[2];
  thread_local int next = 0;
  const Key key{args.m,        args.n,           args.k,     static_cast<int>(args.dtype),
                args.sm_count, args.beta != 0.f, args.device};
  for (int i = 0; i < 2; ++i) {
    if (key == keys[i]) return answers[i];
  }
  TileChoice best;
  if (args.n <= kBNNarrow) {
    best = best_splits(args, kBNNarrow);
  } else {
    best = wider_tiles(args);
    if (tile_count(args, kBNWide) * 2 <= sm_count_of(args)) {
      // The measured rule outranks the model, which prices the two slices as unsplit.
      const bool stream = narrow_weight_stream(args);
      TileChoice narrow;
      if (narrow_split_search(args)) {
        narrow = best_splits(args, kBNNarrow);
      } else {
        narrow.bn = kBNNarrow;
        narrow.sp = split_plan(args, stream ? 2 : 1);
        narrow.us = split_cost_us(args, kBNNarrow, narrow.sp);
      }
      if (stream || narrow.us < best.us) best = narrow;
    }
  }
  keys[next] = key;
  answers[next] = best;
  next ^= 1;
  return best;
}

std::size_t partial_bytes(const GemmArgs& args, const SplitPlan& sp) {
  if (sp.stream_k) {
    const std::size_t slot_bytes = kBM * kBNWide * sizeof(float) + 2 * sizeof(int);
    const std::size_t b = static_cast<std::size_t>(sk_slots(args)) * slot_bytes;
    return (b + 255) / 256 * 256;
  }
  if (sp.splits < 2) return 0;
  const std::size_t b = static_cast<std::size_t>(sp.splits) * static_cast<std::size_t>(args.m) *
                        static_cast<std::size_t>(args.n) * sizeof(float);
  return (b + 255) / 256 * 256;
}

bool swap_for_tf32(const GemmArgs& args) {
  if (tc_kind_of(args) != kTF32 || args.n <= kBNNarrow) return false;
  MapShape probe;
  bool mn = false;
  if (map_b(args, kTF32, kBNNarrow, &probe, &mn)) return false;
  if (map_a(args, kTF32, &probe, &mn) && mn) return false;
  return map_operand(args.b, args.b_stride_k, args.b_stride_n, args.n, args.k, kTF32, kBM, true,
                     &probe, &mn) &&
         mn;
}

namespace {

Problem as_given(const GemmArgs& args) {
  Problem pr;
  pr.args = args;
  pr.bn = choose_tile(pr.args).bn;
  return pr;
}

// C^T = B^T A^T on the same memory: the kernel's A is the caller's B and its output lines are
// the caller's columns.
Problem swapped(const GemmArgs& args) {
  Problem pr;
  GemmArgs& t = pr.args;
  t = args;
  t.m = args.n;
  t.n = args.m;
  t.a = args.b;
  t.a_stride_m = args.b_stride_n;
  t.a_stride_k = args.b_stride_k;
  t.b = args.a;
  t.b_stride_n = args.a_stride_m;
  t.b_stride_k = args.a_stride_k;
  pr.c_trans = true;
  pr.bn = choose_tile(pr.args).bn;
  return pr;
}

}  // namespace

bool small_m_given_one_wave(const GemmArgs& args) {
  if (args.m <= kSmallMGivenMinRows || args.m > kBNNarrow || !args.epilogue.empty()) return false;
  return tile_count(args, kBNNarrow) <= sm_count_of(args);
}

bool swap_for_small_m(const GemmArgs& args) {
  const int kind = tc_kind_of(args);
  if (kind != kBF16 && kind != kF16) return false;
  if (args.m > kBNNarrow || args.n <= kBNNarrow || small_m_given_one_wave(args)) return false;
  return problem_supported(swapped(args), true);
}

bool swap_for_batched_decode(const GemmArgs& args) {
  const int kind = tc_kind_of(args);
  if ((kind != kBF16 && kind != kF16) || args.m <= kBM || args.m > kBNThreeQuarter) return false;
  if (args.n <= 2 * kBM || given_narrow_fills_the_gpu(args)) return false;
  Problem sw = swapped(args);
  sw.bn = kBNThreeQuarter;
  return problem_supported(sw, true);
}

bool given_narrow_fills_the_gpu(const GemmArgs& args) {
  const Problem given = as_given(args);
  if (given.bn != kBNNarrow) return false;
  const int splits = split_plan_or_auto(given, 0).splits;
  const int64_t sms = sm_count_of(args);
  const int64_t units = tile_count(given.args, given.bn) * splits;
  // In k-slices (narrow_split_search), one wave at most: each CTA streams its slice once.
  if (splits > 1 && units > sms) return false;
  return static_cast<double>(units) >= kGivenNarrowMinFill * static_cast<double>(sms);
}

bool streams_single_row(const GemmArgs& args) {
  if (args.m != 1 || args.n < kSingleRowMinRows || !args.epilogue.empty()) return false;
  const double b_bytes =
      static_cast<double>(args.n) * args.k * static_cast<double>(element_size(args.dtype));
  if (b_bytes <= l2_budget_bytes(args) || !swap_for_small_m(args)) return false;
  const Problem pr = swapped(args);
  if (split_plan_or_auto(pr, 0).splits != 1) return false;
  const int64_t sms = sm_count_of(args);
  const int64_t tiles = tile_count(pr.args, pr.bn);
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(tiles) >= kSingleRowMinWaveFill * static_cast<double>(waves * sms);
}

Problem problem_for(const GemmArgs& args, Orientation orient) {
  if (orient == Orientation::kAsGiven) return as_given(args);
  if (orient == Orientation::kSwapped) return swapped(args);
  if (swap_for_tf32(args) || swap_for_small_m(args)) return swapped(args);
  if (swap_for_batched_decode(args)) {
    Problem pr = swapped(args);
    pr.bn = kBNThreeQuarter;
    return pr;
  }
  Problem pr = as_given(args);
  if (epilogue_takes_medium(args)) pr.bn = kBNMedium;
  return pr;
}

bool epilogue_takes_medium(const GemmArgs& args) {
  if (args.epilogue.empty()) return false;
  const Problem pr = as_given(args);
  return pr.bn == kBNNarrow && !problem_supported(pr, true);
}

bool make_plan(const Problem& pr, Plan* plan, bool kernels_built) {
  if (!kernels_built) return false;
  const GemmArgs& args = pr.args;
  if (args.cc_major != 9 || args.cc_minor != 0) return false;
  // Largest m, n, k accepted: TMA coordinates and tile origins are 32-bit signed.
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1024;
  const int kind = tc_kind_of(args);
  if (kind < 0) return false;
  if (args.m < 1 || args.n < 1 || args.k < 1) return false;
  if (args.m > kMaxDim || args.n > kMaxDim || args.k > kMaxDim) return false;
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr) return false;
  // The lines of C (rows, or columns of the tile grid when transposed) must not overlap.
  if (pr.c_trans ? (args.ldc < args.m && args.n > 1) : (args.ldc < args.n && args.m > 1)) {
    return false;
  }
  const int elt = static_cast<int>(element_size(args.dtype));
  Plan pl;
  pl.kind = kind;
  pl.elt = elt;
  pl.bn = pr.bn;
  if (!map_a(args, kind, &pl.a, &pl.a_mn) || !map_b(args, kind, pl.bn, &pl.b, &pl.b_mn)) {
    return false;
  }
  // Tile indices are 32-bit.
  const int64_t tiles = ((args.m + kBM - 1) / kBM) * ((args.n + pl.bn - 1) / pl.bn);
  if (tiles > INT32_MAX / 2) return false;
  if (plan != nullptr) *plan = pl;
  return true;
}

// ---- Operands TMA cannot read in place ----------------------------------------------------
// TMA needs 16-byte aligned bases and row strides, which a view at an odd offset or with an
// odd leading dimension (a 4097-wide matrix of 16-bit values) does not have, and tf32 wgmma
// reads B K-major only (a row-major B is usually read in place through swap_for_tf32, but
// not always). Such an operand is first rewritten K-major, rows padded to 16 bytes, into the
// workspace by one bandwidth-bound pass (a few percent of the product's time at the sizes
// where wgmma pays), then the product runs on the copy.

Staging staging_for(const GemmArgs& args) {
  Staging st;
  const int kind = tc_kind_of(args);
  if (kind < 0 || args.m < 1 || args.n < 1 || args.k < 1) return st;
  MapShape probe;
  bool mn = false;
  st.a = !map_a(args, kind, &probe, &mn);
  st.b = !map_b(args, kind, kBNNarrow, &probe, &mn);
  return st;
}

Workspace workspace_for(const GemmArgs& args, const Staging& st, const SplitPlan& sp) {
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  Workspace w;
  w.a_bytes = st.a ? copy_bytes(args.m, args.k, elt) : 0;
  w.b_bytes = st.b ? copy_bytes(args.n, args.k, elt) : 0;
  w.partial_bytes = partial_bytes(args, sp);
  return w;
}

GemmArgs staged_args(const GemmArgs& args, const Staging& st, char* ws) {
  GemmArgs s = args;
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  const int64_t pitch = copy_pitch(args.k, elt);
  if (st.a) {
    s.a = ws;
    s.a_stride_m = pitch;
    s.a_stride_k = 1;
    ws += copy_bytes(args.m, args.k, elt);
  }
  if (st.b) {
    s.b = ws;
    s.b_stride_n = pitch;
    s.b_stride_k = 1;
  }
  return s;
}

bool staging_fits(const GemmArgs& args, const Staging& st) {
  return !(st.a || st.b) || args.k <= kCopyMaxLen;
}

bool c_tma_shape(const Problem& pr, MapShape* shape) {
  const GemmArgs& args = pr.args;
  const int elt = static_cast<int>(element_size(args.dtype));
  const int64_t c_inner = pr.c_trans ? args.m : args.n;
  const int64_t c_outer = pr.c_trans ? args.n : args.m;
  return is_aligned(args.c, 16) &&
         map_shape(c_inner, c_outer, args.ldc, elt, 128u / static_cast<uint32_t>(elt), 64, shape);
}

int cluster_ctas(const Problem& pr, bool split) {
  const int64_t tiles_m128 = (pr.args.m + kBM - 1) / kBM;
  return split || pr.bn == kBNNarrow || tiles_m128 % 2 != 0 ? 1 : 2;
}

int last_tile_row(const Problem& pr, const Plan& plan) {
  const GemmArgs& args = pr.args;
  constexpr int kNone = std::numeric_limits<int>::max();
  if (args.m <= kBM || args.m % kBM == 0 || args.beta != 0.0) return kNone;
  const int64_t first = args.m - kBM;
  if (plan.a_mn && (first * plan.elt) % 16 != 0) return kNone;
  return static_cast<int>(first);
}

bool staged_store_possible(const Problem& pr) {
  return pr.bn != kBNNarrow && (!pr.c_trans || tc_kind_of(pr.args) == kTF32);
}

bool problem_supported(const Problem& pr, bool kernels_built) {
  // An epilogue needs the staged store (wide tiles, TMA-writable C) or a split, whose
  // reduction applies it; other such products go to a family that stores element-wise.
  if (!pr.args.epilogue.empty() && split_plan_or_auto(pr, 0).splits <= 1) {
    MapShape c_shape;
    if (!staged_store_possible(pr) || !c_tma_shape(pr, &c_shape)) return false;
  }
  const Staging st = staging_for(pr.args);
  if (!(st.a || st.b)) return make_plan(pr, nullptr, kernels_built);
  Problem staged = pr;
  staged.args = staged_args(pr.args, st, planning_workspace());
  return staging_fits(pr.args, st) && make_plan(staged, nullptr, kernels_built);
}

Problem problem_with(const GemmArgs& args, int bn, Orientation orient) {
  Problem pr = problem_for(args, orient);
  const bool three_quarter = bn == kBNThreeQuarter && tc_kind_of(args) != kTF32;
  if (bn == kBNWide || three_quarter || bn == kBNMedium || bn == kBNNarrow) pr.bn = bn;
  return pr;
}

SplitPlan split_plan_or_auto(const Problem& pr, int splits) {
  if (splits > 0) return split_plan(pr.args, splits);
  if (splits < 0) {  // stream-k, forced (gemmt/gemm_tc_hooks.h)
    SplitPlan sp = split_plan(pr.args, 1);
    sp.stream_k = pr.bn == kBNWide;
    sp.sk_clusters = splits == -2 ? -1 : (splits == -3 ? -2 : (splits == -4 ? 1 : 0));
    return sp;
  }
  const TileChoice c = choose_tile(pr.args);
  return c.bn == pr.bn ? c.sp : best_splits(pr.args, pr.bn).sp;
}

std::size_t workspace_bytes_with(const GemmArgs& args, int splits, int bn, Orientation orient,
                                 bool kernels_built) {
  const Problem pr = problem_with(args, bn, orient);
  if (!problem_supported(pr, kernels_built)) return 0;
  return workspace_for(pr.args, staging_for(pr.args), split_plan_or_auto(pr, splits)).total();
}

}  // namespace sm90
}  // namespace gemmt
