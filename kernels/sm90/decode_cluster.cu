// Hopper decode GEMM for 1 to 256 tokens: C (m x n) = x (m x k) @ W^T with W (n x k), both
// K-major, bf16 / fp16 (plan: kernels/plan/decode_cluster_plan.h, which says why).
//
// Roles. The weight is wgmma's M operand: a CTA owns 128 rows of W, one 64-row half per
// consumer warpgroup, and all tokens are its N operand (one tile of bn = 64, 128, 192 or 256
// columns, m64n<bn>k16). A producer warp streams K-blocks of 64 elements with TMA: a 16 KB
// box of W and one box of the tokens trimmed to their rows (8-row multiples); stage rows past
// the tokens only feed accumulator columns that are never stored.
//
// Split-K in a cluster. The CTAs of a cluster (cluster dimension x, up to 8) take
// consecutive K ranges of the same 128 rows of W. After the main loop each CTA writes its
// float32 accumulators into its own ring (no TMA is in flight any more), the cluster
// synchronises, and CTA r adds, for the accumulator pairs j / 2 == r (mod cluster), the
// partials of ranks 0, 1, ... in that order from distributed shared memory: a fixed order,
// so the result is deterministic, and each output is written once, by one CTA, with alpha,
// beta and the epilogue. A second cluster barrier keeps every CTA's shared memory alive
// until its peers have read it. One launch, no workspace, no second kernel.
//
// The grid is one wave (the planner sizes the cluster so): one CTA per SM (the ring takes
// about 200 KB), so the K range of a CTA is its whole share of the weight.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "common/shared_memory.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/decode_cluster_plan.h"
#include "sm90/config.cuh"
#include "sm90/ptx.cuh"
#include "sm90/tensor_map.h"

