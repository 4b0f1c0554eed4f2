// A 2-D strided copy into a row-major buffer: how the GEMM families rewrite an operand whose
// layout their fast kernels cannot read (kernels/sm90/, kernels/simt/).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/copy_layout.h"
#include "gemmt/cuda_check.h"

namespace gemmt {

// out[r * ld_out + p] = in[r * s_r + p * s_p] for r < rows, p < len. A source contiguous
// along p is copied row by row (coalesced on both sides). Otherwise a 32x32 tile goes
// through shared memory so that the read (along r, the source's contiguous dimension) and
// the write (along p) are both coalesced; the +1 column keeps the transposed reads of the
// tile free of bank conflicts.
template <typename E>
__global__ void __launch_bounds__(kCopyTile * 8)
    copy_2d_kernel(const E* __restrict__ in, int64_t s_r, int64_t s_p, int64_t rows, int64_t len,
                   E* __restrict__ out, int64_t ld_out) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kCopyTile;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * kCopyTile;
  if (s_p == 1) {
    for (int i = threadIdx.y; i < kCopyTile; i += blockDim.y) {
      const int64_t r = r0 + i, pk = p0 + threadIdx.x;
      if (r < rows && pk < len) out[r * ld_out + pk] = in[r * s_r + pk];
    }
    return;
  }
  __shared__ E tile[kCopyTile][kCopyTile + 1];
  for (int i = threadIdx.y; i < kCopyTile; i += blockDim.y) {
    const int64_t r = r0 + threadIdx.x, pk = p0 + i;
    if (r < rows && pk < len) tile[i][threadIdx.x] = in[r * s_r + pk * s_p];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kCopyTile; i += blockDim.y) {
    const int64_t r = r0 + i, pk = p0 + threadIdx.x;
    if (r < rows && pk < len) out[r * ld_out + pk] = tile[threadIdx.x][i];
  }
}

template <typename E>
cudaError_t copy_2d(const void* in, int64_t s_r, int64_t s_p, int64_t rows, int64_t len, void* out,
                    int64_t ld_out, cudaStream_t stream) {
  const int64_t gx = (rows + kCopyTile - 1) / kCopyTile;
  const int64_t gy = (len + kCopyTile - 1) / kCopyTile;
  if (gx > 2147483647 || gy > 65535) return cudaErrorNotSupported;
  copy_2d_kernel<E>
      <<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(kCopyTile, 8), 0,
         stream>>>(static_cast<const E*>(in), s_r, s_p, rows, len, static_cast<E*>(out), ld_out);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// copy_2d on elements of `elt_bytes` (2 or 4) bytes: a bit copy, whatever the dtype.
inline cudaError_t copy_2d_bits(int elt_bytes, const void* in, int64_t s_r, int64_t s_p,
                                int64_t rows, int64_t len, void* out, int64_t ld_out,
                                cudaStream_t stream) {
  if (elt_bytes == 4) return copy_2d<uint32_t>(in, s_r, s_p, rows, len, out, ld_out, stream);
  if (elt_bytes == 2) return copy_2d<uint16_t>(in, s_r, s_p, rows, len, out, ld_out, stream);
  return cudaErrorInvalidValue;
}

}  // namespace gemmt
