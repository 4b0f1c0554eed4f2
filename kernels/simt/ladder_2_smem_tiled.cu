// SIMT GEMM ladder, step 2: shared-memory tiles.
//
// Adds over step 1: 32x32 tiles of A and B staged in shared memory, so every global load
// feeds 32 FMAs instead of one.
// Measured on an H100 (exact float32, docs/performance.md): 6.1-6.5 TFLOP/s, 12-22% of cuBLAS at
// 1024^3-4096^3. Next step: ladder_3_register_blocked.cu.
#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

// =============================================================================================
// 2. Shared-memory tiling: a 32x32 block stages 32x32 tiles of A and B in shared memory and
// each thread reads its row / column from there, so every global load feeds 32 FMAs instead
// of one. Whichever of a tile's two dimensions is contiguous in global memory runs along
// threadIdx.x, keeping the loads coalesced for both plain and transposed operands; the +1
// padding makes the column-wise shared store of a transposed operand conflict-free (a stride
// of 33 words visits all 32 banks).
// =============================================================================================
template <class T>
__global__ void __launch_bounds__(kSmemTile* kSmemTile)
    gemm_smem_tiled_kernel(const MatArgs<T> p, int tiles_n, bool a_m_fast, bool b_k_fast) {
  __shared__ float As[kSmemTile][kSmemTile + 1];  // As[m][k]
  __shared__ float Bs[kSmemTile][kSmemTile + 1];  // Bs[k][n]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kSmemTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kSmemTile;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < p.k; k0 += kSmemTile) {
    {
      const int ml = a_m_fast ? tx : ty, kl = a_m_fast ? ty : tx;
      const int64_t gm = m0 + ml, gk = k0 + kl;
      As[ml][kl] = (gm < p.m && gk < p.k) ? ld<T>(p.a, gm * p.sam + gk * p.sak) : 0.f;
    }
    {
      const int kl = b_k_fast ? tx : ty, nl = b_k_fast ? ty : tx;
      const int64_t gk = k0 + kl, gn = n0 + nl;
      Bs[kl][nl] = (gk < p.k && gn < p.n) ? ld<T>(p.b, gk * p.sbk + gn * p.sbn) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSmemTile; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();
  }
  if (m0 + ty < p.m && n0 + tx < p.n) store_one(p.out, m0 + ty, n0 + tx, acc);
}

template <class T>
cudaError_t run_smem_tiled_typed(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kSmemTile), tiles = ceil_div(a.m, kSmemTile) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const bool a_m_fast = a.a_stride_m == 1 && a.a_stride_k != 1;
  const bool b_k_fast = a.b_stride_k == 1 && a.b_stride_n != 1;
  gemm_smem_tiled_kernel<T>
      <<<static_cast<unsigned>(tiles), dim3(kSmemTile, kSmemTile), 0, stream>>>(
          make_mat<T>(a), static_cast<int>(tn), a_m_fast, b_k_fast);
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t run_smem_tiled(const GemmArgs& a, cudaStream_t stream) {
  return with_simt_type(a.dtype, [&](auto tag) {
    return run_smem_tiled_typed<typename decltype(tag)::type>(a, stream);
  });
}

}  // namespace simt
}  // namespace gemmt
