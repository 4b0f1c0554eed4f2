// SIMT GEMM ladder, step 1: naive.
//
// The starting point: one thread per element of C, operands straight from global memory.
// Measured on an H100 (exact float32, docs/performance.md): 4.9-5.4 TFLOP/s, 10-17% of cuBLAS at
// 1024^3-4096^3. Next step: ladder_2_smem_tiled.cu.
#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

// =============================================================================================
// 1. Naive: one thread per element of C.
// Every multiply-add needs two global loads, so the kernel runs at memory (or L1/L2) speed,
// far below the FFMA peak. threadIdx.x runs along n so that a warp's loads of B (row-major)
// and stores of C are coalesced; A is a broadcast within the warp.
// =============================================================================================
template <class T>
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile)
    gemm_naive_kernel(const MatArgs<T> p, int tiles_n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x / tiles_n) * kNaiveTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x % tiles_n) * kNaiveTile + threadIdx.x;
  if (i >= p.m || j >= p.n) return;
  const auto* a = p.a + i * p.sam;
  const auto* b = p.b + j * p.sbn;
  float acc = 0.f;
  for (int64_t q = 0; q < p.k; ++q) acc = fmaf(ld<T>(a, q * p.sak), ld<T>(b, q * p.sbk), acc);
  store_one(p.out, i, j, acc);
}

template <class T>
cudaError_t run_naive_typed(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kNaiveTile), tiles = ceil_div(a.m, kNaiveTile) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  gemm_naive_kernel<T><<<static_cast<unsigned>(tiles), dim3(kNaiveTile, kNaiveTile), 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn));
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t run_naive(const GemmArgs& a, cudaStream_t stream) {
  return with_simt_type(
      a.dtype, [&](auto tag) { return run_naive_typed<typename decltype(tag)::type>(a, stream); });
}

}  // namespace simt
}  // namespace gemmt
