// A 2-D strided copy into a row-major buffer: how the GEMM families rewrite an operand whose
// layout their fast kernels cannot read (kernels/sm90/, kernels/simt/).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/copy_layout.h"
#include "gemmt/cuda_check.h"

namespace gemmt {

// out[r * ld_out + p] = in[r * s_r + p * s_p] for r < rows, p < len, one kCopyTile x
// kCopyTile tile per block of kCopyThreadsX x kCopyThreadsY threads. Each thread moves
// kCopyTile^2 / 256 = 16 elements and issues all its loads before its first store: a copy
// is bound by DRAM latency times the bytes in flight, and the earlier 32 x 32 tile with 4
// elements per thread (its loads in a runtime loop) moved about 2.2 TB/s on an H100. A source
// contiguous along p is copied row by row (lanes along p on both sides). Otherwise the tile goes
// through shared memory so that the read (lanes along r, the source's contiguous dimension) and
// the write (lanes along p) are both coalesced; the +1 column keeps the transposed reads of the
// tile free of bank conflicts for 4-byte elements.
constexpr int kCopyThreadsX = 32, kCopyThreadsY = 8, kCopyThreads = kCopyThreadsX * kCopyThreadsY;

template <typename E>
__global__ void __launch_bounds__(kCopyThreads)
    copy_2d_kernel(const E* __restrict__ in, int64_t s_r, int64_t s_p, int64_t rows, int64_t len,
                   E* __restrict__ out, int64_t ld_out) {
  constexpr int kX = kCopyThreadsX, kY = kCopyThreadsY;
  constexpr int kNx = kCopyTile / kX, kNy = kCopyTile / kY;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kCopyTile;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * kCopyTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  E v[kNy][kNx];
  if (s_p == 1) {
#pragma unroll
    for (int i = 0; i < kNy; ++i)
#pragma unroll
      for (int j = 0; j < kNx; ++j) {
        const int64_t r = r0 + ty + i * kY, pk = p0 + tx + j * kX;
        v[i][j] = r < rows && pk < len ? in[r * s_r + pk] : E{};
      }
#pragma unroll
    for (int i = 0; i < kNy; ++i)
#pragma unroll
      for (int j = 0; j < kNx; ++j) {
        const int64_t r = r0 + ty + i * kY, pk = p0 + tx + j * kX;
        if (r < rows && pk < len) out[r * ld_out + pk] = v[i][j];
      }
    return;
  }
  __shared__ E tile[kCopyTile][kCopyTile + 1];  // [p][r]
#pragma unroll
  for (int i = 0; i < kNy; ++i)
#pragma unroll
    for (int j = 0; j < kNx; ++j) {
      const int64_t r = r0 + tx + j * kX, pk = p0 + ty + i * kY;
      v[i][j] = r < rows && pk < len ? in[r * s_r + pk * s_p] : E{};
    }
#pragma unroll
  for (int i = 0; i < kNy; ++i)
#pragma unroll
    for (int j = 0; j < kNx; ++j) tile[ty + i * kY][tx + j * kX] = v[i][j];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kNy; ++i)
#pragma unroll
    for (int j = 0; j < kNx; ++j) {
      const int64_t r = r0 + ty + i * kY, pk = p0 + tx + j * kX;
      if (r < rows && pk < len) out[r * ld_out + pk] = tile[tx + j * kX][ty + i * kY];
    }
}

template <typename E>
cudaError_t copy_2d(const void* in, int64_t s_r, int64_t s_p, int64_t rows, int64_t len, void* out,
                    int64_t ld_out, cudaStream_t stream) {
  const int64_t gx = (rows + kCopyTile - 1) / kCopyTile;
  const int64_t gy = (len + kCopyTile - 1) / kCopyTile;
  if (gx > 2147483647 || gy > 65535) return cudaErrorNotSupported;
  copy_2d_kernel<E><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                      dim3(kCopyThreadsX, kCopyThreadsY), 0, stream>>>(
      static_cast<const E*>(in), s_r, s_p, rows, len, static_cast<E*>(out), ld_out);
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
