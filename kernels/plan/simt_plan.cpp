// The SIMT family's planner (see simt_plan.h): a wave model of the GPU picks the pipelined
// kernel's tile shape, k-split and stream-k split; the gemv kernels' shape follows from strides.
#include "plan/simt_plan.h"

#include <algorithm>
#include <cmath>

#include "common/copy_layout.h"

namespace gemmt {
namespace simt {

double l2_budget_bytes(const GemmArgs& a) {
  return kL2BudgetOnReference * l2_ratio(a.device);
}

double split_bytes_per_clk(const GemmArgs& a) {
  return kSplitBytesPerClk * dram_ratio(a.device) / sm_clock_ratio(a.device);
}

double stream_k_dram_bytes_per_clk(const GemmArgs& a) {
  return kStreamKDramBytesPerClk * dram_ratio(a.device) / sm_clock_ratio(a.device);
}

double stage_copy_cost(const GemmArgs& a) {
  return kStageCopyCost * sm_clock_ratio(a.device) / dram_ratio(a.device);
}

WarpTiledLoad warp_tiled_load(ScalarType t, const void* base, int64_t c_stride, int64_t k_stride) {
  if (!is_aligned(base, static_cast<std::size_t>(4 * elem_bytes(t)))) {
    return WarpTiledLoad::kScalar;
  }
  if (c_stride == 1 && k_stride % 4 == 0) return WarpTiledLoad::kVecAlongC;
  if (k_stride == 1 && c_stride % 4 == 0) return WarpTiledLoad::kVecAlongK;
  return WarpTiledLoad::kScalar;
}

const char* pipe_tile_name(PipeTile t) {
  switch (t) {
    case PipeTile::kLarge:
      return "large";
    case PipeTile::kMedium:
      return "medium";
    case PipeTile::kSmall:
      return "small";
    case PipeTile::kFat:
      return "fat";
    case PipeTile::kNarrow:
      return "narrow";
    case PipeTile::kSkinny:
      return "skinny";
    default:
      return "unknown";
  }
}

// A stride of an extent-1 dimension is never used, so it does not block a vector mode.
LoadMode pipe_load_mode(ScalarType t, const void* base, int64_t c_stride, int64_t k_stride,
                        int64_t c_ext, int64_t k_ext) {
  const int64_t es = elem_bytes(t);
  const bool a16 = is_aligned(base, 16);
  const bool c_unit = c_stride == 1 || c_ext == 1;
  const bool k_unit = k_stride == 1 || k_ext == 1;
  if (c_unit && a16 && (k_ext == 1 || (k_stride * es) % 16 == 0)) return kVecC;
  if (k_unit) {
    if (t == ScalarType::kFloat32) return kVecK;  // 4-byte copies: no alignment needed
    if (a16 && (c_ext == 1 || (c_stride * es) % 16 == 0)) return kVecK;
  }
  return kScalar;
}

namespace {

// float32 of at most 32 rows, which the 32 x 256 tile runs without rows to spare.
bool few_float32_rows(const GemmArgs& args) {
  return args.dtype == ScalarType::kFloat32 && args.m <= pipe_shape(PipeTile::kSkinny).bm;
}

LoadMode a_mode_of(const GemmArgs& a) {
  return pipe_load_mode(a.dtype, a.a, a.a_stride_m, a.a_stride_k, a.m, a.k);
}
LoadMode b_mode_of(const GemmArgs& a) {
  return pipe_load_mode(a.dtype, a.b, a.b_stride_n, a.b_stride_k, a.n, a.k);
}

// The instance of `tile` for these loader modes, as the catalog reports it; interior asks for
// the whole-tiles instance. inst.built is false when it is not compiled.
PipeChoice choice_for(ScalarType t, PipeTile tile, LoadMode a_mode, LoadMode b_mode, bool interior,
                      const PipeCatalog& cat) {
  PipeChoice c;
  if (!pipe_instance_built(t, tile, a_mode, b_mode, interior, false)) return c;
  const PipeShape& s = pipe_shape(tile);
  c.tile = tile;
  c.a_mode = a_mode;
  c.b_mode = b_mode;
  c.interior = interior;
  c.bm = s.bm;
  c.bn = s.bn;
  c.bk = s.bk;
  c.stages = interior ? s.interior_stages : s.stages;
  c.threads = s.threads();
  c.smem = s.smem_bytes(c.stages);
  const int i = static_cast<int>(tile);
  c.efficiency = interior ? kPipeInteriorEfficiency[i] : kPipeEfficiency[i];
  c.lone_rate = kPipeLoneBlockRate[i];
  c.inst = cat.query(t, tile, a_mode, b_mode, interior, false);
  if (pipe_instance_built(t, tile, a_mode, b_mode, interior, true)) {
    c.streamk_inst = cat.query(t, tile, a_mode, b_mode, interior, true);
  }
  return c;
}

// Modelled time of `blocks` equal blocks of `work` FFMA-slots each. Equal blocks advance in
// waves of sms * blocks_per_sm; a wave whose SMs hold r blocks of w warps runs at
// min(1, lone_rate * r * w / 4) of the full rate: fewer than 8 resident warps cannot hide
// the FFMA and shared-load latencies.
double wave_cost(const PipeChoice& e, const PipeInstance& inst, double blocks, double work,
                 double sms) {
  const double bps = std::max(1, inst.blocks_per_sm);
  const double warps = e.threads / 32.0;
  auto wave = [&](double r) { return r * work / std::min(1.0, e.lone_rate * r * warps / 4.0); };
  const double full = std::floor(blocks / (sms * bps));
  const double rem = blocks - full * sms * bps;
  return full * wave(bps) + (rem > 0 ? wave(std::ceil(rem / sms)) : 0.0);
}

// The cheapest stream-k split of a problem of `tiles` tiles of k_tiles k-tiles each, if any
// beats `cost` (the data-parallel one); force: take the cheapest possible split regardless.
// Candidates: the last partial wave's tiles, or those plus one full wave (longer runs, fewer
// contributors per tile), dealt to one full wave of blocks. Stream-k costs beyond the FFMAs:
// a block publishes one slot and the finishing block reads the others through L2, plus a fixed
// cost; runs start at different k, so when the operands exceed L2 a run that needs more DRAM
// bandwidth than kStreamKDramBytesPerClk is slowed in proportion.
void consider_stream_k(const GemmArgs& a, const PipeChoice& e, int64_t tiles, int64_t k_tiles,
                       double sms, double operand_bytes, bool force, double& cost, PipePlan& plan) {
  if (!e.streamk_inst.built || e.streamk_inst.error != 0) return;
  const int64_t wave = static_cast<int64_t>(sms) * std::max(1, e.streamk_inst.blocks_per_sm);
  const int64_t rem = tiles % wave;
  const double tile_work =
      static_cast<double>(e.bm) * e.bn * e.bk * k_tiles / (128.0 * e.efficiency);
  const double slot_cycles = 4.0 * e.bm * e.bn / kStreamKBytesPerClk;
  const double dram_need = (e.bm + e.bn) * 4.0 * 128.0 * e.efficiency / (e.bm * e.bn);
  const double dram_rate = stream_k_dram_bytes_per_clk(a);
  const double slowdown =
      operand_bytes > l2_budget_bytes(a) && dram_need > dram_rate ? dram_need / dram_rate : 1.0;
  bool found = false;
  for (const int64_t streamk_tiles : {rem, rem + wave}) {
    if (rem == 0 || streamk_tiles > tiles) continue;
    const int64_t total = streamk_tiles * k_tiles;
    const int64_t blocks = std::min(wave, force ? total : total / kStreamKMinIters);
    if (blocks < 1 || (!force && blocks <= streamk_tiles)) continue;
    const int64_t iters = total / blocks, extra = total % blocks;
    const double run = tile_work * (iters + (extra ? 1 : 0)) / k_tiles * slowdown;
    const double c =
        wave_cost(e, e.inst, static_cast<double>(tiles - streamk_tiles), tile_work, sms) +
        wave_cost(e, e.streamk_inst, static_cast<double>(blocks), run, sms) +
        slot_cycles * (1.0 + std::ceil(static_cast<double>(k_tiles) / iters)) + kStreamKFixedCost;
    if ((force && !found) || c < cost) {
      found = true;
      cost = c;
      plan.streamk_tiles = static_cast<int>(streamk_tiles);
      plan.streamk_blocks = static_cast<int>(blocks);
      plan.streamk_iters = iters;
      plan.streamk_extra = extra;
    }
  }
}

// Picks the tile shape (and, when allowed, the number of k-slices) with the lowest modelled
// time: wave_cost of blocks of bm * bn * kps / efficiency FFMA-slots. A split adds the
// workspace traffic and a launch. Without a split, the last wave may run as stream-k. A shape
// that tiles the problem exactly competes with its interior instance (if any).
PipePlan plan_pipelined_uncached(const GemmArgs& a, const PipeOptions& opt,
                                 const PipeCatalog& cat) {
  PipePlan best;
  const LoadMode a_mode = a_mode_of(a), b_mode = b_mode_of(a);
  const double sms = std::max(1, a.sm_count);
  const double es = static_cast<double>(elem_bytes(a.dtype));
  double best_cost = 0.0;
  const int tile_begin = opt.only_tile >= 0 ? opt.only_tile : 0;
  const int tile_end =
      opt.only_tile >= 0 ? std::min(opt.only_tile + 1, kNumPipeTiles) : kNumPipeTiles;
  for (int ti = tile_begin; ti < tile_end; ++ti) {
    const PipeTile tile = static_cast<PipeTile>(ti);
    PipeChoice e = choice_for(a.dtype, tile, a_mode, b_mode, false, cat);
    if (!e.inst.built) continue;
    // Whole tiles everywhere: every block lies inside C and, k being a multiple of the
    // k-tile, so does every k-slice (k_per_split below is a multiple of it).
    if (opt.allow_interior && a.k > 0 && a.m % e.bm == 0 && a.n % e.bn == 0 && a.k % e.bk == 0) {
      const PipeChoice ie = choice_for(a.dtype, tile, a_mode, b_mode, true, cat);
      if (ie.inst.built && ie.inst.error == 0) e = ie;
    }
    if (e.inst.error != 0) {
      if (best.error == kPlanNotSupported) best.error = e.inst.error;
      continue;
    }
    const int64_t tm = ceil_div(a.m, e.bm), tn = ceil_div(a.n, e.bn);
    if (tm * tn > kMaxGridX) continue;
    const int64_t k_tiles = std::max<int64_t>(1, ceil_div(a.k, e.bk));
    int max_splits = 1;
    if (opt.allow_split) {
      const int64_t by_k = std::max<int64_t>(1, k_tiles / kMinKTilesPerSplit);
      const int64_t by_ws = std::max<int64_t>(
          1, static_cast<int64_t>(kMaxSplitWorkspace / (4 * static_cast<std::size_t>(a.m) *
                                                        static_cast<std::size_t>(a.n))));
      max_splits = static_cast<int>(std::min<int64_t>({kMaxSplits, by_k, by_ws}));
    }
    int prev_splits = 0;
    for (int s = 1; s <= max_splits; ++s) {
      const int64_t kps = ceil_div(k_tiles, s) * e.bk;
      const int splits = static_cast<int>(ceil_div(a.k, kps));
      if (splits == prev_splits) continue;
      prev_splits = splits;
      const double blocks = static_cast<double>(tm * tn) * splits;
      double cost = wave_cost(e, e.inst, blocks,
                              static_cast<double>(e.bm) * e.bn * kps / (128.0 * e.efficiency), sms);
      PipePlan cand;
      if (splits > 1) {
        const double mn = static_cast<double>(a.m) * static_cast<double>(a.n);
        cost +=
            (splits * mn * 8.0 + mn * es * 2.0) / (split_bytes_per_clk(a) * sms) + kSplitFixedCost;
      } else if (opt.stream_k != 0 && a.k > 0) {
        const double operand_bytes =
            es * (static_cast<double>(a.m) * a.k + static_cast<double>(a.k) * a.n);
        consider_stream_k(a, e, tm * tn, k_tiles, sms, operand_bytes, opt.stream_k > 0, cost, cand);
      }
      if (best.error != kPlanOk || cost < best_cost) {
        best_cost = cost;
        best = cand;
        best.choice = e;
        best.splits = splits;
        best.k_per_split = splits > 1 ? kps : std::max<int64_t>(a.k, 1);
        best.tiles_m = static_cast<int>(tm);
        best.tiles_n = static_cast<int>(tn);
        best.error = kPlanOk;
      }
    }
  }
  // k_per_split must be a whole number of k-tiles for every slice but the last.
  if (best.error == kPlanOk && best.splits == 1) {
    best.k_per_split = ceil_div(std::max<int64_t>(a.k, 1), best.choice.bk) * best.choice.bk;
  }
  return best;
}

}  // namespace

PipePlan plan_pipelined(const GemmArgs& a, const PipeOptions& opt, const PipeCatalog& cat) {
  struct Key {
    int64_t m = -1, n = -1, k = -1;
    int a_mode = -1, b_mode = -1, sms = -1, device = -1, only_tile = -2, stream_k = -2;
    ScalarType dtype = ScalarType::kUInt8;
    bool allow_split = false, allow_interior = false;
    decltype(PipeCatalog::query) query = nullptr;
    DeviceInfo dev;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && a_mode == o.a_mode && b_mode == o.b_mode &&
             sms == o.sms && device == o.device && only_tile == o.only_tile &&
             stream_k == o.stream_k && dtype == o.dtype && allow_split == o.allow_split &&
             allow_interior == o.allow_interior && query == o.query &&
             dev.l2_bytes == o.dev.l2_bytes && dev.memory_clock_khz == o.dev.memory_clock_khz &&
             dev.memory_bus_bits == o.dev.memory_bus_bits && dev.sm_clock_khz == o.dev.sm_clock_khz;
    }
  };
  // The last few plans of this thread: per thread, so no lock and no thread ever sees another's
  // half-written entry; a few entries, because `auto` asks for the split-k plan before the run
  // plans the variant it picked.
  constexpr int kCacheEntries = 4;
  thread_local Key keys[kCacheEntries];
  thread_local PipePlan plans[kCacheEntries];
  thread_local int next = 0;
  if (cat.query == nullptr) return PipePlan{};
  Key key;
  key.m = a.m;
  key.n = a.n;
  key.k = a.k;
  key.a_mode = a_mode_of(a);
  key.b_mode = b_mode_of(a);
  key.sms = a.sm_count;
  key.device = cat.device;
  key.dtype = a.dtype;
  key.only_tile = opt.only_tile;
  key.allow_split = opt.allow_split;
  key.allow_interior = opt.allow_interior;
  key.stream_k = opt.stream_k;
  key.query = cat.query;
  key.dev = a.device;
  if (cat.device < 0) return plan_pipelined_uncached(a, opt, cat);
  for (int i = 0; i < kCacheEntries; ++i) {
    if (keys[i] == key) return plans[i];
  }
  const PipePlan plan = plan_pipelined_uncached(a, opt, cat);
  if (plan.error == kPlanOk) {
    keys[next] = key;
    plans[next] = plan;
    next = (next + 1) % kCacheEntries;
  }
  return plan;
}

std::size_t streamk_counter_bytes(const PipePlan& pl) {
  return (static_cast<std::size_t>(pl.streamk_tiles) * 4 + 255) / 256 * 256;
}

std::size_t streamk_workspace_bytes(const PipePlan& pl) {
  if (pl.streamk_blocks == 0) return 0;
  return streamk_counter_bytes(pl) +
         static_cast<std::size_t>(pl.streamk_blocks) * 2 * pl.choice.bm * pl.choice.bn * 4;
}

// ---- K-major B staging ------------------------------------------------------------------------
int64_t staged_b_pitch(const GemmArgs& a) {
  return copy_pitch(a.n, elem_bytes(a.dtype));
}

std::size_t staged_b_bytes(const GemmArgs& a) {
  return copy_bytes(a.k, a.n, elem_bytes(a.dtype));
}

bool can_stage_b(const GemmArgs& a) {
  return a.m >= 1 && a.n >= 4 && a.k >= 2 && a.n <= kCopyMaxLen && b_mode_of(a) == kVecK;
}

bool stages_b(const GemmArgs& a) {
  if (!can_stage_b(a)) return false;
  if (a.dtype != ScalarType::kFloat32) return a.m >= kStageBMinM;
  const bool pow2_k = (a.k & (a.k - 1)) == 0;
  return stage_copy_cost(a) / static_cast<double>(a.m) <
         (pow2_k ? kInPlacePenaltyPow2K : kInPlacePenalty);
}

GemmArgs with_staged_b(const GemmArgs& a, const void* ws) {
  GemmArgs s = a;
  s.b = ws;
  s.b_stride_k = staged_b_pitch(a);
  s.b_stride_n = 1;
  return s;
}

GemmArgs transposed_problem(const GemmArgs& a) {
  GemmArgs t = a;
  t.m = a.n;
  t.n = a.m;
  t.a = a.b;
  t.a_stride_m = a.b_stride_n;
  t.a_stride_k = a.b_stride_k;
  t.b = a.a;
  t.b_stride_k = a.a_stride_k;
  t.b_stride_n = a.a_stride_m;
  return t;
}

bool swaps_operands(const GemmArgs& a) {
  if (a.dtype != ScalarType::kFloat32 || a.m < 1 || a.n < 1 || b_mode_of(a) != kVecK) {
    return false;
  }
  const LoadMode am = a_mode_of(a);
  if (am == kVecC) return true;
  return am == kVecK && a.m < a.n && stages_b(transposed_problem(a));
}

// A few float32 rows run on the 32-row tile as they lie, reading the K-major B in place,
// where the device has that tile for their layout: swapped, they were the n' <= 32 columns of
// 64-wide tiles, which ran 1.5-1.6x slower (H200, 4-32 rows against 28672 x 4096 and
// 128256 x 4096 weights).
namespace {
bool few_rows_in_place(const GemmArgs& a, const PipeCatalog& cat) {
  if (!few_float32_rows(a)) return false;
  const PipeInstance inst =
      cat.query(a.dtype, PipeTile::kSkinny, a_mode_of(a), b_mode_of(a), false, false);
  return inst.built && inst.error == 0;
}
}  // namespace

void plan_pipelined_staged(const GemmArgs& a, bool allow_split, bool staged, const PipeCatalog& cat,
                           SimtFamilyPlan& fp) {
  PipeOptions opt;
  opt.allow_split = allow_split;
  fp.staged_b = staged;
  fp.pipe = plan_pipelined(staged ? with_staged_b(a, planning_workspace()) : a, opt, cat);
  if (fp.pipe.error != kPlanOk) {
    fp.error = fp.pipe.error;
    fp.summary = SimtPlan{};
    return;
  }
  fp.error = kPlanOk;
  SimtPlan& sp = fp.summary;
  sp = describe(fp.pipe);
  if (staged) sp.workspace_bytes += staged_b_bytes(a);
  if (fp.pipe.splits > 1) {
    sp.workspace_bytes += static_cast<std::size_t>(fp.pipe.splits) * static_cast<std::size_t>(a.m) *
                          static_cast<std::size_t>(a.n) * sizeof(float);
  }
}

// ---- Gemv -------------------------------------------------------------------------------------
int gemv_warps_per_row(int64_t len) {
  // Warps per row grow with the dot length so each lane still streams several vectors.
  // A rule giving every lane at least eight vectors instead (fewer warps per row at k = 2048
  // to 8192) ran more than 0.3% slower against torch on 19 of 32 bf16 / fp16 weights, by up
  // to 7%, and faster on 5 (m = 1, weights from DRAM; 400f132:benchmarks/results/
  // h100_2026-11-27_gemv_rows/, 1_before against 2_rows_rule).
  return len >= 8192 ? 8 : len >= 4096 ? 4 : len >= 2048 ? 2 : 1;
}

int64_t gemv_prefetch_blocks(const GemvPlan& g, int64_t elem_bytes, const GemmArgs& a) {
  if (a.cc_major < 9 || elem_bytes != 2 || g.colsweep || !g.vec16 || g.splits != 1 ||
      g.rows_per_block < 1) {
    return 0;
  }
  const int64_t block_bytes = g.rows_per_block * g.len * elem_bytes;
  const double matrix_bytes = static_cast<double>(g.rows) * g.len * elem_bytes;
  if (block_bytes > kGemvPrefetchBlockBytes || matrix_bytes <= l2_budget_bytes(a)) return 0;
  const int64_t sms = std::max(1, a.sm_count);
  // Blocks a SM that a third of the L2 holds at the largest block (8.08 on an H100's 132 SMs).
  const double l2_bytes = static_cast<double>(known_or_reference(a.device).l2_bytes);
  const int64_t fit = static_cast<int64_t>(kGemvPrefetchMaxL2Share * l2_bytes /
                                           (static_cast<double>(kGemvPrefetchBlockBytes) * sms));
  return std::min(kGemvPrefetchLeadPerSm, fit) * sms;
}

bool gemv_takes_few_rows(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat32 && !a.allow_tf32 && a.m > 1 && a.m <= kGemvMaxVecs &&
         a.n > 1 && (a.b_stride_k == 1 || a.b_stride_n == 1 || a.k == 1);
}

bool gemv_picks_few_rows(const GemmArgs& a) {
  return gemv_takes_few_rows(a) && (a.b_stride_k == 1 || a.k == 1 || a.m == 2);
}

GemvPlan plan_gemv(const GemmArgs& a, int warps_per_row) {
  GemvPlan g;
  if (a.n == 1) {
    g.mat = a.a;
    g.s_r = a.a_stride_m;
    g.s_p = a.a_stride_k;
    g.vec = a.b;
    g.s_v = a.b_stride_k;
    g.rows = a.m;
    g.s_out = a.ldc;
  } else {  // B^T's rows against the row of A, or the 2-4 rows of gemv_takes_few_rows
    g.mat = a.b;
    g.s_r = a.b_stride_n;
    g.s_p = a.b_stride_k;
    g.vec = a.a;
    g.s_v = a.a_stride_k;
    g.rows = a.n;
    g.s_out = 1;
    g.vecs = static_cast<int>(std::max<int64_t>(a.m, 1));
    g.s_vv = a.a_stride_m;
    g.s_ov = a.ldc;
  }
  g.len = a.k;
  const int64_t es = elem_bytes(a.dtype);
  const int64_t ve = 16 / es;
  const int64_t rows = g.rows, len = g.len;
  const auto sabs = [](int64_t v) { return v < 0 ? -v : v; };
  g.colsweep = rows > 1 && (len == 1 || (g.s_p != 1 && sabs(g.s_r) <= sabs(g.s_p)));
  int64_t min_chunk;
  if (g.colsweep) {
    g.vec16 = g.s_r == 1 && is_aligned(g.mat, 16) && (len == 1 || (g.s_p * es) % 16 == 0);
    g.rows_per_block = 0;
    g.blocks_x = ceil_div(rows, 32 * (g.vec16 ? ve : 1));
    min_chunk = 64;  // 8 warps x 8 steps
  } else {
    g.vec16 = (len == 1 || g.s_p == 1) && (len == 1 || g.s_v == 1) && is_aligned(g.mat, 16) &&
              is_aligned(g.vec, 16) && (rows == 1 || (g.s_r * es) % 16 == 0) &&
              (g.vecs == 1 || (g.s_vv * es) % 16 == 0);
    const int wpr = warps_per_row > 0 ? warps_per_row : gemv_warps_per_row(len);
    g.rows_per_block = 8 / wpr;
    g.blocks_x = ceil_div(rows, g.rows_per_block);
    min_chunk = 8192;
  }
  // Enough blocks for ~4 per SM keeps DRAM busy; split p only to reach that.
  const int64_t target = 4 * static_cast<int64_t>(std::max(1, a.sm_count));
  int64_t splits = 1;
  if (g.blocks_x < target) {
    splits = std::min(ceil_div(target, g.blocks_x), std::max<int64_t>(1, len / min_chunk));
    splits = std::min<int64_t>(splits, 65535);
  }
  // p_per_split: a multiple of 256 (covers every vector width) so slices start aligned.
  int64_t pps = splits > 1 ? ceil_div(ceil_div(len, splits), 256) * 256 : std::max<int64_t>(len, 1);
  splits = splits > 1 ? ceil_div(len, pps) : 1;
  if (splits <= 1) {
    splits = 1;
    pps = std::max<int64_t>(len, 1);
  }
  g.p_per_split = pps;
  g.splits = static_cast<int>(splits);
  g.prefetch_blocks = gemv_prefetch_blocks(g, es, a);
  return g;
}

// ---- The family ---------------------------------------------------------------------------------
bool simt_variant_supports(const GemmArgs& args, GemmVariant v) {
  if (!simt_dtype_ok(args.dtype)) return false;
  if (args.m < 0 || args.n < 0 || args.k < 0) return false;
  switch (v) {
    case GemmVariant::kNaive:
    case GemmVariant::kSmemTiled:
    case GemmVariant::kRegisterBlocked:
    case GemmVariant::kWarpTiled:
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK:
      return true;
    case GemmVariant::kGemv:
      return args.m == 1 || args.n == 1 || gemv_takes_few_rows(args);
    default:
      return false;
  }
}

SimtPlan describe(const PipePlan& pp) {
  SimtPlan sp;
  sp.block_m = pp.choice.bm;
  sp.block_n = pp.choice.bn;
  sp.block_k = pp.choice.bk;
  sp.stages = pp.choice.stages;
  sp.threads = pp.choice.threads;
  sp.interior = pp.choice.interior;
  sp.splits = pp.splits;
  sp.stream_k_blocks = pp.streamk_blocks;
  sp.stream_k_tiles = pp.streamk_tiles;
  sp.workspace_bytes = streamk_workspace_bytes(pp);
  return sp;
}

SimtFamilyPlan plan_simt(const GemmArgs& a, GemmVariant v, const PipeCatalog& cat, int gemv_wpr) {
  SimtFamilyPlan fp;
  if (!simt_variant_supports(a, v)) return fp;
  fp.variant = v;
  fp.error = kPlanOk;
  // An empty C: the run launches nothing. (k == 0 scales C by beta; the block tiles of steps
  // 1-4 are still reported, the pipelined and gemv plans stay empty.)
  if (a.m == 0 || a.n == 0) return fp;
  SimtPlan& sp = fp.summary;
  switch (v) {
    case GemmVariant::kNaive:
      if (ceil_div(a.m, kNaiveTile) * ceil_div(a.n, kNaiveTile) > kMaxGridX)
        fp.error = kPlanNotSupported;
      sp.block_m = sp.block_n = kNaiveTile;
      sp.threads = kNaiveTile * kNaiveTile;
      break;
    case GemmVariant::kSmemTiled:
      if (ceil_div(a.m, kSmemTile) * ceil_div(a.n, kSmemTile) > kMaxGridX)
        fp.error = kPlanNotSupported;
      sp.block_m = sp.block_n = sp.block_k = kSmemTile;
      sp.threads = kSmemTile * kSmemTile;
      break;
    case GemmVariant::kRegisterBlocked:
      if (ceil_div(a.m, kRbM) * ceil_div(a.n, kRbN) > kMaxGridX) fp.error = kPlanNotSupported;
      sp.block_m = kRbM;
      sp.block_n = kRbN;
      sp.block_k = kRbK;
      sp.threads = kRbThreads;
      break;
    case GemmVariant::kWarpTiled:
      if (ceil_div(a.m, kWtM) * ceil_div(a.n, kWtN) > kMaxGridX) fp.error = kPlanNotSupported;
      sp.block_m = kWtM;
      sp.block_n = kWtN;
      sp.block_k = kWtK;
      sp.threads = kWtThreads;
      break;
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK: {
      if (a.k == 0) break;
      if (v == GemmVariant::kPipelined && swaps_operands(a) && !few_rows_in_place(a, cat)) {
        const GemmArgs t = transposed_problem(a);
        fp.swapped = true;
        plan_pipelined_staged(t, false, stages_b(t), cat, fp);
      } else {
        plan_pipelined_staged(a, v == GemmVariant::kSplitK, stages_b(a), cat, fp);
      }
      break;
    }
    case GemmVariant::kGemv: {
      if (a.k == 0) break;
      fp.gemv = plan_gemv(a, gemv_wpr);
      sp.threads = 256;
      sp.splits = fp.gemv.splits;
      if (fp.gemv.splits > 1) {
        sp.workspace_bytes = static_cast<std::size_t>(fp.gemv.splits) * fp.gemv.vecs *
                             static_cast<std::size_t>(fp.gemv.rows) * sizeof(float);
      }
      if (fp.gemv.blocks_x > kMaxGridX) fp.error = kPlanNotSupported;
      break;
    }
    default:
      break;
  }
  return fp;
}

SimtFamilyPlan plan_k_major_b(const GemmArgs& a, KMajorB how, const PipeCatalog& cat) {
  SimtFamilyPlan fp;
  fp.variant = GemmVariant::kPipelined;
  if (a.dtype != ScalarType::kFloat32 || !can_stage_b(a)) return fp;
  if (how == KMajorB::kSwapped) {
    const GemmArgs t = transposed_problem(a);
    fp.swapped = true;
    plan_pipelined_staged(t, false, stages_b(t), cat, fp);
    return fp;
  }
  plan_pipelined_staged(a, false, how == KMajorB::kStaged, cat, fp);
  return fp;
}

namespace {

// At most half as many t_m x t_n tiles as SMs, and k >= 4096.
bool few_tiles_long_k(const GemmArgs& args, int64_t t_m, int64_t t_n) {
  const int64_t tiles = ceil_div(args.m, t_m) * ceil_div(args.n, t_n);
  return tiles * 2 <= args.sm_count && args.k >= 4096;
}

}  // namespace

bool simt_split_k_class(const GemmArgs& args) {
  // float32 of at most 32 rows: any k >= 4096, the split planner's cost model deciding. The
  // 32-row tile runs them FFMA-bound: unsplit, a weight of 11008 or 14336 columns left 43-56
  // of its tiles to the pipelined kernel's 64 x 128 tiles with a stream-k wave (0.3-0.65 of
  // cuBLAS, H200), and 112-501 of them (28672-128256 columns) ran one block an SM, whole k
  // each (0.52-0.96 at 2-16 rows).
  if (few_float32_rows(args)) return args.k >= 4096;
  return few_tiles_long_k(args, 128, 128);
}

bool simt_wants_split_k(const GemmArgs& args, const PipeCatalog& cat) {
  // Split-k pays when the output has too few tiles to occupy every SM while k is long enough
  // that each slice still streams a deep panel; elsewhere the pipelined kernel (with stream-k
  // for its last wave) is faster (H100: 1024^3 fp32, docs/performance.md). The few-rows class
  // holds where the split runs on the 32-row tile; a split on another (the layout needs
  // scalar loads, or the device has no such tile) keeps the 128 x 128 count.
  if (!simt_split_k_class(args)) return false;
  const SimtFamilyPlan fp = plan_simt(args, GemmVariant::kSplitK, cat);
  if (fp.error != kPlanOk || fp.pipe.splits <= 1) return false;
  return fp.pipe.choice.tile == PipeTile::kSkinny || few_tiles_long_k(args, 128, 128);
}

}  // namespace simt
}  // namespace gemmt
