// SIMT GEMM ladder, step 4: warp tiling.
//
// Adds over step 3: a warp-shaped thread layout with 16-byte shared loads (4 per 64 FMAs
// instead of 16), vector global loads, and padded rows that keep transposed stores
// conflict-free.
// Measured on an H100 (exact float32, docs/performance.md): 10.6-18.8 TFLOP/s, 36-40% of cuBLAS at
// 1024^3-8192^3. Next step: ladder_5_pipelined.cuh (the production SIMT kernel).
#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

// =============================================================================================
// 4. Warp tiling. Same 128x128x8 block tile and 8x8 outputs per thread as step 3, but:
//  * threads are laid out as 4x2 warps of 32x64 outputs, lanes 4 (m) x 8 (n), and a thread's
//    8 rows / 8 columns are two runs of 4 spaced 16 / 32 apart. At a fixed k, the 8 lanes of a
//    quarter-warp then read 8 consecutive float4 of B (128 B, conflict-free) and one float4
//    of A (broadcast), each with one LDS.128: 4 shared loads per 64 FMAs instead of 16;
//  * global loads are 4-element vectors along the operand's contiguous dimension when
//    alignment allows (a scalar path covers any other stride);
//  * A and B rows in shared memory are padded to 132 words. When a row-major A is written
//    transposed, lane pairs cover 8 k of 16 rows; 132 = 4 (mod 32) puts the 4 k of one
//    vector in distinct bank groups, so those scalar stores are conflict-free too.
// =============================================================================================
constexpr int kWtPad = 4;

// Stages one [kWtK][128] operand tile (element (k, c) at base[c * c_stride + k * k_stride])
// as floats, the way `mode` (a WarpTiledLoad, picked on the host) says.
template <class T, int PITCH>
__device__ __forceinline__ void warp_tiled_stage(float* S, const typename Elem<T>::raw* base,
                                                 int64_t c_stride, int64_t k_stride, int64_t c0,
                                                 int64_t c_ext, int64_t k0, int64_t k_ext, int mode,
                                                 int tid) {
  float v[4];
  if (mode == static_cast<int>(WarpTiledLoad::kVecAlongC)) {
    const int kl = tid / 32, cl = 4 * (tid % 32);
    const int64_t gk = k0 + kl, gc = c0 + cl;
    if (gk < k_ext && gc + 4 <= c_ext) {
      load_vec4<T>(base + gc + gk * k_stride, v);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = (gk < k_ext && gc + j < c_ext) ? ld<T>(base, gc + j + gk * k_stride) : 0.f;
    }
    *reinterpret_cast<float4*>(S + kl * PITCH + cl) = make_float4(v[0], v[1], v[2], v[3]);
  } else if (mode == static_cast<int>(WarpTiledLoad::kVecAlongK)) {
    const int cl = tid / 2, kl = 4 * (tid % 2);
    const int64_t gk = k0 + kl, gc = c0 + cl;
    if (gc < c_ext && gk + 4 <= k_ext) {
      load_vec4<T>(base + gc * c_stride + gk, v);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = (gc < c_ext && gk + j < k_ext) ? ld<T>(base, gc * c_stride + gk + j) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) S[(kl + j) * PITCH + cl] = v[j];
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int cl = tid % 128, kl = tid / 128 + 2 * e;
      const int64_t gk = k0 + kl, gc = c0 + cl;
      S[kl * PITCH + cl] =
          (gc < c_ext && gk < k_ext) ? ld<T>(base, gc * c_stride + gk * k_stride) : 0.f;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kWtThreads)
    gemm_warp_tiled_kernel(const MatArgs<T> p, int tiles_n, int a_mode, int b_mode) {
  constexpr int PA = kWtM + kWtPad, PB = kWtN + kWtPad;
  constexpr int WM = 32, WN = 64, LN = 8;
  __shared__ __align__(16) float As[kWtK * PA];
  __shared__ __align__(16) float Bs[kWtK * PB];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / 2, warp_n = warp % 2;
  const int lane_m = lane / LN, lane_n = lane % LN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kWtM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kWtN;
  const int a_off = warp_m * WM + lane_m * 4;
  const int b_off = warp_n * WN + lane_n * 4;
  float acc[8][8] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kWtK) {
    warp_tiled_stage<T, PA>(As, p.a, p.sam, p.sak, m0, p.m, k0, p.k, a_mode, tid);
    warp_tiled_stage<T, PB>(Bs, p.b, p.sbn, p.sbk, n0, p.n, k0, p.k, b_mode, tid);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kWtK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(As + kk * PA + a_off);
      const float4 a1 = *reinterpret_cast<const float4*>(As + kk * PA + a_off + 16);
      const float4 b0 = *reinterpret_cast<const float4*>(Bs + kk * PB + b_off);
      const float4 b1 = *reinterpret_cast<const float4*>(Bs + kk * PB + b_off + 32);
      const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + a_off + (i / 4) * 16 + (i % 4);
#pragma unroll
    for (int jc = 0; jc < 2; ++jc) store_quad(p.out, row, n0 + b_off + jc * 32, &acc[i][jc * 4]);
  }
}

template <class T>
cudaError_t run_warp_tiled_typed(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kWtN), tiles = ceil_div(a.m, kWtM) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const WarpTiledLoad a_load = warp_tiled_load(a.dtype, a.a, a.a_stride_m, a.a_stride_k);
  const WarpTiledLoad b_load = warp_tiled_load(a.dtype, a.b, a.b_stride_n, a.b_stride_k);
  gemm_warp_tiled_kernel<T><<<static_cast<unsigned>(tiles), kWtThreads, 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn), static_cast<int>(a_load), static_cast<int>(b_load));
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t run_warp_tiled(const GemmArgs& a, cudaStream_t stream) {
  return with_simt_type(a.dtype, [&](auto tag) {
    return run_warp_tiled_typed<typename decltype(tag)::type>(a, stream);
  });
}

}  // namespace simt
}  // namespace gemmt
