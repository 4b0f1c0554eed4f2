// Hopper GEMM: TMA loads into a shared-memory ring (4 to 8 stages by tile width), wgmma.mma_async
// from shared memory, warp specialisation and a persistent tile loop. C = alpha * A @ B + beta * C
// with float32 accumulation; bf16 / fp16 operands (any mix of K-major and MN-major) and float32
// read as tf32. wgmma reads a tf32 operand from shared memory K-major only, so an M-major
// tf32 A is loaded into registers (the register-sourced form) and a row-major B is handled
// by computing C^T = B^T A^T, which turns it into such an A (swap_for_tf32).
//
// CTA = 3 warpgroups. Warpgroup 0 produces: one thread walks the same tile sequence as the
// consumers and keeps the ring full with TMA; its registers are handed to the consumers
// through setmaxnreg. Warpgroups 1 and 2 consume. On the wide, three-quarter and narrow tiles
// each owns 64 rows of every 128 x kBN tile (m64n256 wgmma and 128 fp32 accumulators per
// thread on the wide tile, m64n192 and 96 on the three-quarter one, m64n64 and 32 on the
// narrow one) and writes its rows of C. On the medium tile
// they take whole tiles in turn (ping-pong: two m64n128 per k-step, 128 accumulators), each
// storing its tile while the other computes the next. On the wide tile the last wave can run
// stream-k: its k-blocks are spread over all CTAs and a tile cut into pieces is finished by
// the CTA of its last piece, which adds the other pieces' partials (scheduler.cuh: unit_at,
// epilogue.cuh: sk_give / sk_take). On the three-quarter tile a column of tiles with fewer
// columns of C than the tile (a swapped batched decode's tokens) issues narrower wgmma, of the
// columns rounded up to 16 (sm90::trimmed_tile_width); its loop is a copy of the main one so
// that the other tiles' code stays as it was. When m is not a multiple of 128, the last row of
// tiles ends at row m (Params::last_m0, sm90::last_tile_row), so no TMA box of A crosses A's
// end; a K-major B tile's second box that would cross B's end starts earlier instead
// (second_b_box). config.cuh has the tile widths, epilogue.cuh the stores.
//
// Stage layout (every operand row is 128 bytes, i.e. 128B-swizzle atoms of 8 rows):
//   A K-major : 128 rows (M) x 64 bf16 of K                      one TMA box {64, 128}
//   A MN-major: 2 boxes of 64 rows (K) x 64 bf16 of M, 8 KB each   TMA box {64, 64}
//   B K-major : kBN rows (N) x 64 bf16 of K (two kBN/2-row boxes;  TMA box {64, kBN / 2}
//               one 64-row box on the narrow tile)
//   B MN-major: kBN / 64 boxes of 64 rows (K) x 64 bf16 of N       TMA box {64, 64}
// (tf32: 32 fp32 of K per row instead of 64 bf16; an M-major A is 4 boxes of 32 x 32.)
//
// Clusters of two CTAs stacked along M share the B tile: each CTA fetches one half and
// multicasts it to both, which cuts the L2 traffic per CTA from 48 KB to 32 KB a stage on the
// wide tile (32 to 24 KB on the medium one). A stage can then only be refilled once the
// consumers of both CTAs have released it, so every warp that read it arrives on the empty
// barrier of each CTA of the cluster.
//
// This header holds the main loop (the producer's TMA ring and the consumers' wgmma loop);
// its parts are in ptx.cuh, scheduler.cuh and epilogue.cuh; the instances are compiled in
// instances_<kind>_<width>[_pair].cu. A 16-bit instance serves all four operand layouts: the
// layout picks one of four copies of the producer's and the consumers' k-block loops once a
// tile (with_layout), and the epilogue, most of the code, is compiled once instead of four
// times (an instance file now compiles in about a third of the time: instances_bf16_wide.cu
// 41 -> 14.6 s on one core). tf32 keeps one instance a layout: an M-major A changes its
// consumers' whole register plan (kARegs).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gemmt/launch.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/ptx.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/trace.cuh"

