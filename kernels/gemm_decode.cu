// Decode-sized products: C (m x n) = A (m x k) @ B (k x n) for m <= 64, both operands
// K-major, bf16 / fp16 on tensor cores. In a Linear layer's decode step A is the few tokens'
// activations and B = W.T, so the product streams the whole weight matrix once while the
// arithmetic is small: its time is the weight's bytes over the memory bandwidth, and the
// kernel is built to keep enough of W in flight to reach it.
//
// Roles. mma.sync m16n8k16 takes W as the 16-row operand (16 output features) and the
// tokens as the 8-column operand, so one warp covers 16 features x 8 * kTiles tokens. The
// operands are read straight from global memory into the mma fragment registers, with no
// shared memory: within each 32-element slice of K a thread loads 16 contiguous bytes of a
// W row (at 8 * (lane % 4)) and the same 16 bytes of a token's row, and the order in which
// the 32 products of the slice are summed is permuted consistently for both operands (the
// sum does not depend on it). Each W byte is loaded once, streamed past L1
// (L1::no_allocate) with a 256-byte L2 prefetch; token rows are small and reused by every
// warp, so they come through L1.
//
// Work split. A CTA is 8 warps over 16 * kRowWarps features; the 8 / kRowWarps warps that
// share features split the CTA's K range by alternating slices. K is further split across
// a thread-block cluster of up to 8 CTAs (sm_90) so that even a 4096-row W occupies every
// SM. The partial sums meet in shared memory: warps of one CTA through their own, the CTAs
// of a cluster through distributed shared memory, added in a fixed order, so the result is
// deterministic and the product is a single launch with no workspace. Rank 0 applies the
// epilogue (alpha, beta, bias, activation) and writes C.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "gemmt/activation.h"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/decode_plan.h"

namespace gemmt {
namespace {

// The shape constants and the plan: kernels/plan/decode_plan.h.
using decode::DecodePlan;
using decode::kMaxCluster;
using decode::kMaxTokens;
using decode::kSliceK;
using decode::kWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kInFlight = 4;  // slices of W a warp keeps loading ahead of the mmas

struct DecodeParams {
  int m, n, k;
  const void* a;  // tokens: m rows, row stride lda, K contiguous
  int64_t lda;
  const void* b;  // weights: n rows of K (B^T), row stride ldb
  int64_t ldb;
  void* c;
  int64_t ldc;
  float alpha, beta;
  const void* bias;  // n values (one per column of C)
  Activation act;
  void* preact;
  int64_t ld_preact;
  int slices_per_cta;  // K slices of one CTA (the last CTA of a cluster may have fewer)
  int cluster;         // CTAs along K
};

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __nv_bfloat16*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __half*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes of W, read once: past L1, with the next 256 bytes of the row prefetched into L2.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes of a token row, reused by every warp of the CTA: through L1.
__device__ __forceinline__ uint4 load_reused(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// Cluster primitives; the planner asks for clusters only on sm_90, so other targets never
// reach them (and compile them out).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

__device__ __forceinline__ void cluster_barrier() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
#endif
}

// Four floats at the same shared-memory offset in CTA `rank` of the cluster.
__device__ __forceinline__ float4 load_peer(const float* local, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#else
  (void)local;
  (void)rank;
#endif
  return v;
}

// The two W rows (g and g + 8 of the warp's 16) of one K slice: this lane's 16 bytes each.
struct WSlice {
  uint4 lo, hi;
};

template <typename T>
__device__ __forceinline__ WSlice load_w(const DecodeParams& p, int row, int64_t kk) {
  WSlice s{make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (kk < p.k) {
    const T* w = static_cast<const T*>(p.b);
    if (row < p.n) s.lo = load_stream(w + static_cast<int64_t>(row) * p.ldb + kk);
    if (row + 8 < p.n) s.hi = load_stream(w + static_cast<int64_t>(row + 8) * p.ldb + kk);
  }
  return s;
}

// All token tiles' products with one W slice. The A fragment of the first k16 half takes
// W bytes 0-7 of each row, the second half bytes 8-15; each token's 16 bytes split the same
// way, which is the consistent permutation of K described at the top.
template <typename T, int kTiles>
__device__ __forceinline__ void mma_slice(const DecodeParams& p, const WSlice& w, int64_t kk, int g,
                                          float (&acc)[kTiles][4]) {
  const uint32_t a0[4] = {w.lo.x, w.hi.x, w.lo.y, w.hi.y};
  const uint32_t a1[4] = {w.lo.z, w.hi.z, w.lo.w, w.hi.w};
  const T* x = static_cast<const T*>(p.a);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int token = 8 * t + g;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (token < p.m && kk < p.k) xv = load_reused(x + static_cast<int64_t>(token) * p.lda + kk);
    mma_16816(acc[t], a0, xv.x, xv.y, static_cast<T*>(nullptr));
    mma_16816(acc[t], a1, xv.z, xv.w, static_cast<T*>(nullptr));
  }
}

// C[token][row] for the accumulator acc[t][i]: row g (+8 for i >= 2) of the warp's 16,
// token 8t + 2q (+1 for odd i).
template <typename T, int kTiles>
__device__ __forceinline__ void store_outputs(const DecodeParams& p, const float (&acc)[kTiles][4],
                                              int row0, int g, int q) {
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(p.bias);
  T* preact = static_cast<T*>(p.preact);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + g + 8 * (i >> 1);
      const int token = 8 * t + 2 * q + (i & 1);
      if (row >= p.n || token >= p.m) continue;
      T* dst = c + static_cast<int64_t>(token) * p.ldc + row;
      float v = p.alpha * acc[t][i];
      if (p.beta != 0.f) v += p.beta * to_float(*dst);  // beta == 0 never reads C
      if (bias != nullptr) v += to_float(bias[row]);
      if (preact != nullptr)
        preact[static_cast<int64_t>(token) * p.ld_preact + row] = from_float<T>(v);
      *dst = from_float<T>(apply_activation(p.act, v));
    }
  }
}

