// SIMT GEMM ladder, step 3: register blocking.
//
// Adds over step 2: a 128x128 block tile with 8x8 outputs per thread held in registers, so
// shared-memory traffic per FMA drops 8x and arithmetic becomes the limit.
// Measured on an H100 (exact float32, docs/performance.md): 9.6-18.2 TFLOP/s, 35-38% of cuBLAS at
// 1024^3-8192^3. Next step: ladder_4_warp_tiled.cu.
#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

// =============================================================================================
// 3. Register blocking: each thread owns an 8x8 block of C in registers. Per k step it reads
// 8 values of A and 8 of B from shared memory and does 64 FMAs, so shared-memory traffic per
// FMA drops 8x versus step 2 and the kernel starts to be limited by arithmetic. A is stored
// transposed (As[k][m]) so that a thread's 8 A values are contiguous like its 8 B values.
// What is still slow: threads of a warp read B 8 words apart (4-way bank conflicts), global
// loads are scalar, and nothing overlaps the loads with the math.
// =============================================================================================
template <class T>
__global__ void __launch_bounds__(kRbThreads)
    gemm_register_blocked_kernel(const MatArgs<T> p, int tiles_n, bool a_k_fast, bool b_k_fast) {
  __shared__ float As[kRbK][kRbM];
  __shared__ float Bs[kRbK][kRbN];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kRbM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kRbN;
  float acc[kRbT][kRbT] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kRbK) {
#pragma unroll
    for (int e = 0; e < kRbM * kRbK / kRbThreads; ++e) {
      const int idx = tid + e * kRbThreads;
      // Consecutive threads walk the operand's contiguous dimension (coalesced loads).
      const int kl = a_k_fast ? idx % kRbK : idx / kRbM;
      const int ml = a_k_fast ? idx / kRbK : idx % kRbM;
      const int64_t gm = m0 + ml, gk = k0 + kl;
      As[kl][ml] = (gm < p.m && gk < p.k) ? ld<T>(p.a, gm * p.sam + gk * p.sak) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < kRbN * kRbK / kRbThreads; ++e) {
      const int idx = tid + e * kRbThreads;
      const int kl = b_k_fast ? idx % kRbK : idx / kRbN;
      const int nl = b_k_fast ? idx / kRbK : idx % kRbN;
      const int64_t gk = k0 + kl, gn = n0 + nl;
      Bs[kl][nl] = (gk < p.k && gn < p.n) ? ld<T>(p.b, gk * p.sbk + gn * p.sbn) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kRbK; ++kk) {
      float a[kRbT], b[kRbT];
#pragma unroll
      for (int i = 0; i < kRbT; ++i) a[i] = As[kk][ty * kRbT + i];
#pragma unroll
      for (int j = 0; j < kRbT; ++j) b[j] = Bs[kk][tx * kRbT + j];
#pragma unroll
      for (int i = 0; i < kRbT; ++i)
#pragma unroll
        for (int j = 0; j < kRbT; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kRbT; ++i) {
    const int64_t row = m0 + ty * kRbT + i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < kRbT; ++j) {
      const int64_t col = n0 + tx * kRbT + j;
      if (col < p.n) store_one(p.out, row, col, acc[i][j]);
    }
  }
}

template <class T>
cudaError_t run_register_blocked_typed(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kRbN), tiles = ceil_div(a.m, kRbM) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const bool a_k_fast = a.a_stride_k == 1 && a.a_stride_m != 1;
  const bool b_k_fast = a.b_stride_k == 1 && a.b_stride_n != 1;
  gemm_register_blocked_kernel<T><<<static_cast<unsigned>(tiles), kRbThreads, 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn), a_k_fast, b_k_fast);
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t run_register_blocked(const GemmArgs& a, cudaStream_t stream) {
  return with_simt_type(a.dtype, [&](auto tag) {
    return run_register_blocked_typed<typename decltype(tag)::type>(a, stream);
  });
}

}  // namespace simt
}  // namespace gemmt
