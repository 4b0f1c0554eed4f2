// SIMT GEMM ladder, step 5: the pipelined kernel, the fast SIMT kernel (production).
//
// Over step 4 it adds:
//  * a STAGES-deep ring of shared-memory tiles filled by cp.async (float32) or by register-
//    staged loads (16-bit types, which must be widened on the way): the loads of tile t+2
//    are in flight while tile t is multiplied, so global latency is hidden by the math
//    instead of by other warps, and one barrier per k-tile suffices;
//  * fragment double buffering: the shared loads of k-step kk+1 are issued before the FMAs
//    of step kk, so their latency overlaps arithmetic even at 4 warps per block;
//  * 128 (large tile) accumulators per thread: per k step a thread issues 6 LDS.128 for 128
//    FFMA, which keeps shared-memory bandwidth and issue slots below the FFMA rate;
//  * a grouped launch order for L2 reuse, and a tile shape chosen per problem on the host;
//  * for problems that are whole tiles, an interior instance with branch-free copies that
//    the compiler interleaves with the FFMAs (gemm_pipelined_kernel's INTERIOR).
// Measured on an H100 (exact float32, docs/performance.md): 29.7-51.9 TFLOP/s, 1.00-1.09 of
// cuBLAS at 1024^3-8192^3 through `auto`.
//
// One template, instantiated per dtype and tile shape in pipelined_<dtype>_<tile>.cu (so a
// parallel build compiles them side by side); launched by pipelined_launch.cu with a plan of
// kernels/plan/simt_plan.cpp. Step 5b (stream_k.cuh) is the STREAMK form; step 6 (split-k)
// is blockIdx.z over k-slices with `partial` set, finished by split_k_reduce.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "plan/simt_plan.h"
#include "simt/stream_k.cuh"
#include "simt/tiles.cuh"

namespace gemmt {
namespace simt {
namespace {

// A thread's fragment of one operand at one k: N floats in runs of 4, run q at src + q * STEP
// (16-byte shared loads).
template <int N, int STEP>
__device__ __forceinline__ void load_fragment(float* dst, const float* src) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 v = *reinterpret_cast<const float4*>(src + q * STEP);
    dst[4 * q] = v.x;
    dst[4 * q + 1] = v.y;
    dst[4 * q + 2] = v.z;
    dst[4 * q + 3] = v.w;
  }
}

template <int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int STAGES_, int MINB_>
struct PipeConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
  static constexpr int STAGES = STAGES_, MIN_BLOCKS = MINB_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int LM = WM / TM, LN = WN / TN;  // lanes along m and n inside a warp
  // +4 words per shared row: 16-byte aligned rows, and the transposing loaders' lane pattern
  // lands in distinct banks (see AsyncTileLoader).
  static constexpr int PA = BM + 4, PB = BN + 4;
  static constexpr int STAGE_FLOATS = BK * (PA + PB);
  static constexpr int SMEM_BYTES = STAGES * STAGE_FLOATS * 4;
  static_assert(LM * LN == 32, "a warp is 32 lanes");
  static_assert(TM % 4 == 0 && TN % 4 == 0, "fragments are read as float4");
  static_assert(STAGES >= 2, "the ring needs a stage to fill while one is read");
};

// The tile shapes of kernels/plan/simt_plan.h (kPipeShapes) as kernel configurations; the
// reasons for each shape are given there.
template <PipeTile TILE, bool INTERIOR = false>
using CfgOf =
    PipeConfig<pipe_shape(TILE).bm, pipe_shape(TILE).bn, pipe_shape(TILE).bk, pipe_shape(TILE).wm,
               pipe_shape(TILE).wn, pipe_shape(TILE).tm, pipe_shape(TILE).tn,
               INTERIOR ? pipe_shape(TILE).interior_stages : pipe_shape(TILE).stages,
               pipe_shape(TILE).min_blocks>;
using CfgLarge = CfgOf<PipeTile::kLarge>;
using CfgMedium = CfgOf<PipeTile::kMedium>;
using CfgSmall = CfgOf<PipeTile::kSmall>;
using CfgFat = CfgOf<PipeTile::kFat>;
// Fat's interior instances keep four stages: with a single block per SM no other block hides a
// late tile (docs/performance.md, "SIMT cost model").
using CfgFatInterior = CfgOf<PipeTile::kFat, true>;
using CfgNarrow = CfgOf<PipeTile::kNarrow>;
static_assert(
    std::is_same<CfgLarge, PipeConfig<128, 128, 16, 64, 64, 16, 8, 3, 2>>::value &&
        std::is_same<CfgFatInterior, PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>>::value,
    "the kernels' names (and tuned code) follow from these configurations");