namespace gemmt {
namespace {

#if defined(GEMMT_SM90_DEVICE_CODE)

// ---- tf32 A from registers ----------------------------------------------------------------
// An M-major A stage holds four TMA boxes of 32 rows of M by 32 of K; each K row is 128
// bytes, and the 128B swizzle stores its 16-byte chunk c at c ^ (k % 8). wgmma wants from
// each thread the elements (m, k), (m + 8, k), (m, k + 4), (m + 8, k + 4) of every 64x8
// slice, m = 16 * warp + lane / 4 and k = lane % 4 (the mma.sync m16n8k8 pattern, one per
// warp). The 32 words one such load of a warp reads fall into 16 banks: a 2-way conflict
// on 16 scalar loads a k-block, small next to the 64x256x32 product they feed.
__device__ __forceinline__ uint32_t swizzled_mn_offset(int m, int k) {
  return static_cast<uint32_t>(k * 128 + (((m >> 2) ^ (k & 7)) << 4) + (m & 3) * 4);
}

// Offsets, from the start of a stage, of this thread's four A elements of the first k-step;
// k-step kk adds kk * 8 rows of 128 bytes (k % 8 does not change).
__device__ __forceinline__ void a_fragment_offsets(int cw, int warp, int lane, uint32_t (&off)[4]) {
  constexpr uint32_t kBoxBytes = 32 * 128;
  const uint32_t box = static_cast<uint32_t>(2 * cw + (warp >> 1)) * kBoxBytes;
  const int m = 16 * (warp & 1) + (lane >> 2);
  const int k = lane & 3;
  off[0] = box + swizzled_mn_offset(m, k);
  off[1] = box + swizzled_mn_offset(m + 8, k);
  off[2] = box + swizzled_mn_offset(m, k + 4);
  off[3] = box + swizzled_mn_offset(m + 8, k + 4);
}

// One k-block (four k-steps of 8) with A from registers: load the fragments, then issue and
// commit the group. `frag` must not be written again before this group has completed.
template <int kBN>
__device__ __forceinline__ void tf32_rs_kblock(float (&acc)[kBN / 2], uint32_t (&frag)[4][4],
                                               uint32_t a_stage, const uint32_t (&off)[4],
                                               uint64_t db, bool first) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) frag[kk][j] = ld_shared_b32(a_stage + off[j] + kk * 8 * 128);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    // A K-step advances 32 bytes along B's K-major rows.
    wgmma_step_tf32_rs<kBN>(acc, frag[kk], db + kk * (32 >> 4), (!first || kk != 0) ? 1u : 0u);
  }
  wgmma_commit();
}

// Calls f(std::integral_constant<int, w>) for a block width w of a kBN-wide tile
// (sm90::trimmed_tile_width): kW, kW + kStep, ... below kBN, or kBN itself.
template <int kW, int kStep, int kBN, class F>
__device__ __forceinline__ void with_width_from(int w, F&& f) {
  if constexpr (kW >= kBN) {
    f(std::integral_constant<int, kBN>{});
  } else if (w == kW) {
    f(std::integral_constant<int, kW>{});
  } else {
    with_width_from<kW + kStep, kStep, kBN>(w, f);
  }
}

// Widths by 16, or by 64 with an MN-major B.
template <bool kBMn, int kBN, class F>
__device__ __forceinline__ void with_tile_width(int w, F&& f) {
  constexpr int kStep = kBMn ? 64 : 16;
  with_width_from<kStep, kStep, kBN>(w, f);
}

// An operand's wgmma descriptor in one layout: a K-step advances 32 bytes along a K-major row,
// or 16 rows (2 KB) of an MN-major box (kStep in the descriptor's 16-byte units); kLbo is the
// leading byte offset.
template <int kKind, bool kMn>
struct OperandDesc {
  static constexpr uint32_t kStep = (kMn ? 16 * 128 : 32) >> 4;
  static constexpr uint32_t kLbo = kMn ? mn_box_bytes<kKind>() : 16;
};

