// Planning of the Hopper GEMM family (kernels/sm90/): how each operand is read (tensor maps,
// K- or MN-major), which operands are first copied K-major into the workspace, the tile
// width, the k-split and its cost model, and whether C^T = B^T A^T is run instead. Plain host
// C++ with no CUDA: the launcher (kernels/sm90/gemm_sm90.cu) encodes and launches exactly
// these plans, and tests/test_plan.py checks them on CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {
namespace sm90 {

constexpr int kBM = 128;  // rows of a CTA's tile
// Four tile widths: the wide 128x256 tile; 128x192 (16-bit) and 128x128 where the wide tiles
// would fill the SMs unevenly; 128x64 for outputs up to 64 wide or too few wider tiles
// (kernels/sm90/config.cuh says why).
constexpr int kBNWide = 256;
constexpr int kBNThreeQuarter = 192;
constexpr int kBNMedium = 128;
constexpr int kBNNarrow = 64;

// The width a tile bn columns wide computes of a column of tiles that has `cols` columns of
// C left (the three-quarter tile trims; kernels/sm90/kernel.cuh): cols rounded up to 16, or to
// 64 with an MN-major B (the 128-byte swizzle atom of such a B is 64 columns wide); bn once
// that reaches it. A swapped product of 129-192 tokens is one such column: 144 tokens run as
// 144 columns of tensor-core work instead of 192.
constexpr int trimmed_tile_width(int64_t cols, bool b_mn, int bn) {
  const int64_t q = b_mn ? 64 : 16;
  const int64_t w = cols < 1 ? q : (cols + q - 1) / q * q;
  return w >= bn ? bn : static_cast<int>(w);
}

// Geometry of one operand as a 2-D tensor map: dim 0 is the contiguous one.
struct MapShape {
  uint64_t dims[2];
  uint64_t stride_bytes;  // of dim 1
  uint32_t box[2];
};

struct Plan {
  int kind;
  int elt;
  int bn;  // tile width: kBNWide, kBNThreeQuarter, kBNMedium or kBNNarrow
  bool a_mn, b_mn;
  MapShape a, b;
};

// Split-k for outputs with too few tiles to occupy the GPU: the persistent CTAs take
// (tile, k-slice) units, each slice writes a float32 partial tile, and one pass adds the
// slices in order (deterministic) and applies alpha, beta and the rounding. A slice keeps
// at least kMinKbPerSplit k-blocks so the ring reaches a steady state.
constexpr int kMinKbPerSplit = 4;
constexpr int kMaxSplits = 64;
struct SplitPlan {
  int splits = 1;
  int kb_per_split = 0;
  // Stream-k instead of slices (wide tiles, splits == 1): the tiles of whole waves but the
  // last run as usual, the rest are spread over all CTAs by k-blocks, and a tile cut into
  // pieces is finished by the CTA that computes its last k-blocks, which adds the other
  // pieces' float32 partials (kernels/sm90/scheduler.cuh). Evens out the last wave: 2048 x
  // 11008 outputs are 688 wide tiles, 5.2 waves on 132 SMs.
  bool stream_k = false;
  // Which units are spread, and over how many clusters (launch.cuh: SkSpread): 0, the last
  // wave and the one before it, over all clusters that fit but at most two CTAs per tile;
  // 1, the partial last wave alone, over all that fit (stream_k_tail_only, and the long-k
  // rule of best_splits from five waves on); tests: -1,
  // clusters for two thirds of the tiles; -2, all that fit.
  int sk_clusters = 0;
  // Stream-k on the partial last wave alone.
  bool stream_k_tail() const { return stream_k && sk_clusters == 1; }
};

// Stream-k workspace (partial_bytes): room for a float32 wide tile per slot and two flags per
// slot, one slot per CTA (a CTA hands over at most one piece) and at most one CTA per SM;
// the kernel puts the flags right after the slots of its grid.
int64_t sk_slots(const GemmArgs& args);

struct TileChoice {
  int bn = kBNWide;
  SplitPlan sp;
  double us = 0.0;
};

// What the kernel runs: the caller's product, or (c_trans) C^T = B^T A^T on the same memory.
struct Problem {
  GemmArgs args;
  bool c_trans = false;
  int bn = kBNWide;  // tile width (choose_tile unless a benchmark forces one)
};

struct Staging {
  bool a = false, b = false;
};

// Workspace layout: [staged A][staged B][split-k partials], each 256-byte aligned.
struct Workspace {
  std::size_t a_bytes = 0, b_bytes = 0, partial_bytes = 0;
  std::size_t total() const { return a_bytes + b_bytes + partial_bytes; }
};

// Rows of a K-major B box: half a wide, three-quarter or medium tile (two boxes, or one per
// CTA of a pair), the whole narrow one.
uint32_t b_box_rows(int bn);

// Fills `shape` for an operand contiguous along the dimension of size `inner` whose other
// dimension (`outer`) has element stride `outer_stride`. False when TMA cannot take it.
bool map_shape(int64_t inner, int64_t outer, int64_t outer_stride, int elt, uint32_t box_inner,
               uint32_t box_outer, MapShape* shape);

// An operand of mn rows (M for A, N for B) and k columns, element (r, p) at
// ptr[r * stride_mn + p * stride_k], as a tensor map: K-major (box of 128 bytes of K by
// box_rows rows) or, when mn_ok, MN-major (boxes of 128 bytes along M/N by the stage's K).
// False when TMA cannot read it in place (base or row stride not 16-byte aligned, no unit
// stride, overlapping rows). mn_ok: 16-bit operands, and tf32 A (read through registers).
bool map_operand(const void* ptr, int64_t stride_k, int64_t stride_mn, int64_t mn, int64_t k,
                 int kind, uint32_t box_rows, bool mn_ok, MapShape* shape, bool* mn_major);

bool map_a(const GemmArgs& args, int kind, MapShape* shape, bool* mn_major);

// bn: the tile width, which sets the rows of a K-major box (any width serves as a probe of
// whether TMA can read B in place).
bool map_b(const GemmArgs& args, int kind, int bn, MapShape* shape, bool* mn_major);

int64_t k_blocks(const GemmArgs& args);

// Bytes one stage's TMA loads deliver (the full barrier's transaction count): the boxes of
// the plan's maps, K-major boxes trimmed to the operand's rows (map_operand).
uint32_t stage_tx_bytes(const Plan& plan);

// The share of L2 an operand streamed by the kernel can count on: 40 MB of the H100's 50 MiB
// (kReferenceDevice), the rest left for everything else; on another GPU the same share of
// its L2 (GemmArgs::device). A weight larger than this comes from DRAM; one smaller is read
// from DRAM once and then from L2.
constexpr double kL2BudgetOnReference = 40e6;
double l2_budget_bytes(const GemmArgs& args);

// The cost model's DRAM rate, bytes per microsecond: 2.6e6 on the H100 (78% of its 3.35 TB/s
// peak, the rate its tiles streamed weights at), the same share of another GPU's peak.
double dram_bytes_per_us(const GemmArgs& args);

// The share of the SMs that must stream for DRAM to run at dram_bytes_per_us: 0.48 on the
// H100. Each busy SM keeps about the same bytes in flight (its ring's stages), and by
// Little's law the bytes in flight a DRAM needs grow with its bandwidth at the same
// latency; so the share grows with the bandwidth over the H100's (H200: 0.69), at most 1.
double streaming_sm_share(const GemmArgs& args);

int64_t tile_count(const GemmArgs& args, int bn);

// The plan for (at most) `splits` slices: equal slices, none empty.
SplitPlan split_plan(const GemmArgs& args, int64_t splits);

// Estimated time, in microseconds, of the product with `splits` slices. The main kernel
// runs ceil(units / SMs) waves of units of kb_per_split k-blocks plus a fixed cost per unit
// (filling the ring, the epilogue) and can be no faster than reading A and B once from
// memory; a split adds the reduction pass, which reads every partial and writes C. The
// constants are per-SM times of one k-block measured on H100 (gemm_tc_selftest -sweep).
// DRAM is streamed at its full rate only with loads in flight from about half of the SMs
// or more: with fewer busy SMs the memory floor rises in proportion. Without that term the
// model stops at 48 units for 256x256x65536 (24 slices), where 64 units (32 slices) measured
// 11% faster; 1024x64x65536 likewise runs fastest at 64 units.
double split_cost_us(const GemmArgs& args, int bn, const SplitPlan& sp);

// The roofline's ridge in tokens: m tokens against a 16-bit weight do 2m FLOPs per weight
// element of 2 bytes, m FLOPs a byte, so the product is DRAM-bound below the device's
// tensor-core rate (the wide tile's k-block rate on every SM) over its DRAM rate: 380
// tokens on the H100 by the model's rates, 266 on the H200.
double ridge_tokens(const GemmArgs& args);

// Batched decode (the rule table's batched_decode_roofline; to be measured): 65 to 256
// tokens (one or two rows of 128-row tiles, past swap_for_small_m's 64), 16-bit, a weight
// from DRAM, and fewer tokens than ridge_tokens. There the product's floor is streaming
// the weight once, so the k-split search is open to it even where its tiles already fill
// half of the SMs: a split that puts more CTAs on the weight is priced by the model.
bool batched_decode_roofline(const GemmArgs& args);

// The shape rules of the planner (each an entry of the rule table, kernels/plan/plan_rules.h,
// which says what it covers, what it gained and where the results are; the comment at each
// definition has the measurements):
// five to 32 waves of long-k wide tiles with a last wave 40-90% full: stream-k on that wave.
bool long_k_last_wave(const GemmArgs& args);
// one row of tiles against a weight from DRAM: the narrow tile in two k-slices.
bool narrow_weight_stream(const GemmArgs& args);
// 5 to 8 k-blocks over two waves of medium tiles or more: the ping-pong medium tile.
bool short_k_ping_pong(const GemmArgs& args);
// wide tiles for at most half of the SMs, where the narrow tile at the split its own search
// finds is priced below the wider tiles: that split, where the narrow tile was weighed whole.
bool narrow_split_search(const GemmArgs& args);
// Whether best_splits looks for a k-split at tile width bn: tiles for at most half of the
// SMs, or batched_decode_roofline.
bool split_search_open(const GemmArgs& args, int bn);
// The product's own tile width closes the split search (the rule table's entry).
bool no_split_past_half_the_sms(const GemmArgs& args);
// Wide tiles of at least two waves with a partial last one: where stream-k is weighed.
bool stream_k_from_two_waves(const GemmArgs& args);
// An epilogue product the model would give unsplit narrow tiles, whose store does not apply
// it: the medium tile instead, the closest in tile count (problem_for).
bool epilogue_takes_medium(const GemmArgs& args);

// Estimated time of the wide tiles under stream-k (SplitPlan::stream_k); infinite where it
// is not used (tiles for fewer than two waves, or whole waves).
double stream_k_cost_us(const GemmArgs& args);
// Whether stream-k spreads the partial last wave alone (SplitPlan::sk_clusters == 1) where
// the cost model runs it: under five waves of wide tiles.
bool stream_k_tail_only(const GemmArgs& args);

// The split count with the lowest estimated time for tiles bn wide (1 when C alone has
// tiles for at least half of the SMs), or stream-k for wide tiles where it is modelled faster,
// or, from five waves on with a long k and a last wave 40-90% full, stream-k on that wave.
TileChoice best_splits(const GemmArgs& args, int bn);

// Tile width and split count of the kernel's problem. Outputs up to 64 wide take the narrow
// tile. Wider ones take the wide, the three-quarter (16-bit only) or the medium tile, each
// with its best split, whichever is modelled faster: the wide tile does the most
// tensor-core work per byte of shared memory read, the narrower ones cut the wave quantum
// (512 x 11008 outputs: 172 wide tiles take two waves on 132 SMs, the second a third full;
// 232 three-quarter tiles two waves, the second 76% full, at 0.78 of the wide tile's time
// a wave; 344 medium ones three half-length waves). Where the wide tiles leave
// more than half of the SMs idle, the narrow tile, unsplit, is weighed too: 1000^3 runs as
// 32 wide or 128 narrow tiles. A split narrow tile is not considered: in the H100 sweeps
// (gemm_tc_selftest --sweep) it was within 3% of the best wide split or behind it, but for
// one shape in one run (tf32 512x512x16384) that the next run did not repeat. The model is
// evaluated several times per product (planning, workspace, launch), so its last two
// answers are kept per thread.
TileChoice choose_tile(const GemmArgs& args);

std::size_t partial_bytes(const GemmArgs& args, const SplitPlan& sp);

// tf32 wgmma reads B K-major only, while a @ b with a row-major b (the common case) has B
// contiguous along N. Read the other way round, that B is an M-major A of C^T = B^T A^T,
// which the register-sourced form takes in place, and a row-major A is a K-major B: the
// product runs with no copy and writes C transposed. Not for narrow outputs (they would
// become 64-row tiles of a 128-row CTA; their B is small to copy), nor when A is M-major
// (then A already goes through registers and only B is copied).
bool swap_for_tf32(const GemmArgs& args);

// Decode-sized 16-bit products (m <= 64 rows of tokens against a weight of n rows) run as
// C^T = W x^T: the weight becomes the kernel's A, whose 128-row tiles stream 16 KB of it per
// stage through all consumer warpgroups, and the tokens the narrow tile's 64 columns. Read
// as given, the same product needs twice as many 64-wide tiles, each streaming 8 KB a
// stage, with the second consumer warpgroup computing rows that do not exist. Only where
// the swapped problem is supported: an epilogue then needs a split (the transposed 16-bit
// store is register-to-global, which does not apply it). Except small_m_given_one_wave.
bool swap_for_small_m(const GemmArgs& args);

// 33-64 tokens of a plain product whose 64-wide tiles as given fit one wave of the SMs
// (n <= 64 x SMs: weights of up to 8448 rows on 132 SMs) stay as given: the narrow tiles then
// take the weight in k-slices over all SMs, where the swapped 128-row tiles need twice the
// slices and their reduction. H200, one process, this rule against swapping every product
// (h200_tune/ab_small_m_orientation_h200_2026-11-30.json, bf16 and fp16, 33-64 tokens through
// eight weights of 2048 x 4096 to 13824 x 5120): median 0.940 -> 0.976 of cuBLAS; 3584 x 3584
// at 40-56 tokens 0.94-0.98 -> 1.02-1.04, 4096 x 4096 at 56 / 64 0.81 / 0.79 -> 0.92 / 0.91,
// 6144 and 8192 x 4096 0.83-0.93 -> 0.92-1.03, 4096 x 14336 0.93-0.97 -> 0.97-1.05; 5120 x
// 5120 within 3% either way. At 1-32 tokens the swap held or tied (5120 x 5120 at 4-16:
// 0.88-0.93 swapped, 0.84-0.86 as given), and past a wave of tiles (13824 x 5120, 216) as
// given lost 2%, so both keep the swap.
constexpr int64_t kSmallMGivenMinRows = 32;
bool small_m_given_one_wave(const GemmArgs& args);

// Batched decode of 129-192 tokens (16-bit) against a weight of more than 256 rows: run as
// C^T = W x^T on the three-quarter tile, whose one column of tiles then holds every token and
// computes only the columns they fill (trimmed_tile_width). As given, such tokens are two
// 128-row tiles whose second has 1-64 rows, so half its tensor-core work or more is spent on
// rows that do not exist. The split is the model's for that tile. Not with an epilogue the
// swapped plan cannot apply (an unsplit C^T is stored from registers without it), nor where
// the product as given fills the GPU unsplit on the narrow tile (given_narrow_fills_the_gpu).
bool swap_for_batched_decode(const GemmArgs& args);

// As given, the product runs on the narrow (64-wide) tile with units (tiles, or tiles x
// k-slices within one wave) for at least kGivenNarrowMinFill of a wave: a weight of about
// 4096 x 4096 at 129-192 tokens (2 x 64 tiles on 132 SMs), or 2048 x 4096 (2 x 32 tiles in two
// slices, narrow_split_search). There the given plan streams the weight on every SM in one
// pass, where the swapped 128 x 192 tiles (32 rows of tiles in 3 slices) left a quarter of the
// SMs idle and added the slices' reduction: as given ran 1.05-1.16x faster (H200, 4096 x 4096
// at 136-192 tokens, with the last tile moved up: last_tile_row), and 1.03-1.12x through
// 2048 x 4096 at 136-192 tokens in two slices (tuner timings, h200_tune/
// heldout_decode_h200_2026-11-29.json and tune_nvidia_h200_2026-11-29.json). The bound lies
// between two measured fills: 3584 x 3584 (2 x 56 tiles, 0.85 of a wave) ran as given
// 1.02-1.09x the swapped speed at 136-192 tokens (same files), 3072 x 4096 (2 x 48, 0.73)
// 0.98-1.03x (ab_batched_decode_h200_2026-11-29.json): it swaps.
bool given_narrow_fills_the_gpu(const GemmArgs& args);
constexpr double kGivenNarrowMinFill = 0.84;

// The share of a tile bn wide that a 16-bit product of n < bn columns computes on it
// (trimmed_tile_width over bn, at K-major granularity: the model does not see layouts), which
// split_cost_us scales the k-block time by: below 1 for the three-quarter tile with 129-191
// columns only, the class measured (swap_for_batched_decode). Up to 128 columns the medium
// tile computes as few, ping-pong, and the model keeps pricing the three-quarter one whole.
double trimmed_tile_share(const GemmArgs& args, int bn);

// One-token products (m == 1, 16-bit, x @ W^T) that the swapped narrow tile streams faster
// than the gemv kernel of the SIMT family: a weight from DRAM (over l2_budget_bytes) of at least
// kSingleRowMinRows rows, read unsplit in 128-row tiles that fill their last wave of SMs to at
// least kSingleRowMinWaveFill. Measured on H100 (bf16 and fp16, weights rotated past L2,
// 400f132:benchmarks/results/h100_2026-11-27_gemv_rows/): the narrow tile ran 1-5% faster than gemv
// on the 8 of 22 weights this admits (4096 x 14336, 5120 x 13824, 6144 x 16384, 4096 x
// 32000, 8192 x 28672, ...), in every run but one (8192 x 28672: 0.8% slower once); it ran
// 6-9% slower on 3584 x 18944 and 7168 x 18432, whose 148 and 144 tiles leave a second wave
// 12% and 9% full, and 3-42% slower on weights of 32 MB or less. Fitted before gemv's L2
// prefetch, with which gemv ran 2.0-2.5% ahead on 4096 x 128256 and 8192 x 28672 in one run.
// gemm_pick asks this.
constexpr int64_t kSingleRowMinRows = 8192;
constexpr double kSingleRowMinWaveFill = 0.8;
bool streams_single_row(const GemmArgs& args);

// Which way round the kernel runs the product: the planner's choice, or forced (benchmarks).
enum class Orientation : int { kAuto = 0, kAsGiven = 1, kSwapped = 2 };

Problem problem_for(const GemmArgs& args, Orientation orient = Orientation::kAuto);

bool make_plan(const Problem& pr, Plan* plan, bool kernels_built);

// Which operands of the kernel's problem TMA cannot read in place and must be staged.
Staging staging_for(const GemmArgs& args);

Workspace workspace_for(const GemmArgs& args, const Staging& st, const SplitPlan& sp);

// The arguments of the product on the staged copies; `ws` may be a placeholder (planning).
GemmArgs staged_args(const GemmArgs& args, const Staging& st, char* ws);

// Largest staging pass accepted (copy_2d's grid).
bool staging_fits(const GemmArgs& args, const Staging& st);

// C as a {n, m} tensor with 64-row boxes of 128 bytes, the staging layout of the epilogue
// (transposed: C's lines are the tile grid's columns). False when TMA cannot write C.
bool c_tma_shape(const Problem& pr, MapShape* shape);

// The first row of the last 128-row tile when that tile is moved up to end at row m, so that
// its A boxes never cross the end of A (TMA fills the missing rows with zeros, but such boxes
// ran a 200-token batched decode 1.5x slower than 256 tokens on the same plan): products of
// more than one 128-row tile whose rows are not a multiple of 128, with C not read
// (beta == 0: the rows the last two tiles share are written twice, with the same values),
// and a box start that TMA accepts there (an M-major A's inner coordinate must stay a
// multiple of 16 bytes). INT_MAX: the tiles stay in place.
int last_tile_row(const Problem& pr, const Plan& plan);

// CTAs a cluster of the kernel's launch: 2 (pairs stacked along M that multicast the B tile)
// where the 128-row tiles come in pairs, there is no k-split (a pair needs both of its M tiles
// of one unit) and the tile is wider than the narrow one; else 1. Narrow pairs, which would
// fetch a batched decode's weight tile once for its two token tiles, ran 1-8% slower (the
// tried-and-not-kept table of docs/performance.md).
int cluster_ctas(const Problem& pr, bool split);

// Whether C can go out through the staged (shared memory + TMA) store, the only one that
// applies an epilogue: every tile but the narrow one, and for C^T only the tf32 kernel's
// transposed store.
bool staged_store_possible(const Problem& pr);

// Whether the kernels take the problem. With a GemmEpilogue, only where they apply it: on
// the staged store (c_tma_shape, every tile but the narrow one) or through a split's reduction.
bool problem_supported(const Problem& pr, bool kernels_built);

// The kernel's problem with tile width bn (0, or a width without instances for the operand
// kind: the model's) and orientation.
Problem problem_with(const GemmArgs& args, int bn, Orientation orient = Orientation::kAuto);

// `splits` k-slices, or (0) the model's count for the problem's tile width.
SplitPlan split_plan_or_auto(const Problem& pr, int splits);

std::size_t workspace_bytes_with(const GemmArgs& args, int splits, int bn, Orientation orient,
                                 bool kernels_built);

}  // namespace sm90
}  // namespace gemmt
