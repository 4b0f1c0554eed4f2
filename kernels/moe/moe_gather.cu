// Gathers token rows into expert order for the first grouped product: xs[p] = x[order[p] /
// top_k], and records each slot's position in that order (the inverse permutation) for the
// combine. Rows move as 16-byte vectors when every row of x and xs starts 16-byte aligned
// and is contiguous; otherwise element by element through x's strides.
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/arith.h"
#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/moe.h"

namespace gemmt {
namespace {

constexpr int kBlock = 256;

// U is the unit copied: a 16-byte vector or one element. Strides are in units.
template <typename U>
__global__ void __launch_bounds__(kBlock)
    moe_gather_kernel(const U* __restrict__ x, std::int64_t units, std::int64_t row_stride,
                      std::int64_t col_stride, const std::int64_t* __restrict__ order,
                      std::int64_t slots, std::int64_t top_k, U* __restrict__ xs,
                      std::int64_t* __restrict__ inverse) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = first; p < slots; p += step) {
    const std::int64_t s = order[p];
    if (s >= 0 && s < slots) inverse[s] = p;
  }
  const std::int64_t total = slots * units;
  for (std::int64_t i = first; i < total; i += step) {
    const std::int64_t p = i / units, c = i - p * units;
    const std::int64_t s = order[p];
    U v{};
    if (s >= 0 && s < slots) v = x[(s / top_k) * row_stride + c * col_stride];
    xs[i] = v;
  }
}

template <typename U>
cudaError_t launch(const void* x, std::int64_t units, std::int64_t row_stride,
                   std::int64_t col_stride, const std::int64_t* order, std::int64_t slots,
                   std::int64_t top_k, void* xs, std::int64_t* inverse, cudaStream_t stream) {
  const std::int64_t work = slots * units > slots ? slots * units : slots;
  moe_gather_kernel<U><<<grid_1d(work, kBlock, 1 << 16), kBlock, 0, stream>>>(
      static_cast<const U*>(x), units, row_stride, col_stride, order, slots, top_k,
      static_cast<U*>(xs), inverse);
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t moe_gather_run(ScalarType dtype, const void* x, std::int64_t tokens, std::int64_t cols,
                           std::int64_t row_stride, std::int64_t col_stride,
                           const std::int64_t* order, std::int64_t slots, std::int64_t top_k,
                           void* xs, std::int64_t* inverse, cudaStream_t stream) {
  if (tokens < 0 || cols < 0 || slots < 0 || top_k < 1 || slots != tokens * top_k) {
    return cudaErrorInvalidValue;
  }
  if (slots == 0) return cudaSuccess;
  // Slots the order does not reach keep -1: the combine skips them.
  GEMMT_RETURN_IF_ERROR(cudaMemsetAsync(
      inverse, 0xff, static_cast<std::size_t>(slots) * sizeof(std::int64_t), stream));
  const std::int64_t esize = static_cast<std::int64_t>(element_size(dtype));
  constexpr std::int64_t kVec = 16;
  if (col_stride == 1 && (cols * esize) % kVec == 0 && (row_stride * esize) % kVec == 0 &&
      is_aligned<kVec>(x) && is_aligned<kVec>(xs)) {
    return launch<uint4>(x, cols * esize / kVec, row_stride * esize / kVec, 1, order, slots, top_k,
                         xs, inverse, stream);
  }
  switch (esize) {
    case 2:
      return launch<std::uint16_t>(x, cols, row_stride, col_stride, order, slots, top_k, xs,
                                   inverse, stream);
    case 4:
      return launch<std::uint32_t>(x, cols, row_stride, col_stride, order, slots, top_k, xs,
                                   inverse, stream);
    case 8:
      return launch<std::uint64_t>(x, cols, row_stride, col_stride, order, slots, top_k, xs,
                                   inverse, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace gemmt