// Calls f(a_mn, b_mn), two std::bool_constant, with an instance's operand layouts (config.cuh:
// kLayoutAMn, kLayoutBMn, kAnyLayout): its fixed ones, or the launch's. The call sites wrap one
// unit's main loop, so the branch runs once a tile and each layout's loop is the fixed
// instance's.
template <int kLayouts, class F>
__device__ __forceinline__ void with_layout(const Params& p, F&& f) {
  using std::bool_constant;
  if constexpr ((kLayouts & kAnyLayout) != 0) {
    if (p.a_mn) {
      if (p.b_mn) {
        f(bool_constant<true>{}, bool_constant<true>{});
      } else {
        f(bool_constant<true>{}, bool_constant<false>{});
      }
    } else if (p.b_mn) {
      f(bool_constant<false>{}, bool_constant<true>{});
    } else {
      f(bool_constant<false>{}, bool_constant<false>{});
    }
  } else {
    f(bool_constant<(kLayouts & kLayoutAMn) != 0>{}, bool_constant<(kLayouts & kLayoutBMn) != 0>{});
  }
}

#endif  // GEMMT_SM90_DEVICE_CODE

template <int kKind, int kLayouts, int kCluster, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                     const __grid_constant__ CUtensorMap tma_b,
                     const __grid_constant__ CUtensorMap tma_c, const Params p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using T = typename KindTraits<kKind>::T;
  using Cfg = TileCfg<kBN>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kBBytes = Cfg::kBBytes;
  constexpr int kBK = kKind == kTF32 ? 32 : 64;               // 128 bytes of K per stage row
  constexpr int kMnRows = 128 / static_cast<int>(sizeof(T));  // M/N extent of an MN-major box
  constexpr int kMnBox = mn_box_bytes<kKind>();
  // tf32 with an M-major A: A goes through registers (the only transposable tf32 operand).
  constexpr bool kARegs = kKind == kTF32 && (kLayouts & kLayoutAMn) != 0;
  // The medium tile runs ping-pong (whole tiles per consumer warpgroup, config.cuh), except
  // with A through registers, whose fragments for both halves would not fit beside the
  // accumulators.
  constexpr bool kPingPong = kBN == kBNMedium && !kARegs;
  // Stream-k (scheduler.cuh) runs on the wide tile only.
  constexpr bool kStreamK = kBN == kBNWide;
  // The three-quarter tile (16-bit only) computes only the columns of C its last column of
  // tiles has. (The wide tile trimmed the same way lost to the product as given wherever the
  // three-quarter one does not serve, and cost its CTA-pair instances a 4-byte spill.)
  constexpr bool kTrims = kBN == kBNThreeQuarter;
  // Arrivals that free a stage: the warps of the warpgroup(s) that read it, on every CTA of
  // the cluster.
  constexpr int kReaderWarps = kPingPong ? kConsumerWarps / 2 : kConsumerWarps;
  static_assert(kCluster == 1 || kBN != kBNNarrow, "the narrow tile runs as single CTAs");
  static_assert(kKind != kTF32 || (kLayouts & (kLayoutBMn | kAnyLayout)) == 0,
                "tf32 wgmma reads B K-major only");
  static_assert(!(kKind == kTF32 && kBN == kBNThreeQuarter), "the 128x192 tile is 16-bit only");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Both CTAs of a cluster compute the same offsets, which multicast relies on.
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_a = base;
  const uint32_t smem_b = base + kStages * kABytes;
  const uint32_t smem_c = smem_b + kStages * kBBytes;
  const uint32_t bars = smem_c + Cfg::kCBytes;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (kStages + s); };
  // Ping-pong: completed when the other consumer has passed the ring waits of its tile.
  auto turn_bar = [&](int c) { return bars + 8u * (2 * kStages + c); };

  // Broadcast so that the compiler knows the warpgroup index is warp-uniform: the role
  // branches below and the consumers' wgmma descriptors then stay in uniform registers
  // (prefill products at 512 tokens ran ~2% faster, H100:
  // cd87fa0:benchmarks/results/h100_2026-11-26_uniform_consumer/). Only there: the epilogue takes
  // its indices per thread (cw_t, warp_in_wg), because made uniform they changed the
  // consumers' register allocation and the wide tile's fill epilogue spilled 30-50 bytes
  // (e814cf3:benchmarks/results/h100_2026-11-26_uniform_producer/).
  // Not with A through registers (tf32, M-major A), whose consumers need every register:
  // there the warp-uniform forms (this one and the producer's below) made the instances
  // with CTA pairs spill (up to 112 bytes of spill loads), so the indices stay per thread
  // and lane 0 alone runs the producer.
  constexpr bool kUniformRoles = !kARegs;
  const int wg = kUniformRoles ? __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0)
                               : static_cast<int>(threadIdx.x >> 7);
  const int warp_in_wg = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  uint32_t rank = 0;
  if constexpr (kCluster > 1) rank = cluster_ctarank();

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);  // the producer's arrive.expect_tx; bytes do the rest
      mbar_init(empty_bar(s), kReaderWarps * kCluster);
    }
    mbar_init(turn_bar(0), 1);
    mbar_init(turn_bar(1), 1);
    fence_barrier_init();
  }
  // The peer may multicast into our ring or arrive on our barriers only after they exist.
  if constexpr (kCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  // Under a programmatic launch (launch.cuh) the set-up above overlaps the previous kernel's
  // last blocks; global memory (operands, C, bias, the stream-k workspace and its flags) is
  // touched only from here on, so a stream-k piece never waits on a CTA that cannot be placed.
  grid_dependency_wait();
  allow_dependent_launch();

  const int num_clusters = gridDim.x / kCluster;
  const int cluster_id = blockIdx.x / kCluster;

  GEMMT_TRACE(0, 6);
  if (wg == 0) {
    setmaxnreg_dec<40>();
    // The whole first warp walks the producer loop and one elected lane issues: with the
    // loop's control flow uniform, its addresses stay in uniform registers. Run by lane 0
    // alone, every TMA copy went through vector registers, R2UR moves and a loop over the
    // active lanes, about 60 instructions a stage, and the producer issued for about half of
    // the kernel's time instead of waiting for free stages (ncu source samples, 128x168 tile).
    // The warp index is broadcast from lane 0 so that the compiler sees a warp-uniform
    // branch.
    const bool producer = kUniformRoles ? __shfl_sync(0xffffffffu, warp_in_wg, 0) == 0
                                        : (warp_in_wg == 0 && lane == 0);
    if (producer) {
      const bool leader = kUniformRoles ? elect_one() : true;
      if (leader) {
        prefetch_tmap(&tma_a);
        prefetch_tmap(&tma_b);
      }
      int stage = 0;
      uint32_t phase = 0;
      Unit w;
      for (int i = 0; unit_at<kStreamK>(i, p, cluster_id, num_clusters, w); ++i) {
        const int2 origin = tile_origin<kCluster, kBN>(w, rank, p);
        const int m0 = origin.x, n0 = origin.y;
        GEMMT_TRACE(i, 0);
        with_layout<kLayouts>(p, [&](auto a_mn, auto b_mn) {
          constexpr bool kAMn = decltype(a_mn)::value;
          constexpr bool kBMn = decltype(b_mn)::value;
          for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
            // Parity trick: on the first lap the "previous" phase counts as complete.
            mbar_wait(empty_bar(stage), phase ^ 1u);
            if (kb == w.kb_begin) GEMMT_TRACE(i, 1);
            const uint32_t fb = full_bar(stage);
            const int k0 = kb * kBK;
            const uint32_t sa = smem_a + stage * kABytes;
            const uint32_t sb = smem_b + stage * kBBytes;
            if (leader) {
              mbar_arrive_expect_tx(fb, p.stage_tx_bytes);
              if constexpr (!kAMn) {
                tma_load(sa, &tma_a, fb, k0, m0);
              } else {
#pragma unroll
                for (int q = 0; q < kBM / kMnRows; ++q) {
                  tma_load(sa + q * kMnBox, &tma_a, fb, m0 + q * kMnRows, k0);
                }
              }
              if constexpr (!kBMn) {
                if constexpr (kBN == kBNNarrow) {
                  tma_load(sb, &tma_b, fb, k0, n0);  // one box of 64 rows
                  // Wider tiles: two boxes of kBN / 2 rows, one from each CTA of a pair.
                } else if constexpr (kCluster == 1) {
                  const int second = second_b_box<kBN / 2>(n0, p.n);
                  tma_load(sb, &tma_b, fb, k0, n0);
                  tma_load(sb + second * 128, &tma_b, fb, k0, n0 + second);
                } else {
                  const int first = rank == 0 ? 0 : second_b_box<kBN / 2>(n0, p.n);
                  tma_load_multicast(sb + first * 128, &tma_b, fb, k0, n0 + first, 0x3);
                }
              } else {
#pragma unroll
                for (int j = 0; j < kBN / 64; ++j) {
                  if constexpr (kCluster == 1) {
                    tma_load(sb + j * kMnBox, &tma_b, fb, n0 + 64 * j, k0);
                  } else {
                    // Each CTA of the pair fetches its half of the boxes for both.
                    if (j * kCluster / (kBN / 64) == static_cast<int>(rank)) {
                      tma_load_multicast(sb + j * kMnBox, &tma_b, fb, n0 + 64 * j, k0, 0x3);
                    }
                  }
                }
              }
            }  // leader
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
          }
        });
        GEMMT_TRACE(i, 2);
      }
    }
    __syncwarp();
  } else {
    setmaxnreg_inc<232>();
    const int cw = wg - 1;  // cooperative: which 64-row half of each tile this warpgroup owns
    // The same index, per thread, for the epilogue (see wg above).
    const int cw_t = static_cast<int>(threadIdx.x >> 7) - 1;
    // Rows 64.. of the A tile: 8 KB into the stage in both layouts (descriptor units of 16 B).
    constexpr uint32_t kAHalf = (kABytes / 2) >> 4;
    // Hands stage s back to the producer(s): one arrive per warp on each CTA of the cluster.
    auto release = [&](int s) {
      if constexpr (kCluster == 1) {
        if (lane == 0) mbar_arrive_local(empty_bar(s));
      } else {
        if (lane < kCluster) mbar_arrive_cluster(empty_bar(s), lane);
      }
    };
    // 64 rows of C from one block of accumulators: a split-k slice's partial, the staged
    // (TMA) store or the register-to-global one.
    auto store_rows = [&](const float (&a)[Cfg::kAcc], const Unit& w, int row0, int n0) {
      if (p.splits > 1) {
        store_partial_block(p, a, w.split, row0, n0, warp_in_wg, lane);
      } else if (Cfg::kStagedStore && p.tma_store) {
        if constexpr (Cfg::kStagedStore) {
          const uint32_t buf = smem_c + cw_t * Cfg::kCWgBytes;
          if (kARegs && p.c_trans) {
            store_block_tma_transposed(p, &tma_c, a, buf, row0, n0, warp_in_wg, lane, cw_t);
          } else {
            store_block_tma<T, Cfg::kCBoxes>(p, &tma_c, a, buf, row0, n0, warp_in_wg, lane, cw_t);
          }
        }
      } else {
        store_block<T>(p, a, row0, n0, warp_in_wg, lane);
      }
    };
    int stage = 0;
    uint32_t phase = 0;
    auto advance = [&](int n) {  // n stages further round the ring
      stage += n;
      phase ^= static_cast<uint32_t>((stage / kStages) & 1);
      stage %= kStages;
    };
    // Called once k-block kb's group is issued: every group but that one has then finished
    // reading its stage, so the previous stage goes back to the producer.
    auto retire_previous = [&](int kb, int kb_begin, int& prev_stage) {
      if (kb > kb_begin) {
        wgmma_wait<1>();
        release(prev_stage);
      }
      prev_stage = stage;
      advance(1);
    };
    if constexpr (kPingPong) {
      // Each warpgroup owns whole tiles, every other unit of the cluster's sequence, and
      // computes both 64-row halves. The producer fills the ring in unit order, so one
      // warpgroup's tile arrives while the other finishes its own: the tensor cores work
      // on one tile while the other warpgroup stores the previous one.
      // A full barrier is waited on by parity, which cannot tell one lap of the ring from
      // the next: a warpgroup may wait for the stages of its tile only once the other has
      // passed its waits for the tile before (turn_bar), which also keeps the two main
      // loops in order.
      float acc[2][Cfg::kAcc];
      int turn = 0;
      uint32_t turn_phase = 0;
      Unit w;
      for (int i = 0; unit_at<kStreamK>(i, p, cluster_id, num_clusters, w); ++i, turn ^= 1) {
        if (turn != cw) {
          advance(w.kb_end - w.kb_begin);  // the other warpgroup's stages
          continue;
        }
        if (i != 0) {
          mbar_wait(turn_bar(cw), turn_phase);
          turn_phase ^= 1u;
        }
        const int2 origin = tile_origin<kCluster, kBN>(w, rank, p);
        int prev_stage = 0;
        with_layout<kLayouts>(p, [&](auto a_mn, auto b_mn) {
          constexpr bool kAMn = decltype(a_mn)::value;
          constexpr bool kBMn = decltype(b_mn)::value;
          using DA = OperandDesc<kKind, kAMn>;
          using DB = OperandDesc<kKind, kBMn>;
          for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
            mbar_wait(full_bar(stage), phase);
            const uint64_t da = make_desc(smem_a + stage * kABytes, DA::kLbo, 1024);
            const uint64_t db = make_desc(smem_b + stage * kBBytes, DB::kLbo, 1024);
            wgmma_fence();
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
              for (int kk = 0; kk < 4; ++kk) {
                wgmma_step<kKind, kAMn ? 1 : 0, kBMn ? 1 : 0, kBN>(
                    acc[h], da + h * kAHalf + kk * DA::kStep, db + kk * DB::kStep,
                    (kb != w.kb_begin || kk != 0) ? 1u : 0u);
              }
            }
            wgmma_commit();
            retire_previous(kb, w.kb_begin, prev_stage);
          }
        });
        if ((threadIdx.x & 127) == 0) mbar_arrive_local(turn_bar(cw ^ 1));
        wgmma_wait<0>();
        fence_accumulators(acc[0]);
        fence_accumulators(acc[1]);
        if (w.kb_end > w.kb_begin) release(prev_stage);
        store_rows(acc[0], w, origin.x, origin.y);
        store_rows(acc[1], w, origin.x + 64, origin.y);
        fence_accumulators(acc[0]);
        fence_accumulators(acc[1]);
      }
    } else {
      float acc[Cfg::kAcc];
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;
      // Register-sourced A: this thread's four offsets into the stage (see a_fragment_offsets).
      uint32_t a_off[4] = {0, 0, 0, 0};
      if constexpr (kARegs) a_fragment_offsets(cw, warp_in_wg, lane, a_off);
      Unit w;
      bool have = unit_at<kStreamK>(0, p, cluster_id, num_clusters, w);
      for (int i = 0; have; ++i) {
        const int2 origin = tile_origin<kCluster, kBN>(w, rank, p);
        int prev_stage = 0;
        if (p.epi.active && !p.c_trans) prefetch_tile_bias<T, kBN>(p, origin.y);
        if constexpr (kARegs) {
          // The fragments of k-block kb are loaded while the group of kb - 1 still reads its
          // own, so two register sets alternate and the loop runs two k-blocks per trip.
          uint32_t frag0[4][4], frag1[4][4];
          for (int kb2 = w.kb_begin; kb2 < w.kb_end; kb2 += 2) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int kb = kb2 + h;
              if (kb >= w.kb_end) break;
              mbar_wait(full_bar(stage), phase);
              // tf32 reads B K-major only.
              const uint64_t db =
                  make_desc(smem_b + stage * kBBytes, OperandDesc<kKind, false>::kLbo, 1024);
              tf32_rs_kblock<kBN>(acc, h == 0 ? frag0 : frag1, smem_a + stage * kABytes, a_off, db,
                                  kb == w.kb_begin);
              retire_previous(kb, w.kb_begin, prev_stage);
            }
          }
        } else {
          GEMMT_TRACE(i, 0);
          with_layout<kLayouts>(p, [&](auto a_mn, auto b_mn) {
            constexpr bool kAMn = decltype(a_mn)::value;
            constexpr bool kBMn = decltype(b_mn)::value;
            using DA = OperandDesc<kKind, kAMn>;
            using DB = OperandDesc<kKind, kBMn>;
            // On the last column of tiles, only the columns C has (with_tile_width): the same
            // k-blocks on a block kW < kBN columns wide.
            bool trimmed = false;
            if constexpr (kTrims) {
              const int width = sm90::trimmed_tile_width(p.n - origin.y, kBMn, kBN);
              trimmed = width != kBN;
              if (trimmed) {
                with_tile_width<kBMn, kBN>(width, [&](auto width_c) {
                  constexpr int kW = decltype(width_c)::value;
                  if constexpr (kW < kBN) {
                    for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
                      mbar_wait(full_bar(stage), phase);
                      const uint64_t da =
                          make_desc(smem_a + stage * kABytes, DA::kLbo, 1024) + cw * kAHalf;
                      const uint64_t db = make_desc(smem_b + stage * kBBytes, DB::kLbo, 1024);
                      wgmma_fence();
#pragma unroll
                      for (int kk = 0; kk < 4; ++kk) {
                        wgmma_step_trimmed<kKind, kAMn ? 1 : 0, kBMn ? 1 : 0, kW>(
                            acc, da + kk * DA::kStep, db + kk * DB::kStep,
                            (kb != w.kb_begin || kk != 0) ? 1u : 0u);
                      }
                      wgmma_commit();
                      retire_previous(kb, w.kb_begin, prev_stage);
                    }
                  }
                });
              }
            }
            for (int kb = w.kb_begin; !trimmed && kb < w.kb_end; ++kb) {
              mbar_wait(full_bar(stage), phase);
              if (kb == w.kb_begin) GEMMT_TRACE(i, 1);
              if (kb == w.kb_begin + 4) GEMMT_TRACE(i, 5);
              const uint64_t da = make_desc(smem_a + stage * kABytes, DA::kLbo, 1024) + cw * kAHalf;
              const uint64_t db = make_desc(smem_b + stage * kBBytes, DB::kLbo, 1024);
              wgmma_fence();
#pragma unroll
              for (int kk = 0; kk < 4; ++kk) {
                wgmma_step<kKind, kAMn ? 1 : 0, kBMn ? 1 : 0, kBN>(
                    acc, da + kk * DA::kStep, db + kk * DB::kStep,
                    (kb != w.kb_begin || kk != 0) ? 1u : 0u);
              }
              wgmma_commit();
              retire_previous(kb, w.kb_begin, prev_stage);
            }
          });
        }
        GEMMT_TRACE(i, 2);
        // The next unit, found while the last group still runs: its integer divisions
        // (tile_coords) took about 0.3 us between two tiles (phase stamps, H100).
        Unit next;
        const bool have_next = unit_at<kStreamK>(i + 1, p, cluster_id, num_clusters, next);
        wgmma_wait<0>();
        fence_accumulators(acc);
        GEMMT_TRACE(i, 3);
        GEMMT_TRACE_SET_UNIT(i);
        if (w.kb_end > w.kb_begin) release(prev_stage);
        if (kStreamK && w.role == Role::kSkGive) {
          sk_give(p, acc, sk_slot<kCluster>(cluster_id, rank), cw_t);
        } else {
          if (kStreamK && w.role == Role::kSkTake) {
            for_each_giver(p, w, cluster_id, num_clusters,
                           [&](int q) { sk_take(p, acc, sk_slot<kCluster>(q, rank), cw_t); });
          }
          store_rows(acc, w, origin.x + cw_t * 64, origin.y);
        }
        fence_accumulators(acc);
        GEMMT_TRACE(i, 4);
        w = next;
        have = have_next;
      }
    }
    // Shared memory must outlive the last TMA store's reads; global completion before exit.
    if (Cfg::kStagedStore && p.tma_store && (threadIdx.x & 127) == 0) bulk_wait_all();
    GEMMT_TRACE(0, 7);
  }
  // No CTA may leave while its peer can still arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync();
#endif  // GEMMT_SM90_DEVICE_CODE
}

}  // namespace
}  // namespace gemmt
