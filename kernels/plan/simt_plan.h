// Planning of the SIMT GEMM family (kernels/simt/): which kernel, tile shape, k-split,
// stream-k split and operand staging a problem gets. Plain host C++ with no CUDA in it: the
// launchers in kernels/simt/ execute these plans, and tests/test_plan.py checks them on a
// machine without a GPU. What the planner needs to know about the compiled kernels (which
// instances exist, their occupancy) it asks through a PipeCatalog.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gemmt/arith.h"
#include "gemmt/gemm_args.h"
#include "gemmt/gemm_simt_plan.h"
#include "gemmt/gemm_variant.h"

namespace gemmt {
namespace simt {

// ---- Shared facts (ceil_div, kMaxGridX and is_aligned come from gemmt/arith.h) ---------------
// Bytes of one element as the SIMT kernels move it (16-bit types as raw bits).
inline int64_t elem_bytes(ScalarType t) {
  return t == ScalarType::kFloat32 ? 4 : 2;
}

// dtypes of the SIMT family.
inline bool simt_dtype_ok(ScalarType t) {
  return t == ScalarType::kFloat32 || t == ScalarType::kFloat16 || t == ScalarType::kBFloat16;
}

// ---- Ladder steps 1-4: fixed block tiles ------------------------------------------------------
constexpr int kNaiveTile = 16;
constexpr int kSmemTile = 32;
constexpr int kRbM = 128, kRbN = 128, kRbK = 8, kRbT = 8, kRbThreads = 256;
constexpr int kWtM = 128, kWtN = 128, kWtK = 8, kWtThreads = 256;

// How the warp-tiled kernel (step 4) stages one operand tile into shared memory.
enum class WarpTiledLoad : int {
  kVecAlongC = 0,  // 4-element vectors along the tile's column (m for A, n for B)
  kVecAlongK = 1,  // 4-element vectors along k, written transposed
  kScalar = 2,     // one element per load
};

// The warp-tiled loader of one operand (element (k, c) at base[c * c_stride + k * k_stride]):
// 4-element vectors need the base and the other dimension's stride aligned to 4 elements.
WarpTiledLoad warp_tiled_load(ScalarType t, const void* base, int64_t c_stride, int64_t k_stride);

// ---- Step 5: the pipelined kernel's tile shapes ---------------------------------------------
// The block tiles the pipelined kernel is compiled for. kLarge, kMedium and kSmall serve every
// dtype (16-bit inputs usually go to the tensor cores, so their SIMT build keeps only kLarge
// and kSmall); kFat, kNarrow and kSkinny are float32 only.
enum class PipeTile : int { kLarge = 0, kMedium, kSmall, kFat, kNarrow, kSkinny, kCount };
constexpr int kNumPipeTiles = static_cast<int>(PipeTile::kCount);

// One tile shape: block tile bm x bn x bk, warp tile wm x wn, thread tile tm x tn, shared-memory
// stages, and the minimum resident blocks per SM asked of the compiler (__launch_bounds__).
struct PipeShape {
  int bm, bn, bk, wm, wn, tm, tn, stages, min_blocks;
  // Stages of the whole-tiles (interior) instance, where one exists.
  int interior_stages;
  constexpr int threads() const { return 32 * (bm / wm) * (bn / wn); }
  // Shared-memory rows are padded by 4 floats (see PipeConfig in kernels/simt/).
  constexpr int smem_bytes(int st) const { return st * bk * ((bm + 4) + (bn + 4)) * 4; }
};

// Indexed by PipeTile; the kernels' PipeConfig instances are built from this table.
//   Large : 2x2 warps of 64x64, 16x8 per thread; the best FFMA : LDS ratio for big problems.
//   Medium: 2x2 warps of 32x64, 8x8 per thread; twice Large's tiles for mid-size shapes.
//   Small : 2x2 warps of 32x32, 8x4 per thread; fills the GPU when C has few 128x128 tiles.
//   Fat   : 128x256, 2x4 warps of 64x64, one 8-warp block per SM; each B panel loaded once
//           for 256 columns. Its interior instance keeps four stages.
//   Narrow: 128x64, 4x1 warps of 32x64 (Medium on its side), for n <= 64.
//   Skinny: 32x256, 1x4 warps of 32x64 (Medium's warps in one row), for m <= 32: the 64-row
//           tiles of the others spend half their FFMAs or more on rows past m, and these
//           products (a few rows against a long weight) are FFMA-bound in float32, not
//           bandwidth-bound: 32 x 4096 x 4096 is 1.1 GFLOP against 64 MB read.
inline constexpr PipeShape kPipeShapes[kNumPipeTiles] = {
    {128, 128, 16, 64, 64, 16, 8, 3, 2, 0}, {64, 128, 16, 32, 64, 8, 8, 3, 3, 3},
    {64, 64, 16, 32, 32, 8, 4, 3, 4, 0},    {128, 256, 16, 64, 64, 16, 8, 3, 1, 4},
    {128, 64, 16, 32, 64, 8, 8, 3, 3, 0},   {32, 256, 16, 32, 64, 8, 8, 3, 3, 0},
};

constexpr const PipeShape& pipe_shape(PipeTile t) {
  return kPipeShapes[static_cast<int>(t)];
}

const char* pipe_tile_name(PipeTile t);

// How the pipelined kernel's loaders read one operand (element (k, c) at
// base[c * c_stride + k * k_stride]);
// the kernels take it as an int template argument.
enum LoadMode : int {
  kVecC = 0,    // c is the unit-stride dimension and 16-byte vectors along c are aligned
  kVecK = 1,    // k is the unit-stride dimension: fetched along k, written transposed
  kScalar = 2,  // anything else: one element per copy
};
constexpr int kNumLoadModes = 3;

// f(std::integral_constant<int, m>{}) for the loader mode m at run time: how a compiled
// instance is picked from a plan's modes (every mode but kVecC and kVecK is kScalar).
template <class F>
auto with_load_mode(LoadMode m, F&& f) {
  switch (m) {
    case kVecC:
      return f(std::integral_constant<int, kVecC>{});
    case kVecK:
      return f(std::integral_constant<int, kVecK>{});
    default:
      return f(std::integral_constant<int, kScalar>{});
  }
}

LoadMode pipe_load_mode(ScalarType t, const void* base, int64_t c_stride, int64_t k_stride,
                        int64_t c_ext, int64_t k_ext);

// Which instances of the pipelined kernel are compiled. Interior instances (whole tiles,
// branch-free copies) exist for float32 kMedium and kFat in vector modes; the stream-k form
// for float32 kMedium and kFat (general and interior) in vector modes; kSkinny in vector
// modes only (a layout that needs scalar loads takes the 64-row tiles).
constexpr bool pipe_instance_built(ScalarType t, PipeTile tile, LoadMode a, LoadMode b,
                                   bool interior, bool stream_k) {
  const bool f32 = t == ScalarType::kFloat32;
  const bool vector = a != kScalar && b != kScalar;
  const bool medium_or_fat = tile == PipeTile::kMedium || tile == PipeTile::kFat;
  if (!f32 && !(t == ScalarType::kFloat16 || t == ScalarType::kBFloat16)) return false;
  if (!f32 && !(tile == PipeTile::kLarge || tile == PipeTile::kSmall)) return false;
  if (interior && !(f32 && vector && medium_or_fat)) return false;
  if (stream_k && !(f32 && vector && medium_or_fat)) return false;
  if (tile == PipeTile::kSkinny && !vector) return false;
  return tile != PipeTile::kCount;
}

// What the planner learns about one compiled instance from the device.
struct PipeInstance {
  bool built = false;
  int error = 0;  // non-zero: the device refused the instance (a cudaError_t value)
  int blocks_per_sm = 0;
};

// The compiled kernels as the planner sees them: the CUDA launchers answer from the device,
// tests from a table. `device` keys the per-thread plan cache (-1: do not cache).
struct PipeCatalog {
  PipeInstance (*query)(ScalarType t, PipeTile tile, LoadMode a, LoadMode b, bool interior,
                        bool stream_k) = nullptr;
  int device = -1;
};

// ---- The cost model's constants (docs/performance.md, "SIMT cost model", has the history) ----
// Relative FFMA efficiency of each tile shape at full occupancy, fitted to H100 timings of
// every shape on square, long-k, tall-skinny and non-multiple problems.
// Skinny: Medium's warp tile, so Medium's rate (not yet fitted to timings of its own).
inline constexpr double kPipeEfficiency[kNumPipeTiles] = {1.0, 0.9, 0.6, 1.02, 0.9, 0.9};
// Interior instances run faster than their general ones (H100 sweep: Medium 5-10%, Fat 2-7%;
// Fat's kept low enough that the measured-fastest tile is still picked on every square).
inline constexpr double kPipeInteriorEfficiency[kNumPipeTiles] = {0.0, 0.97, 0.0, 1.05, 0.0, 0.0};
// FFMA rate of one 4-warp block alone on an SM, relative to full occupancy (H100, 1024^3).
inline constexpr double kPipeLoneBlockRate[kNumPipeTiles] = {0.5, 0.67, 0.5, 0.5, 0.67, 0.67};
// A split-k slice keeps at least this many k-tiles so its pipeline reaches steady state.
constexpr int64_t kMinKTilesPerSplit = 16;
constexpr int kMaxSplits = 64;
constexpr std::size_t kMaxSplitWorkspace = std::size_t(256) << 20;
// Split-k workspace traffic (written by the GEMM, read by the reduction), bytes per SM clock
// per SM on the H100; DRAM traffic, so on another GPU this over its SM clock and bandwidth
// (split_bytes_per_clk).
constexpr double kSplitBytesPerClk = 12.0;
// The reduction's launch and tail, in SM clocks.
constexpr double kSplitFixedCost = 4000.0;
// Stream-k: fixed cost per use (counter reset, second launch, pipeline fills), fitted so the
// model's gain matches the H100 sweep; slot traffic through L2 (which runs at the SM clock,
// so the same in clocks on any GPU); the DRAM rate a stream-k run may count on when the
// operands exceed L2, on the H100 (stream_k_dram_bytes_per_clk: scaled like split-k's);
// the shortest run worth a pipeline fill.
constexpr double kStreamKFixedCost = 24000.0;
constexpr double kStreamKBytesPerClk = 32.0;
constexpr double kStreamKDramBytesPerClk = 8.0;
constexpr int64_t kStreamKMinIters = 4;
// The share of L2 the operands may fill and still count as read from L2: 40 MiB of the
// H100's 50 MiB (kReferenceDevice), the same share of another GPU's L2 (l2_budget_bytes).
constexpr double kL2BudgetOnReference = 40.0 * (1 << 20);

// The constants above that are device properties, for the device of `a` (GemmArgs::device;
// exactly the constants on the H100).
double l2_budget_bytes(const GemmArgs& a);
double split_bytes_per_clk(const GemmArgs& a);
double stream_k_dram_bytes_per_clk(const GemmArgs& a);
// Launch order groups this many tile rows for L2 reuse (swizzle_tile).
constexpr int kRasterGroup = 8;
// A K-major B is copied N-major first when that pass costs less than reading B in place.
// 16-bit: from m = 2048. float32 (H100, 43ace54:benchmarks/results/h100_2026-11-27_k_major_b/): the
// copy costs kStageCopyCost / m of the product (8 bytes per element of B at ~2.2 TB/s against
// 2m FLOPs at ~50 TFLOP/s; fitted 82 where that estimate gives 91). Reading B in place costs
// 6-8% of the rate on an N-major copy where k is a power of two and 9-14% elsewhere (k = 3584
// to 28672): the 4-byte transposing copies of a K-major tile cost more when its lines lie a
// non-power-of-two stride apart, the cause unknown. Held out (11 other weights and token
// counts) the rule picked the faster way within 1% in two runs.
// The copy's share is a ratio of FFMA rate to DRAM rate, so another GPU's is kStageCopyCost
// times its SM clock over the H100's, over its bandwidth over the H100's (stage_copy_cost).
constexpr int64_t kStageBMinM = 2048;
constexpr double kStageCopyCost = 82.0;
double stage_copy_cost(const GemmArgs& a);
constexpr double kInPlacePenaltyPow2K = 0.06;
constexpr double kInPlacePenalty = 0.10;

// ---- Pipelined plans --------------------------------------------------------------------------
// The instance a plan runs and the facts the cost model used.
struct PipeChoice {
  PipeTile tile = PipeTile::kCount;
  LoadMode a_mode = kScalar, b_mode = kScalar;
  bool interior = false;
  int bm = 0, bn = 0, bk = 0, stages = 0, threads = 0, smem = 0;
  double efficiency = 1.0;
  double lone_rate = 0.5;
  PipeInstance inst, streamk_inst;
};

// Planner error codes (PipePlan::error); positive values are a PipeInstance's device error.
constexpr int kPlanOk = 0;
constexpr int kPlanNotSupported = -1;

struct PipePlan {
  PipeChoice choice;
  int splits = 1;
  int64_t k_per_split = 0;
  int tiles_m = 0, tiles_n = 0;
  // Stream-k (5b): the last streamk_tiles tiles in launch order run on streamk_blocks blocks of
  // streamk_iters k-tiles (streamk_extra of them one more); 0 blocks: data-parallel only.
  int streamk_tiles = 0, streamk_blocks = 0;
  int64_t streamk_iters = 0, streamk_extra = 0;
  int error = kPlanNotSupported;
};

// Options of a pipelined plan. only_tile restricts the choice to one shape (benchmarks of
// each shape); allow_interior = false keeps the general instance; stream_k < 0 lets the model
// decide on a stream-k last wave, 0 never, > 0 whenever the shape has one.
struct PipeOptions {
  bool allow_split = false;
  int only_tile = -1;
  bool allow_interior = true;
  int stream_k = -1;
};

// The cheapest plan by the model; remembered per thread for the last problem (a call plans
// once for its workspace size and again to launch, and the split-k search costs about as much
// host time as a small product's kernels).
PipePlan plan_pipelined(const GemmArgs& a, const PipeOptions& opt, const PipeCatalog& cat);

// What a pipelined plan launches, as SimtPlan reports it (the workspace of its stream-k part
// only).
SimtPlan describe(const PipePlan& pp);

// Stream-k workspace: the arrival counters, then two partial-sum slots per block.
std::size_t streamk_counter_bytes(const PipePlan& pl);
std::size_t streamk_workspace_bytes(const PipePlan& pl);

// Whether a K-major B can be and is copied N-major before the pipelined kernel runs, and the
// copy's pitch and workspace bytes (the copy sits at the front of the workspace).
bool can_stage_b(const GemmArgs& a);
bool stages_b(const GemmArgs& a);
int64_t staged_b_pitch(const GemmArgs& a);
std::size_t staged_b_bytes(const GemmArgs& a);
// The arguments of the product on the copy of B at `ws` (a placeholder while planning).
GemmArgs with_staged_b(const GemmArgs& a, const void* ws);
// The product transposed, C^T = B^T A^T: the operands swap roles and C is written column-major
// (the epilogue keeps the caller's coordinates: OutView::transposed in kernels/simt/tiles.cuh). The
// pipelined kernel reads an N-major B best and a K-major one worst; a K-major A costs it little
// (float32, H100: the Linear's grad_input, A K-major, runs at the rate of an M-major A). So a
// float32 product with a K-major B runs transposed (swaps_operands) when its A is M-major (both
// operands then read as they lie, no copy) or when A is K-major too and m < n, where copying the
// smaller operand (A, m x k) beats copying B (k x n): the copy cost falls from kStageCopyCost / m
// to / n of the product (x @ W.T with 2048 tokens and 11008 outputs: 4% to under 1%). Not for
// split-k, whose reduction writes C row-major.
GemmArgs transposed_problem(const GemmArgs& a);
bool swaps_operands(const GemmArgs& a);
struct SimtFamilyPlan;
// Fills fp's pipelined plan for the arguments the kernel will see (on the copy of B when
// staged), its error and its summary (workspace: the copy, then split-k slices).
void plan_pipelined_staged(const GemmArgs& a, bool allow_split, bool staged, const PipeCatalog& cat,
                           SimtFamilyPlan& fp);

// ---- Step 7: gemv -----------------------------------------------------------------------------
// out[r] = sum_p M(r, p) * v(p), with M(r, p) = mat[r * s_r + p * s_p]: n == 1 reads M = A and
// v = column 0 of B; m == 1 reads M = B^T and v = row 0 of A.
struct GemvPlan {
  const void* mat = nullptr;
  int64_t s_r = 0, s_p = 0;
  const void* vec = nullptr;
  int64_t s_v = 0;
  int64_t rows = 0, len = 0;
  int64_t s_out = 0;
  // Vectors dotted with each row: the rows of a float32 A of 2-4 rows (gemv_takes_few_rows),
  // vector v at vec + v * s_vv, its outputs at out + v * s_ov.
  int vecs = 1;
  int64_t s_vv = 0, s_ov = 0;
  bool colsweep = false;   // r contiguous: lanes own rows and walk p
  bool vec16 = false;      // 16-byte loads allowed
  int rows_per_block = 0;  // row-dot kernel: 1, 2, 4 or 8 rows per 8-warp block
  // Row-dot kernel on sm_90+: each block has L2 prefetch the rows of the block this many
  // ahead (0: none); see gemv_prefetch_blocks.
  int64_t prefetch_blocks = 0;
  int64_t p_per_split = 0;
  int splits = 1;
  int64_t blocks_x = 0;
};

// The most rows of A gemv takes at once (GemvPlan::vecs).
constexpr int kGemvMaxVecs = 4;
// float32 products of 2-4 rows whose B has a unit stride (x @ W.T, a @ W): gemv reads each
// element of the weight once for every row of A, at the weight's streaming rate, where a
// block tile of 32 rows or more spends most of its FFMAs on rows past m.
bool gemv_takes_few_rows(const GemmArgs& a);
// Those `auto` runs on gemv: 2-4 rows against a K-major B (the row-dot kernel), 2 against an
// N-major one. The column sweep's 4 rows ran slower than the 32 x 256 tile's split (H200:
// 4 x 4096 x 4096 43 us against 37, 4 x 4096 -> 14336 128 against 94), its 2 rows faster
// (25 against 36 us, 64 against 94).
bool gemv_picks_few_rows(const GemmArgs& a);

// Warps that share one row of the row-dot kernel (1, 2, 4 or 8) for dot products of len
// elements.
int gemv_warps_per_row(int64_t len);

// The row-dot kernel's L2 prefetch distance in blocks. Blocks of at most
// kGemvPrefetchBlockBytes (short rows: k <= 8192 in 16-bit) finish after one DRAM latency or
// two, and their registers hold too few loads to keep DRAM busy across the gaps when blocks
// end and start; on sm_90 each block therefore asks L2 for the rows of the block
// 8 x sm_count ahead (cp.async.bulk.prefetch, no registers), so that later blocks load from
// L2. The lead, 8 x 132 blocks of 16 KB (17 MB), stays well inside an H100's 50 MB of L2.
// Only for matrices larger than l2_budget_bytes, and with a lead of at most a third of the
// L2 (kGemvPrefetchMaxL2Share: the H100's 17 MB of 50 MiB; fewer blocks ahead on a GPU with
// less L2 per SM, none where not even one block a SM fits). Measured on H100 (bf16 m = 1,
// weights rotated past L2, prefetch against none in rotating rounds; 400f132:benchmarks/results/
// h100_2026-11-27_gemv_rows/4_prefetch/): 1.0-3.8% faster on the 4096 x 14336 / 32000 /
// 128256 and 8192 x 8192 / 28672 weights, level (+0.2%) on 4096 x 11008, and 1.1-4.3% slower
// on 32 MB weights (4096 x 4096, 2048 x 8192, 8192 x 2048), whose calls are mostly start-up
// and tail. A lead of 16 x 132 blocks (34 MB) ran 20-51% slower on every large weight:
// prefetched rows were evicted before use. Longer blocks, split rows, float32 and other
// GPUs prefetch nothing.
constexpr int64_t kGemvPrefetchBlockBytes = 16 << 10;
constexpr int64_t kGemvPrefetchLeadPerSm = 8;
constexpr double kGemvPrefetchMaxL2Share = 1.0 / 3.0;
int64_t gemv_prefetch_blocks(const GemvPlan& g, int64_t elem_bytes, const GemmArgs& a);

// warps_per_row > 0 forces the row-dot kernel's warps per row (a benchmark hook).
GemvPlan plan_gemv(const GemmArgs& a, int warps_per_row = 0);

// ---- The family ---------------------------------------------------------------------------------
// What gemm_simt_run launches for (args, v), or error != kPlanOk. One function decides both
// gemm_simt_supports and the run: the launchers execute exactly this plan.
struct SimtFamilyPlan {
  int error = kPlanNotSupported;
  GemmVariant variant = GemmVariant::kAuto;
  SimtPlan summary;      // what gemm_simt_plan reports
  PipePlan pipe;         // kPipelined / kSplitK
  bool swapped = false;  // pipe (and staged_b) are of transposed_problem(args)
  bool staged_b = false;
  GemvPlan gemv;  // kGemv
};

bool simt_variant_supports(const GemmArgs& args, GemmVariant v);
// gemv_wpr > 0 forces the gemv row-dot kernel's warps per row (plan_gemv).
SimtFamilyPlan plan_simt(const GemmArgs& args, GemmVariant v, const PipeCatalog& cat,
                         int gemv_wpr = 0);

// A float32 K-major B read one way, to time the ways against each other: copied N-major first
// (kStaged), read in place by 4-byte cp.async copies (kInPlace), or the product run transposed
// with A as the copied operand (kSwapped; copied only where transposed_problem stages its B).
// No split-k. error kPlanNotSupported where B is not K-major or cannot be copied.
enum class KMajorB : int { kStaged = 0, kInPlace = 1, kSwapped = 2 };
SimtFamilyPlan plan_k_major_b(const GemmArgs& args, KMajorB how, const PipeCatalog& cat);

// The one split-k policy: few 128x128 tiles for the SMs and k >= 4096 (where split-k measured
// faster than the pipelined kernel with a stream-k last wave), and the planner, allowed to
// split, gives more than one slice. gemm_pick runs kSplitK exactly when this says so.
bool simt_wants_split_k(const GemmArgs& args, const PipeCatalog& cat);
// The shape half of that policy: k >= 4096 and at most half as many 128x128 tiles as SMs, or
// any width for float32 of at most 32 rows (the split-k planner's cost model deciding).
bool simt_split_k_class(const GemmArgs& args);

}  // namespace simt
}  // namespace gemmt