namespace gemmt {
namespace {

namespace dc = decode_cluster;

struct DcParams {
  int n;  // rows of W: output features
  int m;  // tokens
  int kb_per_cta;
  int num_kb;
  uint32_t tx_bytes;  // one stage's TMA bytes: the W box and the token box
  void* c;
  int64_t ldc;
  float alpha, beta;
  EpilogueParams epi;
};

template <int kBN>
struct DcCfg {
  static constexpr int kStages = kBN == 64 ? 8 : kBN == 128 ? 6 : kBN == 192 ? 5 : 4;
  static constexpr int kABytes = dc::kTileRows * 128;
  static constexpr int kBBytes = kBN * 128;
  static constexpr int kAcc = kBN / 2;  // fp32 accumulators per consumer thread
  // The partial sums of a CTA, 128 x kBN float32, reuse the ring.
  static constexpr int kRedBytes = dc::kTileRows * kBN * 4;
  static constexpr int kRingBytes = kStages * (kABytes + kBBytes);
  static_assert(kRedBytes <= kRingBytes, "the partial sums must fit in the ring");
  static_assert(kAcc % 2 == 0, "the reduction moves accumulator pairs");
  static constexpr int kSmemBytes = kRingBytes + 2 * kStages * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the shared memory of one H100 CTA");
};

#if defined(GEMMT_SM90_DEVICE_CODE)
// Two floats at shared-memory address `addr` of CTA `rank` of the cluster.
__device__ __forceinline__ float2 ld_peer_f2(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n"
               : "=f"(v.x), "=f"(v.y)
               : "r"(remote)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_f2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
#endif

template <int kKind, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    decode_cluster_kernel(const __grid_constant__ CUtensorMap tma_w,
                          const __grid_constant__ CUtensorMap tma_x, const DcParams p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using T = typename KindTraits<kKind>::T;
  using Cfg = DcCfg<kBN>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kABytes = Cfg::kABytes;
  constexpr int kBBytes = Cfg::kBBytes;
  constexpr int kAcc = Cfg::kAcc;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Every CTA computes the same offsets, which the DSMEM reads of the reduction rely on.
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_a = base;
  const uint32_t smem_b = base + kStages * kABytes;
  const uint32_t bars = smem_b + kStages * kBBytes;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (kStages + s); };

  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0);
  const int warp_in_wg = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  const uint32_t rank = cluster_ctarank();
  uint32_t csize;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(csize));
  const int tile = static_cast<int>(blockIdx.x / csize);
  const int m0 = tile * dc::kTileRows;
  const int kb_begin = static_cast<int>(rank) * p.kb_per_cta;
  const int kb_end = min(p.num_kb, kb_begin + p.kb_per_cta);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();
  // Under a programmatic launch the set-up above overlaps the previous kernel: global memory
  // only from here on.
  grid_dependency_wait();
  allow_dependent_launch();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (__shfl_sync(0xffffffffu, warp_in_wg, 0) == 0) {
      const bool leader = elect_one();
      if (leader) {
        prefetch_tmap(&tma_w);
        prefetch_tmap(&tma_x);
      }
      int stage = 0;
      uint32_t phase = 0;
      for (int kb = kb_begin; kb < kb_end; ++kb) {
        mbar_wait(empty_bar(stage), phase ^ 1u);
        if (leader) {
          const uint32_t fb = full_bar(stage);
          mbar_arrive_expect_tx(fb, p.tx_bytes);
          tma_load(smem_a + stage * kABytes, &tma_w, fb, kb * dc::kBlockK, m0);
          tma_load(smem_b + stage * kBBytes, &tma_x, fb, kb * dc::kBlockK, 0);
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    __syncwarp();
  } else {
    setmaxnreg_inc<232>();
    const int cw = wg - 1;
    constexpr uint32_t kStep = 32 >> 4;  // a K step: 32 bytes along the 128-byte rows
    constexpr uint32_t kAHalf = (kABytes / 2) >> 4;
    int stage = 0, prev_stage = 0;
    uint32_t phase = 0;
    for (int kb = kb_begin; kb < kb_end; ++kb) {
      mbar_wait(full_bar(stage), phase);
      const uint64_t da = make_desc(smem_a + stage * kABytes, 16, 1024) + cw * kAHalf;
      const uint64_t db = make_desc(smem_b + stage * kBBytes, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_step<kKind, 0, 0, kBN>(acc, da + kk * kStep, db + kk * kStep, 1u);
      }
      wgmma_commit();
      if (kb > kb_begin) {
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive_local(empty_bar(prev_stage));
      }
      prev_stage = stage;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    // Both warpgroups are past their last wgmma and every TMA load has landed (each was
    // waited for): the ring is free for the partial sums.
    named_barrier_sync(1, 256);
    // Layout: [warpgroup][pair j / 2][thread][2], so that a warp's 64-bit stores and loads
    // are contiguous.
    const int t = static_cast<int>(threadIdx.x) - 128;  // 0..255 over both warpgroups
    const int tw = t & 127;
#pragma unroll
    for (int j = 0; j < kAcc; j += 2) {
      st_shared_f2(base + static_cast<uint32_t>(((cw * (kAcc / 2) + j / 2) * 128 + tw) * 8),
                   acc[j], acc[j + 1]);
    }
  }
  cluster_sync();  // every CTA's partial sums are in its shared memory

  if (wg != 0) {
    const int cw = wg - 1;
    const int tw = static_cast<int>(threadIdx.x) & 127;
    // wgmma's accumulator layout: pair j / 2 of thread tw holds rows 16 * warp + lane / 4
    // (+ 8 for odd j / 2) and columns 8 * (j / 4) + 2 * (lane % 4), + 1.
    const int row_base = m0 + cw * 64 + 16 * warp_in_wg + (lane >> 2);
    const int col_base = 2 * (lane & 3);
    T* c = static_cast<T*>(p.c);
    const EpilogueView<T> epi = p.epi.view<T>();
    for (int pair = static_cast<int>(rank); pair < kAcc / 2; pair += static_cast<int>(csize)) {
      const uint32_t addr =
          base + static_cast<uint32_t>(((cw * (kAcc / 2) + pair) * 128 + tw) * 8);
      float2 s = make_float2(0.f, 0.f);
      for (uint32_t q = 0; q < csize; ++q) {
        const float2 v = ld_peer_f2(addr, q);
        s.x += v.x;
        s.y += v.y;
      }
      const int feature = row_base + 8 * (pair & 1);
      const int token = 8 * (pair >> 1) + col_base;
      if (feature >= p.n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int tok = token + h;
        if (tok >= p.m) continue;
        T* dst = c + static_cast<int64_t>(tok) * p.ldc + feature;
        float z = p.alpha * (h == 0 ? s.x : s.y);
        if (p.beta != 0.f) z += p.beta * to_float(*dst);  // beta == 0 never reads C
        if (epi.active) z = epi.template apply<true>(tok, feature, z);
        *dst = from_float<T>(z);
      }
    }
  }
  cluster_sync();  // the peers' shared memory outlives every read of it
#endif  // GEMMT_SM90_DEVICE_CODE
}

// ---- Host side ----------------------------------------------------------------------------

#if defined(GEMMT_HAS_SM90A)
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

// How many clusters of each size (1..8) of this instance can be resident at once.
template <int kKind, int kBN>
cudaError_t active_clusters(int (&active)[dc::kMaxCluster + 1]) {
  for (int cl = 1; cl <= dc::kMaxCluster; ++cl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cl));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = DcCfg<kBN>::kSmemBytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cl);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    auto* kernel = decode_cluster_kernel<kKind, kBN>;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;  // unknown: the planner's estimate
    }
    active[cl] = n;
  }
  return cudaSuccess;
}

