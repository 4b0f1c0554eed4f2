// The weighted combine of the expert layer: out[t] = sum over k of weights[t, k] *
// y[inverse[t * top_k + k]], y being the down product's rows in expert order. A thread makes V
// consecutive elements of an output row (a 16-byte pack where the rows allow it, else one), its
// token's slots read a chunk at a time with every row load of the chunk issued before the sums
// (element by element and one slot after the other, the combine ran at a fifth of the copy). The
// sum runs in float32 (float64 for float64) in k order with pinned roundings (no fused
// multiply-add), and is rounded once to the output dtype, as the CPU reference's float32 index_add
// is. Without weights it is a plain sum of the top_k rows: the backward of the gather (each token's
// gradient gathered from its slots' rows).
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/moe.h"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace {

constexpr int kBlock = 256;
// Slots whose rows a thread loads before it adds them.
constexpr int kSlotChunk = 4;
// Four blocks an SM (64 registers a thread): with two slots a token a warp has few loads in
// flight, so the SM needs the warps. Eight rows a chunk took 122 registers in bfloat16 (two
// blocks an SM) and ran up to twice as long at 4096 tokens (H200).
constexpr int kMinBlocks = 4;

template <typename T, int V>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    moe_combine_kernel(const T* __restrict__ y, std::int64_t y_rows, std::int64_t y_row_stride,
                       std::int64_t cols, const opmath_t<T>* __restrict__ weights,
                       const std::int64_t* __restrict__ inverse, std::int64_t tokens,
                       std::int64_t top_k, T* __restrict__ out) {
  using A = opmath_t<T>;
  const std::int64_t packs = cols / V;  // cols % V == 0
  const std::int64_t total = tokens * packs;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t t = i / packs, c = (i - t * packs) * V;
    A acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = A(0);
    for (std::int64_t k0 = 0; k0 < top_k; k0 += kSlotChunk) {
      Pack<T, V> rows[kSlotChunk];
      bool valid[kSlotChunk];
#pragma unroll
      for (int j = 0; j < kSlotChunk; ++j) {
        const std::int64_t p = k0 + j < top_k ? inverse[t * top_k + k0 + j] : -1;
        valid[j] = p >= 0 && p < y_rows;
        if (valid[j]) rows[j] = load_elems<T, V>(y + p * y_row_stride + c);
      }
#pragma unroll
      for (int j = 0; j < kSlotChunk; ++j) {
        if (!valid[j]) continue;
        const A w = weights != nullptr ? weights[t * top_k + k0 + j] : A(1);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A v = to_opmath(rows[j].v[e]);
          acc[e] = add_rn(acc[e], weights != nullptr ? mul_rn(v, w) : v);
        }
      }
    }
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = from_opmath<T>(acc[e]);
    store_elems<T, V>(out + t * cols + c, o);
  }
}

template <typename T, int V>
cudaError_t launch(const void* y, std::int64_t y_rows, std::int64_t y_row_stride, std::int64_t cols,
                   const void* weights, const std::int64_t* inverse, std::int64_t tokens,
                   std::int64_t top_k, void* out, cudaStream_t stream) {
  moe_combine_kernel<T, V><<<grid_1d(tokens * (cols / V), kBlock, 1 << 16), kBlock, 0, stream>>>(
      static_cast<const T*>(y), y_rows, y_row_stride, cols,
      static_cast<const opmath_t<T>*>(weights), inverse, tokens, top_k, static_cast<T*>(out));
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t moe_combine_run(ScalarType dtype, const void* y, std::int64_t y_rows,
                            std::int64_t y_row_stride, std::int64_t cols, const void* weights,
                            const std::int64_t* inverse, std::int64_t tokens, std::int64_t top_k,
                            void* out, cudaStream_t stream) {
  if (y_rows < 0 || cols < 0 || tokens < 0 || top_k < 1) return cudaErrorInvalidValue;
  if (tokens * cols == 0) return cudaSuccess;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kV = kPackElems<T>;
    const bool vec = cols % kV == 0 && y_row_stride % kV == 0 && is_aligned<kVectorBytes>(y) &&
                     is_aligned<kVectorBytes>(out);
    if (vec) {
      return launch<T, kV>(y, y_rows, y_row_stride, cols, weights, inverse, tokens, top_k, out,
                           stream);
    }
    return launch<T, 1>(y, y_rows, y_row_stride, cols, weights, inverse, tokens, top_k, out,
                        stream);
  });
}

}  // namespace gemmt