template <typename T, int kTiles, int kRowWarps>
__global__ void __launch_bounds__(kThreads) gemm_decode_kernel(const DecodeParams p) {
  constexpr int kKWarps = kWarps / kRowWarps;
  // Partial sums of each warp, laid out by (K warp, row warp, tile, lane) so that a lane reads
  // exactly the values of its own fragment positions, in this CTA and in its peers.
  __shared__ __align__(16) float partial[kWarps * kTiles * 128];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int row_warp = warp % kRowWarps, k_warp = warp / kRowWarps;
  const int rank = p.cluster > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int cta_rows = blockIdx.x / p.cluster;
  const int row0 = (cta_rows * kRowWarps + row_warp) * 16;

  // A programmatic launch (gemmt/launch.cuh) may place this block before the previous kernel
  // has finished: no global access above this line.
  grid_dependency_wait();
  allow_dependent_launch();

  const int total_slices = (p.k + kSliceK - 1) / kSliceK;
  const int first = rank * p.slices_per_cta;
  const int last = min(total_slices, first + p.slices_per_cta);

  float acc[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

  // This warp's slices: first + k_warp, then every kKWarps-th. kInFlight of them are loaded
  // ahead; each slot is refilled with the slice kInFlight steps later once it is used.
  const int step = kKWarps;
  auto slice_k = [&](int s) { return static_cast<int64_t>(s) * kSliceK + 8 * q; };
  WSlice ring[kInFlight];
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) {
    const int s = first + k_warp + u * step;
    ring[u] = s < last ? load_w<T>(p, row0 + g, slice_k(s)) : WSlice{};
  }
  for (int s0 = first + k_warp; s0 < last; s0 += kInFlight * step) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int s = s0 + u * step;
      if (s < last) {
        mma_slice<T, kTiles>(p, ring[u], slice_k(s), g, acc);
        const int next = s + kInFlight * step;
        ring[u] = next < last ? load_w<T>(p, row0 + g, slice_k(next)) : WSlice{};
      }
    }
  }

  if (kKWarps > 1 || p.cluster > 1) {
    float* mine = partial + ((k_warp * kRowWarps + row_warp) * kTiles) * 128 + lane * 4;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      *reinterpret_cast<float4*>(mine + t * 128) =
          make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    }
    __syncthreads();
    if (k_warp == 0) {
      // The CTA's sum, K warps in order; left in the slot of K warp 0 for the peers.
#pragma unroll
      for (int kw = 1; kw < kKWarps; ++kw) {
        const float* other = partial + ((kw * kRowWarps + row_warp) * kTiles) * 128 + lane * 4;
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const float4 v = *reinterpret_cast<const float4*>(other + t * 128);
          acc[t][0] += v.x;
          acc[t][1] += v.y;
          acc[t][2] += v.z;
          acc[t][3] += v.w;
        }
      }
      if (kKWarps > 1 && p.cluster > 1) {
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          *reinterpret_cast<float4*>(mine + t * 128) =
              make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        }
      }
    }
    if (p.cluster > 1) {
      cluster_barrier();  // every CTA's sum is in its shared memory
      if (rank == 0 && k_warp == 0) {
        for (int r = 1; r < p.cluster; ++r) {
#pragma unroll
          for (int t = 0; t < kTiles; ++t) {
            const float4 v = load_peer(mine + t * 128, static_cast<uint32_t>(r));
            acc[t][0] += v.x;
            acc[t][1] += v.y;
            acc[t][2] += v.z;
            acc[t][3] += v.w;
          }
        }
      }
      cluster_barrier();  // the peers' shared memory outlives rank 0's reads
    }
  }
  if (rank == 0 && k_warp == 0) store_outputs<T, kTiles>(p, acc, row0, g, q);
}

