// The decode kernels' shared body: products of m <= 64 tokens (K-major, m x k) with a weight
// W (n x k, K-major, used as B = W^T), whose time is W's bytes over the memory bandwidth.
// Two element families use it: bf16 / fp16 (kernels/gemm_decode.cu) and float8
// (kernels/fp8/scaled_decode_fp8.cu). What differs between them (the tensor-core step of one
// K slice and the epilogue) is an "Op" policy; the streaming of W, the work split and the
// deterministic reduction are here, once.
//
// Roles. mma.sync takes W as the 16-row operand (16 output features) and the tokens as the
// 8-column operand, so one warp covers 16 features x 8 * kTiles tokens. The operands are read
// straight from global memory into registers, with no shared memory: within each slice of K
// (64 bytes of a W row: 32 bf16 or 64 float8 elements) a thread loads 16 contiguous bytes of
// a W row (at byte 16 * (lane % 4)) and the same 16 bytes of a token's row; the Op sums
// their products in an order permuted consistently for both operands (the sum does not
// depend on it). Each W byte is loaded once, streamed past L1 (L1::no_allocate) with a
// 256-byte L2 prefetch; token rows are small and reused by every warp, so they come through
// L1.
//
// Work split. A CTA is 8 warps over 16 * kRowWarps features; the 8 / kRowWarps warps that
// share features split the CTA's K range by alternating slices. K is further split across
// a thread-block cluster of up to 8 CTAs (sm_90) so that even a 4096-row W occupies every
// SM. The partial sums meet in shared memory: warps of one CTA through their own, the CTAs
// of a cluster through distributed shared memory, added in a fixed order, so the result is
// deterministic and the product is a single launch with no workspace. Rank 0 applies the
// Op's epilogue and writes C.
//
// An Op provides:
//   Elem                    the element type of W and of the tokens (its size sets the
//                           slice's element count: kSliceBytes / sizeof(Elem));
//   Params                  the kernel's argument, with a DecodeCore member `core`;
//   min_blocks(kTiles)      CTAs per SM the registers must allow (__launch_bounds__; 0
//                           asks for none);
//   in_flight(kTiles)       slices of W a warp keeps loading ahead of its mmas;
//   slice<kTiles>(p, w, kk, row, g, q, acc)
//                           adds the products of the lane's W piece `w` (rows `row` and
//                           row + 8, from element kk) with every token tile's piece at kk;
//   store<kTiles>(p, acc, row0, g, q)
//                           the epilogue of the summed accumulators (fragment layout of
//                           mma's D: row g (+8 for i >= 2), token 8t + 2q (+1 for odd i)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cluster.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "plan/decode_plan.h"