struct PipeParams {
  const void* a;
  int64_t sam, sak;
  const void* b;
  int64_t sbk, sbn;
  int64_t m, n, k;
  void* c;
  int64_t ldc;
  float alpha, beta;
  bool c_vec4;
  bool c_transposed;    // C is column-major (OutView::transposed): kVecK A only, no `partial`
  float* partial;       // split-k: [splits][m][n] float32 slices; nullptr writes C directly
  bool partial_vec4;    // n % 4 == 0: slice rows are 16-byte aligned
  int64_t k_per_split;  // multiple of BK
  int tiles_m, tiles_n;
  StreamKParams stream_k;  // the stream-k form only
  EpilogueParams epi;      // applied where C is written (split-k: by the reduction)
};

// INTERIOR instances serve problems whose every block and k-range is whole tiles (float32,
// vector loader modes; the host checks): their copies carry no bound checks or branches, and
// their FFMAs run column by column (see the inner loop). On an H100 squares of 1024-8192
// ran 2-4% faster than with the general instance for the 128x256 tile, 5-10% for 64x128.
// STREAMK instances are the stream-k form (see StreamKParams): the block loops over the runs
// of its k-tiles, one per tile it touches. The data-parallel form (STREAMK false) is the
// same code without the loop; keeping one body keeps its machine code exactly as tuned.
template <class T, class Cfg, int AMODE, int BMODE, bool INTERIOR, bool STREAMK = false>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    gemm_pipelined_kernel(const PipeParams p) {
  using raw = typename Elem<T>::raw;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN;
  constexpr int LM = Cfg::LM, LN = Cfg::LN, PA = Cfg::PA, PB = Cfg::PB;
  constexpr int STAGES = Cfg::STAGES, THREADS = Cfg::THREADS;
  constexpr int STAGE_FLOATS = Cfg::STAGE_FLOATS, B_OFF = BK * PA;
  constexpr bool kAsync = std::is_same<T, float>::value;
  // Column snake against plain column order, interior instances, H100 squares 2048-8192:
  // 128x256 tile 1-2.5% faster with B read along n, 0-1.5% slower with B read along k;
  // 64x128 tile at most 1% faster, and 3-26% slower with A read along m (the order meets
  // the loaders' code, which ptxas schedules among the FFMAs).
  constexpr bool kColumnSnake = std::is_same<Cfg, CfgFatInterior>::value && BMODE == kVecC;
  static_assert(!INTERIOR || kAsync, "interior instances are float32 (cp.async) only");
  static_assert(!STREAMK || kAsync, "stream-k instances are float32 (cp.async) only");
  using LoaderA = std::conditional_t<kAsync, AsyncTileLoader<AMODE, BK, BM, THREADS, PA>,
                                     RegTileLoader<T, AMODE, BK, BM, THREADS, PA>>;
  using LoaderB = std::conditional_t<kAsync, AsyncTileLoader<BMODE, BK, BN, THREADS, PB>,
                                     RegTileLoader<T, BMODE, BK, BN, THREADS, PB>>;

  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int lane_m = lane / LN, lane_n = lane % LN;

  // Stream-k: this block's k-tiles [it, it_end) of the stream-k tiles, taken one tile's run
  // per pass of the loop.
  [[maybe_unused]] int64_t it = 0, it_end = 0;
  if constexpr (STREAMK) {
    it = p.stream_k.begin(blockIdx.x);
    it_end = p.stream_k.begin(static_cast<int64_t>(blockIdx.x) + 1);
  }
  do {
    int tm, tn;
    int64_t k_begin, k_end;
    [[maybe_unused]] int streamk_tile = 0;
    [[maybe_unused]] bool streamk_head = true, streamk_whole = true;
    const int split = blockIdx.z;
    if constexpr (STREAMK) {
      streamk_tile = static_cast<int>(it / p.stream_k.k_tiles);
      const int64_t t0 = static_cast<int64_t>(streamk_tile) * p.stream_k.k_tiles,
                    t1 = t0 + p.stream_k.k_tiles;
      const int64_t run_end = min(it_end, t1);
      swizzle_tile<kRasterGroup>(p.stream_k.first_tile + streamk_tile, p.tiles_m, p.tiles_n, tm,
                                 tn);
      k_begin = (it - t0) * BK;
      k_end = min(p.k, (run_end - t0) * BK);
      streamk_head = it == t0;
      streamk_whole = streamk_head && run_end == t1;
      it = run_end;
      __syncthreads();  // the previous run's last shared-memory reads precede this prologue
    } else {
      swizzle_tile<kRasterGroup>(blockIdx.x, p.tiles_m, p.tiles_n, tm, tn);
      k_begin = split * p.k_per_split;
      k_end = min(p.k, k_begin + p.k_per_split);
    }
    const int num_kt = k_end > k_begin ? static_cast<int>((k_end - k_begin + BK - 1) / BK) : 0;

    LoaderA la;
    LoaderB lb;
    la.init(static_cast<const raw*>(p.a), p.sam, p.sak, static_cast<int64_t>(tm) * BM, p.m, k_begin,
            tid);
    lb.init(static_cast<const raw*>(p.b), p.sbn, p.sbk, static_cast<int64_t>(tn) * BN, p.n, k_begin,
            tid);
    const uint32_t smem0 = smem_addr(smem);

    // Issues the loads of the next tile (at k = tile_k) into the stage at byte address
    // stage_addr. Only the last tile of a slice can cross k_end; the others take the
    // check-free path.
    int64_t tile_k = k_begin;
    auto load_tile = [&](uint32_t stage_addr) {
      if (tile_k + BK <= k_end) {
        la.template load<true>(stage_addr, tile_k, k_end);
        lb.template load<true>(stage_addr + B_OFF * 4, tile_k, k_end);
      } else {
        la.template load<false>(stage_addr, tile_k, k_end);
        lb.template load<false>(stage_addr + B_OFF * 4, tile_k, k_end);
      }
      tile_k += BK;
    };
    auto load_interior_tile = [&](uint32_t stage_addr, int tile) {
      if constexpr (INTERIOR) {
        la.load_interior(stage_addr, tile);
        lb.load_interior(stage_addr + B_OFF * 4, tile);
      }
    };

    // Prologue: tiles 0 .. STAGES-2 into stages 0 .. STAGES-2, one commit group per tile
    // (empty groups included), so that "group g complete" always means "tile g landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < num_kt) {
        if constexpr (INTERIOR) {
          load_interior_tile(smem0 + s * STAGE_FLOATS * 4, s);
        } else {
          load_tile(smem0 + s * STAGE_FLOATS * 4);
          la.store(smem + s * STAGE_FLOATS);
          lb.store(smem + s * STAGE_FLOATS + B_OFF);
        }
      }
      cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float af[2][TM], bf[2][TN];
    const int a_off = warp_m * Cfg::WM + lane_m * 4;
    const int b_off = B_OFF + warp_n * Cfg::WN + lane_n * 4;
    auto load_frags = [&](float* fa, float* fb, const float* stage, int kk) {
      load_fragment<TM, LM * 4>(fa, stage + kk * PA + a_off);
      load_fragment<TN, LN * 4>(fb, stage + kk * PB + b_off);
    };

    // Invariants at the top of k-tile kt: stage kt % STAGES holds tile kt (published by the
    // last barrier), fragments of its k-step 0 are in af[0] / bf[0], and write_stage =
    // (kt - 1) % STAGES is the stage every thread finished reading before that barrier.
    int read_stage = 0, write_stage = STAGES - 1;
    const float* rd = smem;
    load_frags(af[0], bf[0], rd, 0);
    for (int kt = 0; kt < num_kt; ++kt) {
      const bool more = kt + STAGES - 1 < num_kt;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        if (kk == BK - 1) {
          // All fragments of this tile are in registers. Publish tile kt + STAGES - 1
          // (register-staged loaders write it now), wait for this thread's copies of tile
          // kt + 1, and let one barrier both publish those and release stage kt % STAGES.
          if (more) {
            la.store(smem + write_stage * STAGE_FLOATS);
            lb.store(smem + write_stage * STAGE_FLOATS + B_OFF);
          }
          write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
          cp_async_wait<STAGES - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
          rd = smem + read_stage * STAGE_FLOATS;
        }
        // Next k step's fragments (k-step 0 of the next tile when kk == BK - 1; on the last
        // tile that read is of a stale stage and is never used).
        load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], rd, (kk + 1) % BK);
        if (kk == 0) {
          // Refill the stage released by the previous barrier with tile kt + STAGES - 1.
          // Interior instances clamp instead of branching: past the slice's last tile they copy
          // that tile again into the free stage, which is never read.
          if constexpr (INTERIOR)
            load_interior_tile(smem0 + write_stage * STAGE_FLOATS * 4,
                               min(kt + STAGES - 1, num_kt - 1));
          else if (more)
            load_tile(smem0 + write_stage * STAGE_FLOATS * 4);
          cp_async_commit();
        }
        // The FFMA order decides how ptxas allocates registers and schedules the copies among
        // the FFMAs, which moved the H100 rate by up to 26% between orders: row by row was
        // measured fastest for the general instances, column by column for the interior
        // ones, except a column snake (down column 0, up column 1, ...) for the 128x256
        // interior tile when B is read along n (benchmarks/experiments/ffma_order).
        if constexpr (INTERIOR) {
#pragma unroll
          for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int r = 0; r < TM; ++r) {
              const int i = kColumnSnake && j % 2 == 1 ? TM - 1 - r : r;
              acc[i][j] = fmaf(af[kk & 1][i], bf[kk & 1][j], acc[i][j]);
            }
        } else {
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(af[kk & 1][i], bf[kk & 1][j], acc[i][j]);
        }
      }
    }
    cp_async_wait<0>();

    bool write_c = true;
    if constexpr (STREAMK)
      if (!streamk_whole) write_c = streamk_share<Cfg>(p.stream_k, streamk_tile, streamk_head, acc);
    const int64_t row0 = static_cast<int64_t>(tm) * BM + a_off;
    const int64_t col0 = static_cast<int64_t>(tn) * BN + warp_n * Cfg::WN + lane_n * 4;
    if (p.partial != nullptr) {
      float* ws = p.partial + static_cast<int64_t>(split) * p.m * p.n;
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int64_t row = row0 + (i / 4) * LM * 4 + (i % 4);
#pragma unroll
        for (int q = 0; q < TN / 4; ++q)
          store_partial_quad(ws, p.m, p.n, p.partial_vec4, row, col0 + q * LN * 4, &acc[i][4 * q]);
      }
    } else if (write_c) {
      const OutView<T> out{static_cast<raw*>(p.c),
                           p.ldc,
                           p.m,
                           p.n,
                           p.alpha,
                           p.beta,
                           p.c_vec4,
                           p.epi.view<T>(),
                           AMODE == kVecK && p.c_transposed};
      auto store_row_major = [&] {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const int64_t row = row0 + (i / 4) * LM * 4 + (i % 4);
#pragma unroll
          for (int q = 0; q < TN / 4; ++q) store_quad(out, row, col0 + q * LN * 4, &acc[i][4 * q]);
        }
      };
      // A transposed product's A is the caller's K-major B (simt_plan.h, transposed_problem),
      // so only kVecK instances carry the column-major store (the others' `transposed` is a
      // compile-time false, which keeps the column-major branches out of their code).
      if constexpr (AMODE == kVecK) {
        if (p.c_transposed) {
          // A thread's runs of 4 rows are adjacent in a column-major C: one vector store each.
#pragma unroll
          for (int ib = 0; ib < TM / 4; ++ib) {
            const int64_t row = row0 + ib * LM * 4;
#pragma unroll
            for (int j = 0; j < TN; ++j) {
              const float v[4] = {acc[4 * ib][j], acc[4 * ib + 1][j], acc[4 * ib + 2][j],
                                  acc[4 * ib + 3][j]};
              store_quad<T, true>(out, row, col0 + (j / 4) * LN * 4 + (j % 4), v);
            }
          }
        } else {
          store_row_major();
        }
      } else {
        store_row_major();
      }
    }
  } while (STREAMK && it < it_end);
}

}  // namespace
}  // namespace simt
}  // namespace gemmt
