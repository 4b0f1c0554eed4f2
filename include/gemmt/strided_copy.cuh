// A 2-D strided copy into a row-major buffer: how the GEMM families rewrite an operand whose
// layout their fast kernels cannot read (kernels/gemm_sm90_wgmma.cu, kernels/gemm_simt.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"

namespace gemmt {

constexpr int kCopyTile = 32;
// Largest `len` copy_2d accepts: its grid has at most 65535 tiles along it.
constexpr int64_t kCopyMaxLen = int64_t{65535} * kCopyTile;

// out[r * ld_out + p] = in[r * s_r + p * s_p] for r < rows, p < len. A source contiguous
// along p is copied row by row (coalesced on both sides). Otherwise a 32x32 tile goes
// through shared memory so that the read (along r, the source's contiguous dimension) and
// the write (along p) are both coalesced; the +1 column keeps the transposed reads of the
// tile free of bank conflicts.
template <typename E>
__global__ void __launch_bounds__(kCopyTile * 8)
    copy_2d_kernel(const E* __restrict__ in, int64_t s_r, int64_t s_p, int64_t rows,
                   int64_t len, E* __restrict__ out, int64_t ld_out) {
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
cudaError_t copy_2d(const void* in, int64_t s_r, int64_t s_p, int64_t rows, int64_t len,
                    void* out, int64_t ld_out, cudaStream_t stream) {
  const int64_t gx = (rows + kCopyTile - 1) / kCopyTile;
  const int64_t gy = (len + kCopyTile - 1) / kCopyTile;
  if (gx > 2147483647 || gy > 65535) return cudaErrorNotSupported;
  copy_2d_kernel<E><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                      dim3(kCopyTile, 8), 0, stream>>>(static_cast<const E*>(in), s_r, s_p,
                                                       rows, len, static_cast<E*>(out), ld_out);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// Row pitch of a copy, in elements: `len` rounded up to 16 bytes, so that every row of the
// copy starts 16-byte aligned (vector loads, TMA row strides).
inline int64_t copy_pitch(int64_t len, int64_t elt_bytes) {
  const int64_t per16 = 16 / elt_bytes;
  return (len + per16 - 1) / per16 * per16;
}

// Workspace bytes of a `rows` x copy_pitch(len) copy, rounded up to 256 so that whatever
// follows it in the workspace stays aligned.
inline std::size_t copy_bytes(int64_t rows, int64_t len, int64_t elt_bytes) {
  const std::size_t b = static_cast<std::size_t>(rows) *
                        static_cast<std::size_t>(copy_pitch(len, elt_bytes)) *
                        static_cast<std::size_t>(elt_bytes);
  return (b + 255) / 256 * 256;
}

// A 256-byte-aligned stand-in for the workspace while a copy is only being planned (the
// kernels' plans look at alignment, never at the memory); never dereferenced.
inline char* planning_workspace() {
  return reinterpret_cast<char*>(uintptr_t{256});
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