// ---- Host side ----------------------------------------------------------------------------

template <typename T, int kTiles, int kRowWarps>
cudaError_t launch_decode(const DecodeParams& p, int ctas, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = p.cluster > 1 ? 1 : 0;
  add_programmatic_launch<gemm_decode_kernel<T, kTiles, kRowWarps>>(cfg, attr);
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, gemm_decode_kernel<T, kTiles, kRowWarps>, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <typename T, int kTiles>
cudaError_t launch_rows(const DecodePlan& pl, const DecodeParams& p, cudaStream_t stream) {
  switch (pl.row_warps) {
    case 8:
      return launch_decode<T, kTiles, 8>(p, pl.ctas, stream);
    case 4:
      return launch_decode<T, kTiles, 4>(p, pl.ctas, stream);
    default:
      return launch_decode<T, kTiles, 2>(p, pl.ctas, stream);
  }
}

template <typename T>
cudaError_t launch_typed(const DecodePlan& pl, const DecodeParams& p, cudaStream_t stream) {
  switch (pl.tiles) {
    case 1:
      return launch_rows<T, 1>(pl, p, stream);
    case 2:
      return launch_rows<T, 2>(pl, p, stream);
    case 4:
      return launch_rows<T, 4>(pl, p, stream);
    default:
      return launch_rows<T, 8>(pl, p, stream);
  }
}

}  // namespace

bool gemm_decode_supports(const GemmArgs& args) {
  return decode::decode_supports(args);
}

cudaError_t gemm_decode_run(const GemmArgs& args, cudaStream_t stream) {
  if (!decode::decode_supports(args)) return cudaErrorNotSupported;
  const DecodePlan pl = decode::plan_decode(args);
  DecodeParams p;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.a = args.a;
  p.lda = args.a_stride_m;
  p.b = args.b;
  p.ldb = args.b_stride_n;
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.bias = args.epilogue.bias;
  p.act = args.epilogue.activation;
  p.preact = args.epilogue.preact;
  p.ld_preact = args.epilogue.ld_preact;
  p.slices_per_cta = pl.slices_per_cta;
  p.cluster = pl.cluster;
  if (args.dtype == ScalarType::kBFloat16) return launch_typed<__nv_bfloat16>(pl, p, stream);
  return launch_typed<__half>(pl, p, stream);
}

}  // namespace gemmt
