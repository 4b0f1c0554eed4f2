// The weighted combine of the expert layer: out[t] = sum over k of weights[t, k] *
// y[inverse[t * top_k + k]], y being the down product's rows in expert order. One thread per
// output element; the sum runs in float32 (float64 for float64) in k order with pinned
// roundings (no fused multiply-add), and is rounded once to the output dtype, as the CPU
// reference's float32 index_add is. Without weights it is a plain sum of the top_k rows: the
// backward of the gather (each token's gradient gathered from its slots' rows).
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/moe.h"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void __launch_bounds__(kBlock)
    moe_combine_kernel(const T* __restrict__ y, std::int64_t y_rows, std::int64_t y_row_stride,
                       std::int64_t cols, const opmath_t<T>* __restrict__ weights,
                       const std::int64_t* __restrict__ inverse, std::int64_t tokens,
                       std::int64_t top_k, T* __restrict__ out) {
  using A = opmath_t<T>;
  const std::int64_t total = tokens * cols;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t t = i / cols, c = i - t * cols;
    A acc = A(0);
    for (std::int64_t k = 0; k < top_k; ++k) {
      const std::int64_t p = inverse[t * top_k + k];
      if (p >= 0 && p < y_rows) {
        const A v = to_opmath(y[p * y_row_stride + c]);
        acc = add_rn(acc, weights != nullptr ? mul_rn(v, weights[t * top_k + k]) : v);
      }
    }
    out[i] = from_opmath<T>(acc);
  }
}

}  // namespace

cudaError_t moe_combine_run(ScalarType dtype, const void* y, std::int64_t y_rows,
                            std::int64_t y_row_stride, std::int64_t cols, const void* weights,
                            const std::int64_t* inverse, std::int64_t tokens, std::int64_t top_k,
                            void* out, cudaStream_t stream) {
  if (y_rows < 0 || cols < 0 || tokens < 0 || top_k < 1) return cudaErrorInvalidValue;
  const std::int64_t total = tokens * cols;
  if (total == 0) return cudaSuccess;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    moe_combine_kernel<T><<<grid_1d(total, kBlock, 1 << 16), kBlock, 0, stream>>>(
        static_cast<const T*>(y), y_rows, y_row_stride, cols,
        static_cast<const opmath_t<T>*>(weights), inverse, tokens, top_k, static_cast<T*>(out));
    GEMMT_RETURN_LAUNCH_ERROR();
  });
}

}  // namespace gemmt
