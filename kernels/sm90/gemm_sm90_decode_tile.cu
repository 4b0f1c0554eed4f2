// Batched decode on Hopper: C (m tokens x n features) = epilogue(alpha * X W^T + beta * C) for
// up to 256 tokens against a 16-bit weight that streams from DRAM (planned by
// kernels/plan/decode_tile_plan.cpp).
//
// Why a kernel of its own: the dense kernel's tiles are 128 rows high, so a few thousand
// weight rows make too few of them to keep every SM streaming; it then re-reads the weight for
// each 128 tokens (the narrow tile) or splits K and pays a reduction pass. Here a CTA computes
// 64 weight rows by a share of the tokens (one wgmma M by N = the share), so that a
// 3584-row weight at 136 tokens is 112 CTAs without a split of K. The operand a CTA shares
// with its neighbours is multicast inside a cluster of up to 4 x 2 CTAs: the token rows across
// the feature tiles of a cluster row, the weight rows across the token tiles of a cluster
// column. Each CTA fetches its part and TMA writes it into every CTA that reads it, so L2
// delivers each byte once a cluster.
//
// CTA: four consumer warps (one warpgroup: wgmma from shared memory, a ring of up to 16
// stages) and one producer warp whose elected lane issues the TMA loads. A stage is refilled
// once the consumers of every CTA of the cluster have released it (each consumer warp
// arrives on the empty barrier of each CTA). The epilogue stages the accumulators in the
// ring, which is free once the last stage has been read, and writes each token's 64 features
// as 16-byte stores, with alpha, beta, the bias, the activation and the pre-activation output.
// The last feature (token) tile moves back to end at n (m), so that no TMA box crosses an
// operand's end; it stores only the rows that are its own.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "common/shared_memory.cuh"
#include "gemmt/arith.h"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/decode_tile_plan.h"
#include "sm90/config.cuh"
#include "sm90/ptx.cuh"
#include "sm90/tensor_map.h"

namespace gemmt {
namespace {

using decode_tile::kEpiloguePitch;
using decode_tile::kFeatures;
using decode_tile::kMaxStages;
using decode_tile::kStageABytes;

// Two consumer warpgroups that take alternate k-blocks into their own accumulators: one
// warpgroup's wgmma groups all write the same accumulators, so they run one after another,
// and a 64 x 72 x 64 k-block then took longer than its bytes took to arrive (one warpgroup
// streamed 0.75 of the old narrow tile's rate, which has two).
constexpr int kDtConsumerThreads = 256;
constexpr int kDtThreads = kDtConsumerThreads + 32;  // and the producer warp

struct DecodeTileParams {
  int m, n, num_kb;
  int step;  // tokens a token tile stores
  int cx, cy;
  int feature_clusters;  // clusters along the features
  int b_box;             // token rows each CTA of a cluster row loads for all of them
  int stages;
  uint32_t stage_bytes;
  uint32_t tx_bytes;  // what a stage receives from the cluster's loads
  int hint;           // experiment: 1 weights evict_first, 2 and tokens evict_last
  void* c;
  int64_t ldc;
  float alpha, beta;
  EpilogueParams epi;
};

#if defined(GEMMT_SM90_DEVICE_CODE)

// Eight features of one token: alpha, beta, the epilogue, the rounding; one 16-byte store
// when all eight are this tile's and aligned, else one store per feature of the tile.
template <typename T>
__device__ __forceinline__ void store_features(const DecodeTileParams& p, const float (&v)[8],
                                               int t, int f, int f_start, int f_end) {
  T* row = static_cast<T*>(p.c) + static_cast<int64_t>(t) * p.ldc;
  const EpilogueView<T> epi = p.epi.view<T>();
  T out[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int fe = f + e;
    if (fe < f_start || fe >= f_end) continue;
    float z = p.alpha * v[e];
    if (p.beta != 0.f) z += p.beta * to_float(row[fe]);  // beta == 0 never reads C
    if (epi.active) z = epi.template apply<true>(t, fe, z);
    out[e] = from_float<T>(z);
  }
  if (f >= f_start && f + 8 <= f_end && is_aligned(row + f, 16)) {
    *reinterpret_cast<uint4*>(row + f) = *reinterpret_cast<const uint4*>(out);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (f + e >= f_start && f + e < f_end) row[f + e] = out[e];
    }
  }
}

#endif  // GEMMT_SM90_DEVICE_CODE

template <int kKind, int kWidth>
__global__ void __launch_bounds__(kDtThreads, 1)
    decode_tile_kernel(const __grid_constant__ CUtensorMap tma_w,
                       const __grid_constant__ CUtensorMap tma_x, const DecodeTileParams p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using T = typename KindTraits<kKind>::T;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + static_cast<uint32_t>(p.stages) * p.stage_bytes;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (kMaxStages + s); };