template <int kKind, int kBN>
cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
  int device = 0;
  GEMMT_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  // Attribute and occupancy: once per device (cached; the answer depends on the device only).
  static std::mutex mu;
  static bool ready[64] = {};
  static int active[64][dc::kMaxCluster + 1] = {};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!ready[device]) {
      auto* kernel = decode_cluster_kernel<kKind, kBN>;
      GEMMT_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DcCfg<kBN>::kSmemBytes));
      GEMMT_RETURN_IF_ERROR((active_clusters<kKind, kBN>(active[device])));
      ready[device] = true;
    }
  }
  const dc::Plan pl = dc::plan(args, active[device]);
  if (pl.bn != kBN) return cudaErrorNotSupported;

  const int elt = 2;
  const int kind = kKind;
  sm90::MapShape ws, xs;
  const uint32_t x_rows = static_cast<uint32_t>((args.m + 7) / 8 * 8);
  if (!sm90::map_shape(args.k, args.n, args.b_stride_n, elt, dc::kBlockK, dc::kTileRows, &ws) ||
      !sm90::map_shape(args.k, args.m, args.a_stride_m, elt, dc::kBlockK, x_rows, &xs)) {
    return cudaErrorNotSupported;
  }
  CUtensorMap tw, tx;
  std::memset(&tw, 0, sizeof(tw));
  std::memset(&tx, 0, sizeof(tx));
  if (!sm90::encode_map(&tw, args.b, ws, kind) || !sm90::encode_map(&tx, args.a, xs, kind)) {
    return cudaErrorNotSupported;
  }
  DcParams p;
  p.n = static_cast<int>(args.n);
  p.m = static_cast<int>(args.m);
  p.kb_per_cta = pl.kb_per_cta;
  p.num_kb = pl.num_kb;
  p.tx_bytes = static_cast<uint32_t>(DcCfg<kBN>::kABytes) + x_rows * 128u;
  p.c = args.c;
  p.ldc = args.m > 1 ? args.ldc : args.n;
  p.alpha = static_cast<float>(args.alpha);
  p.beta = static_cast<float>(args.beta);
  p.epi = make_epilogue_params(args.epilogue);

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(pl.ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = DcCfg<kBN>::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(pl.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  add_programmatic_launch<decode_cluster_kernel<kKind, kBN>>(cfg, attr);
  auto* kernel = decode_cluster_kernel<kKind, kBN>;
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, tw, tx, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <int kKind>
cudaError_t launch_kind(const GemmArgs& args, cudaStream_t stream) {
  switch (dc::plan(args).bn) {
    case 64:
      return launch<kKind, 64>(args, stream);
    case 128:
      return launch<kKind, 128>(args, stream);
    case 192:
      return launch<kKind, 192>(args, stream);
    default:
      return launch<kKind, 256>(args, stream);
  }
}

}  // namespace

bool gemm_decode_cluster_supports(const GemmArgs& args) {
  return kBuilt && dc::supports(args);
}

bool gemm_decode_cluster_wanted(const GemmArgs& args) {
  return kBuilt && dc::wanted(args);
}

cudaError_t gemm_decode_cluster_run(const GemmArgs& args, cudaStream_t stream) {
  if (!gemm_decode_cluster_supports(args)) return cudaErrorNotSupported;
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (args.dtype == ScalarType::kBFloat16) return launch_kind<kBF16>(args, stream);
  return launch_kind<kF16>(args, stream);
}

}  // namespace gemmt