namespace gemmt {
namespace decode {

constexpr int kThreads = 32 * kWarps;
constexpr int kInFlight = 4;     // slices of W a warp keeps loading ahead (the usual choice)
constexpr int kPieceBytes = 16;  // one lane's bytes of a W row (or token row) per slice
static_assert(4 * kPieceBytes == kSliceBytes, "four lanes cover a slice of a row");
static_assert(kSliceK * 2 == kSliceBytes, "the 16-bit slice is 64 bytes");

// The operands and the split; every Op's Params holds one.
struct DecodeCore {
  int m, n, k;
  const void* a;  // tokens: m rows, row stride lda (elements), K contiguous
  int64_t lda;
  const void* b;  // weights: n rows of K (B^T), row stride ldb (elements)
  int64_t ldb;
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

// The two W rows (g and g + 8 of the warp's 16) of one K slice: this lane's 16 bytes each.
struct WSlice {
  uint4 lo, hi;
};

template <typename Elem>
__device__ __forceinline__ WSlice load_w(const DecodeCore& d, int row, int64_t kk) {
  WSlice s{make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (kk < d.k) {
    const Elem* w = static_cast<const Elem*>(d.b);
    if (row < d.n) s.lo = load_stream(w + static_cast<int64_t>(row) * d.ldb + kk);
    if (row + 8 < d.n) s.hi = load_stream(w + static_cast<int64_t>(row + 8) * d.ldb + kk);
  }
  return s;
}

// The lane's 16 bytes of `token`'s row at element kk; zeros past the tokens or past K.
template <typename Elem>
__device__ __forceinline__ uint4 load_token(const DecodeCore& d, int token, int64_t kk) {
  if (token >= d.m || kk >= d.k) return make_uint4(0, 0, 0, 0);
  const Elem* x = static_cast<const Elem*>(d.a);
  return load_reused(x + static_cast<int64_t>(token) * d.lda + kk);
}

template <typename Op, int kTiles, int kRowWarps>
__global__ void __launch_bounds__(kThreads, Op::min_blocks(kTiles))
    decode_kernel(const typename Op::Params p) {
  using Elem = typename Op::Elem;
  constexpr int kPiece = kPieceBytes / static_cast<int>(sizeof(Elem));  // elements a lane loads
  constexpr int kSlice = 4 * kPiece;
  constexpr int kKWarps = kWarps / kRowWarps;
  constexpr int kFlight = Op::in_flight(kTiles);
  // Partial sums of each warp, laid out by (K warp, row warp, tile, lane) so that a lane reads
  // exactly the values of its own fragment positions, in this CTA and in its peers.
  __shared__ __align__(16) float partial[kWarps * kTiles * 128];

  const DecodeCore& d = p.core;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int row_warp = warp % kRowWarps, k_warp = warp / kRowWarps;
  const int rank = d.cluster > 1 ? static_cast<int>(cluster::rank()) : 0;
  const int cta_rows = blockIdx.x / d.cluster;
  const int row0 = (cta_rows * kRowWarps + row_warp) * 16;

  // A programmatic launch (gemmt/launch.cuh) may place this block before the previous kernel
  // has finished: no global access above this line.
  grid_dependency_wait();
  allow_dependent_launch();

  const int total_slices = (d.k + kSlice - 1) / kSlice;
  const int first = rank * d.slices_per_cta;
  const int last = min(total_slices, first + d.slices_per_cta);

  float acc[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

  // This warp's slices: first + k_warp, then every kKWarps-th. kFlight of them are loaded
  // ahead; each slot is refilled with the slice kFlight steps later once it is used.
  const int step = kKWarps;
  auto slice_k = [&](int s) { return static_cast<int64_t>(s) * kSlice + kPiece * q; };
  WSlice ring[kFlight];
#pragma unroll
  for (int u = 0; u < kFlight; ++u) {
    const int s = first + k_warp + u * step;
    ring[u] = s < last ? load_w<Elem>(d, row0 + g, slice_k(s)) : WSlice{};
  }
  for (int s0 = first + k_warp; s0 < last; s0 += kFlight * step) {
#pragma unroll
    for (int u = 0; u < kFlight; ++u) {
      const int s = s0 + u * step;
      if (s < last) {
        Op::template slice<kTiles>(p, ring[u], slice_k(s), row0 + g, g, q, acc);
        const int next = s + kFlight * step;
        ring[u] = next < last ? load_w<Elem>(d, row0 + g, slice_k(next)) : WSlice{};
      }
    }
  }

  if (kKWarps > 1 || d.cluster > 1) {
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
      if (kKWarps > 1 && d.cluster > 1) {
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          *reinterpret_cast<float4*>(mine + t * 128) =
              make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        }
      }
    }
    if (d.cluster > 1) {
      cluster::barrier();  // every CTA's sum is in its shared memory
      if (rank == 0 && k_warp == 0) {
        for (int r = 1; r < d.cluster; ++r) {
#pragma unroll
          for (int t = 0; t < kTiles; ++t) {
            const float4 v = cluster::load_peer(mine + t * 128, static_cast<uint32_t>(r));
            acc[t][0] += v.x;
            acc[t][1] += v.y;
            acc[t][2] += v.z;
            acc[t][3] += v.w;
          }
        }
      }
      cluster::barrier();  // the peers' shared memory outlives rank 0's reads
    }
  }
  if (rank == 0 && k_warp == 0) Op::template store<kTiles>(p, acc, row0, g, q);
}

// ---- Host side ----------------------------------------------------------------------------

template <typename Op, int kTiles, int kRowWarps>
cudaError_t launch_instance(const typename Op::Params& p, int ctas, cudaStream_t stream) {
  constexpr auto kernel = decode_kernel<Op, kTiles, kRowWarps>;
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = cluster_launch_config(dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                                                 0, stream, p.core.cluster, attr);
  add_programmatic_launch<kernel>(cfg, attr);
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <typename Op, int kTiles>
cudaError_t launch_rows(const DecodePlan& pl, const typename Op::Params& p, cudaStream_t stream) {
  switch (pl.row_warps) {
    case 8:
      return launch_instance<Op, kTiles, 8>(p, pl.ctas, stream);
    case 4:
      return launch_instance<Op, kTiles, 4>(p, pl.ctas, stream);
    default:
      return launch_instance<Op, kTiles, 2>(p, pl.ctas, stream);
  }
}

// The instance of Op that `pl` names, launched on `stream` (p.core's split from pl).
template <typename Op>
cudaError_t launch_planned(const DecodePlan& pl, const typename Op::Params& p,
                           cudaStream_t stream) {
  switch (pl.tiles) {
    case 1:
      return launch_rows<Op, 1>(pl, p, stream);
    case 2:
      return launch_rows<Op, 2>(pl, p, stream);
    case 4:
      return launch_rows<Op, 4>(pl, p, stream);
    default:
      return launch_rows<Op, 8>(pl, p, stream);
  }
}

}  // namespace decode
}  // namespace gemmt