  const int csize = p.cx * p.cy;
  const int rank = csize > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  const int rx = rank % p.cx, ry = rank / p.cx;
  const int cid = static_cast<int>(blockIdx.x) / csize;
  const int f_start = ((cid % p.feature_clusters) * p.cx + rx) * kFeatures;
  const int t_start = ((cid / p.feature_clusters) * p.cy + ry) * p.step;
  const int f0 = min(f_start, max(p.n - kFeatures, 0));
  const int t0 = min(t_start, max(p.m - p.step, 0));
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  const int lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), 4 * csize);
    }
    fence_barrier_init();
  }
  // Peers multicast into this ring and arrive on its barriers only once they exist.
  if (csize > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  grid_dependency_wait();
  allow_dependent_launch();

  if (warp == 8) {
    if (elect_one()) {
      prefetch_tmap(&tma_w);
      prefetch_tmap(&tma_x);
      // Weight rows go to the CTAs of this cluster column, token rows to those of this row.
      const int a_rows = kFeatures / p.cy;
      uint16_t a_mask = 0, b_mask = 0;
      for (int y = 0; y < p.cy; ++y) a_mask |= static_cast<uint16_t>(1u << (rx + y * p.cx));
      for (int x = 0; x < p.cx; ++x) b_mask |= static_cast<uint16_t>(1u << (x + ry * p.cx));
      const uint64_t pol_w = l2_policy_evict_first(), pol_x = l2_policy_evict_last();
      int stage = 0;
      uint32_t phase = 0;
      for (int kb = 0; kb < p.num_kb; ++kb) {
        mbar_wait(empty_bar(stage), phase ^ 1u);  // the first lap passes at once
        const uint32_t fb = full_bar(stage);
        const uint32_t sa = base + static_cast<uint32_t>(stage) * p.stage_bytes;
        const uint32_t sb = sa + kStageABytes;
        const int k0 = kb * 64;
        mbar_arrive_expect_tx(fb, p.tx_bytes);
        if (p.hint == 0) {
          if (p.cy == 1) {
            tma_load(sa, &tma_w, fb, k0, f0);
          } else {
            tma_load_multicast(sa + ry * a_rows * 128, &tma_w, fb, k0, f0 + ry * a_rows, a_mask);
          }
        } else {
          if (p.cy == 1) {
            tma_load_hint(sa, &tma_w, fb, k0, f0, pol_w);
          } else {
            tma_load_multicast_hint(sa + ry * a_rows * 128, &tma_w, fb, k0, f0 + ry * a_rows,
                                    a_mask, pol_w);
          }
        }
        if (p.hint < 2) {
          if (p.cx == 1) {
            tma_load(sb, &tma_x, fb, k0, t0);
          } else {
            tma_load_multicast(sb + rx * p.b_box * 128, &tma_x, fb, k0, t0 + rx * p.b_box, b_mask);
          }
        } else {
          if (p.cx == 1) {
            tma_load_hint(sb, &tma_x, fb, k0, t0, pol_x);
          } else {
            tma_load_multicast_hint(sb + rx * p.b_box * 128, &tma_x, fb, k0, t0 + rx * p.b_box,
                                    b_mask, pol_x);
          }
        }
        if (++stage == p.stages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    __syncwarp();
  } else {
    const int cw = warp >> 2;  // this warpgroup's k-blocks: cw, cw + 2, ...
    const int wq = warp & 3;
    float acc[kWidth / 2];
#pragma unroll
    for (int i = 0; i < kWidth / 2; ++i) acc[i] = 0.f;
    auto release = [&](int s) {
      if (csize == 1) {
        if (lane == 0) mbar_arrive_local(empty_bar(s));
      } else if (lane < csize) {
        mbar_arrive_cluster(empty_bar(s), lane);
      }
    };
    int prev = -1;
    for (int kb = cw; kb < p.num_kb; kb += 2) {
      const int stage = kb % p.stages;
      mbar_wait(full_bar(stage), static_cast<uint32_t>((kb / p.stages) & 1));
      const uint32_t sa = base + static_cast<uint32_t>(stage) * p.stage_bytes;
      const uint64_t da = make_desc(sa, 16, 1024);
      const uint64_t db = make_desc(sa + kStageABytes, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        // A k-step of 16 advances 32 bytes along both operands' K-major rows.
        wgmma_step_trimmed<kKind, 0, 0, kWidth>(acc, da + 2 * kk, db + 2 * kk, 1u);
      }
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        release(prev);
      }
      prev = stage;
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (prev >= 0) release(prev);

    // Every stage sent to this CTA has been read once both warpgroups are here: the ring
    // holds each warpgroup's accumulators now, token-major (kEpiloguePitch floats a token:
    // conflict-free writes), and the stores add the two.
    named_barrier_sync(1, kDtConsumerThreads);
    float* staged = reinterpret_cast<float*>(smem_raw + (base - raw));
    constexpr int kHalf = kWidth * kEpiloguePitch;
#pragma unroll
    for (int i = 0; i < kWidth / 2; ++i) {
      const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
      const int row = 16 * wq + (lane >> 2) + 8 * ((i >> 1) & 1);
      staged[cw * kHalf + col * kEpiloguePitch + row] = acc[i];
    }
    named_barrier_sync(1, kDtConsumerThreads);
    const int t_end = min(t_start + p.step, p.m);
    const int f_end = min(f_start + kFeatures, p.n);
    for (int item = threadIdx.x; item < kWidth * 8; item += kDtConsumerThreads) {
      const int col = item >> 3, q = item & 7;
      const int t = t0 + col;
      if (t < t_start || t >= t_end) continue;
      const float4* s0 = reinterpret_cast<const float4*>(staged + col * kEpiloguePitch + 8 * q);
      const float4* s1 =
          reinterpret_cast<const float4*>(staged + kHalf + col * kEpiloguePitch + 8 * q);
      const float4 a0 = s0[0], a1 = s0[1], b0 = s1[0], b1 = s1[1];
      const float v[8] = {a0.x + b0.x, a0.y + b0.y, a0.z + b0.z, a0.w + b0.w,
                          a1.x + b1.x, a1.y + b1.y, a1.z + b1.z, a1.w + b1.w};
      store_features<T>(p, v, t, f0 + 8 * q, f_start, f_end);
    }
  }
  // No CTA may leave while a peer can still multicast into it or arrive on its barriers.
  if (csize > 1) cluster_sync();
#endif  // GEMMT_SM90_DEVICE_CODE
}

#if defined(GEMMT_HAS_SM90A)
constexpr bool kDecodeTileBuilt = true;
#else
constexpr bool kDecodeTileBuilt = false;
#endif

template <int kKind, int kWidth>
cudaError_t launch_width(const decode_tile::Plan& pl, const CUtensorMap& w, const CUtensorMap& x,
                         const DecodeTileParams& p, cudaStream_t stream) {
  constexpr auto kernel = decode_tile_kernel<kKind, kWidth>;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(pl.smem_bytes));
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg =
      cluster_launch_config(dim3(static_cast<unsigned>(pl.grid)), dim3(kDtThreads), pl.smem_bytes,
                            stream, pl.cx * pl.cy, attr);
  add_programmatic_launch<kernel>(cfg, attr);
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, w, x, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

// The instance of the plan's width: 16, 32, ... 192, then 256 (decode_tile::kMaxWidth).
template <int kKind, int kWidth = 16>
cudaError_t launch_planned(const decode_tile::Plan& pl, const CUtensorMap& w, const CUtensorMap& x,
                           const DecodeTileParams& p, cudaStream_t stream) {
  if (pl.width == kWidth) return launch_width<kKind, kWidth>(pl, w, x, p, stream);
  if constexpr (kWidth == 192) {
    return pl.width == 256 ? launch_width<kKind, 256>(pl, w, x, p, stream) : cudaErrorNotSupported;
  } else {
    return launch_planned<kKind, kWidth + 16>(pl, w, x, p, stream);
  }
}

}  // namespace

bool gemm_sm90_decode_supports(const GemmArgs& args) {
  return kDecodeTileBuilt && decode_tile::plan(args).ok();
}

cudaError_t gemm_sm90_decode_run(const GemmArgs& args, cudaStream_t stream) {
  const decode_tile::Plan pl = decode_tile::plan(args);
  if (!kDecodeTileBuilt || !pl.ok()) return cudaErrorNotSupported;
  const int kind = args.dtype == ScalarType::kBFloat16 ? kBF16 : kF16;
  // The weight is B^T (n rows of k), the tokens A (m rows of k); both K-major.
  sm90::MapShape ws, xs;
  if (!sm90::map_shape(args.k, args.n, args.b_stride_n, 2, 64, kFeatures / pl.cy, &ws) ||
      !sm90::map_shape(args.k, args.m, args.a_stride_m, 2, 64, pl.b_box, &xs)) {
    return cudaErrorNotSupported;
  }
  CUtensorMap wmap, xmap;
  std::memset(&wmap, 0, sizeof(wmap));
  std::memset(&xmap, 0, sizeof(xmap));
  if (!sm90::encode_map(&wmap, args.b, ws, kind) || !sm90::encode_map(&xmap, args.a, xs, kind)) {
    return cudaErrorNotSupported;
  }
  DecodeTileParams p;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.num_kb = static_cast<int>((args.k + 63) / 64);
  p.step = pl.step;
  p.cx = pl.cx;
  p.cy = pl.cy;
  p.feature_clusters = pl.feature_tiles / pl.cx;
  p.b_box = pl.b_box;
  p.stages = pl.stages;
  p.stage_bytes = static_cast<uint32_t>(kStageABytes + pl.b_rows * 128);
  p.tx_bytes = static_cast<uint32_t>(kStageABytes + pl.cx * pl.b_box * 128);
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = static_cast<float>(args.alpha);
  p.beta = static_cast<float>(args.beta);
  p.epi = make_epilogue_params(args.epilogue);
  p.hint = 0;
  if (const char* e = std::getenv("GEMMT_DT_FORCE")) {
    int v[6] = {0, 0, 0, 0, 0, 0};
    std::sscanf(e, "%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
    p.hint = v[5];
  }
  return kind == kBF16 ? launch_planned<kBF16>(pl, wmap, xmap, p, stream)
                       : launch_planned<kF16>(pl, wmap, xmap, p, stream);
}

}  // namespace gemmt
