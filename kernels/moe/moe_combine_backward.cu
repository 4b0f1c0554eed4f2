// Backward of the weighted combine (moe_combine.cu), out[t] = sum over k of w[t, k] * y[p],
// p = inverse[t * top_k + k]. One warp per token reads grad_out[t] once and, for each of the
// token's slots, writes grad_y[p] = w[t, k] * grad_out[t] (rounded once to the dtype) and
// reduces grad_w[t, k] = <grad_out[t], y[p]> in float32 (float64 for float64): each lane
// sums its own columns in column order, then a butterfly over the warp adds the lanes, the
// same order on every run, so the result is deterministic without atomics. One pass over
// memory: grad_out and y read once, grad_y written once.
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/arith.h"
#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/moe.h"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace {

constexpr int kWarps = 8;
constexpr int kBlock = 32 * kWarps;
// Four blocks per SM cap the kernel at 64 registers: enough for eight slots' state with no
// spills, and half the SM's warps in flight for a kernel bound by memory. float64 state is
// twice as wide: two blocks.
template <typename T>
constexpr int kMinBlocks = sizeof(opmath_t<T>) == 8 ? 2 : 4;
// Slots handled per pass over a token's row: their weights, rows and dot products stay in
// registers. top_k beyond it takes more passes (grad_out re-read, from cache).
constexpr int kSlotChunk = 8;

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// grad_y (slots x cols, contiguous) is written when not null, grad_w (tokens x top_k) when
// not null. Every row of grad_y is written: the rows of the token slots here, and the rows
// no slot maps to (routing that is not a permutation) with zeros by the sweep at the end.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock, kMinBlocks<T>)
    moe_combine_backward_kernel(const T* __restrict__ grad_out, std::int64_t go_stride,
                                const T* __restrict__ y, std::int64_t y_stride, std::int64_t cols,
                                const opmath_t<T>* __restrict__ weights,
                                const std::int64_t* __restrict__ inverse,
                                const std::int64_t* __restrict__ order, std::int64_t tokens,
                                std::int64_t top_k, T* __restrict__ grad_y,
                                opmath_t<T>* __restrict__ grad_w) {
  using A = opmath_t<T>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t slots = tokens * top_k;
  const std::int64_t packs = cols / V;
  const std::int64_t warp_step = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
       t < tokens; t += warp_step) {
    const T* g_row = grad_out + t * go_stride;
    for (std::int64_t k0 = 0; k0 < top_k; k0 += kSlotChunk) {
      std::int64_t p[kSlotChunk];
      A w[kSlotChunk], dot[kSlotChunk];
#pragma unroll
      for (int j = 0; j < kSlotChunk; ++j) {
        p[j] = -1;
        w[j] = A(0);
        dot[j] = A(0);
        if (k0 + j < top_k) {
          const std::int64_t s = t * top_k + k0 + j;
          const std::int64_t q = inverse[s];
          if (q >= 0 && q < slots) p[j] = q;
          if (grad_y != nullptr) w[j] = weights[s];
        }
      }
      for (std::int64_t c = lane; c < packs; c += 32) {
        const Pack<T, V> g = load_elems<T, V>(g_row + c * V);
        A gf[V];
#pragma unroll
        for (int i = 0; i < V; ++i) gf[i] = to_opmath(g.v[i]);
#pragma unroll
        for (int j = 0; j < kSlotChunk; ++j) {
          if (p[j] < 0) continue;
          if (grad_w != nullptr) {
            const Pack<T, V> yv = load_elems<T, V>(y + p[j] * y_stride + c * V);
#pragma unroll
            for (int i = 0; i < V; ++i) dot[j] = fma_rn(gf[i], to_opmath(yv.v[i]), dot[j]);
          }
          if (grad_y != nullptr) {
            Pack<T, V> r;
#pragma unroll
            for (int i = 0; i < V; ++i) r.v[i] = from_opmath<T>(mul_rn(gf[i], w[j]));
            store_elems<T, V>(grad_y + p[j] * cols + c * V, r);
          }
        }
      }
      if (grad_w != nullptr) {
#pragma unroll
        for (int j = 0; j < kSlotChunk; ++j) {
          const A d = warp_sum(dot[j]);  // every lane takes part: the shuffle needs all 32
          if (lane == 0 && k0 + j < top_k) grad_w[t * top_k + k0 + j] = d;
        }
      }
    }
  }
  if (grad_y == nullptr) return;
  // Row r is written above exactly when inverse[order[r]] == r (the gather sets inverse[s] =
  // r only where order[r] == s); the others get zeros, so nothing is left uninitialised.
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x; r < slots;
       r += step) {
    const std::int64_t s = order[r];
    if (s >= 0 && s < slots && inverse[s] == r) continue;
    for (std::int64_t c = 0; c < cols; ++c) grad_y[r * cols + c] = from_opmath<T>(A(0));
  }
}

template <typename T, int V>
cudaError_t launch(const void* grad_out, std::int64_t go_stride, const void* y,
                   std::int64_t y_stride, std::int64_t cols, const void* weights,
                   const std::int64_t* inverse, const std::int64_t* order, std::int64_t tokens,
                   std::int64_t top_k, void* grad_y, void* grad_w, cudaStream_t stream) {
  moe_combine_backward_kernel<T, V><<<grid_1d(tokens, kWarps, 1 << 16), kBlock, 0, stream>>>(
      static_cast<const T*>(grad_out), go_stride, static_cast<const T*>(y), y_stride, cols,
      static_cast<const opmath_t<T>*>(weights), inverse, order, tokens, top_k,
      static_cast<T*>(grad_y), static_cast<opmath_t<T>*>(grad_w));
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t moe_combine_backward_run(ScalarType dtype, const void* grad_out,
                                     std::int64_t grad_out_row_stride, const void* y,
                                     std::int64_t y_row_stride, std::int64_t cols,
                                     const void* weights, const std::int64_t* inverse,
                                     const std::int64_t* order, std::int64_t tokens,
                                     std::int64_t top_k, void* grad_y, void* grad_weights,
                                     cudaStream_t stream) {
  if (tokens < 0 || cols < 0 || top_k < 1 || inverse == nullptr) return cudaErrorInvalidValue;
  if (grad_y != nullptr && (weights == nullptr || order == nullptr)) return cudaErrorInvalidValue;
  if (grad_weights != nullptr && y == nullptr) return cudaErrorInvalidValue;
  if (tokens == 0 || (grad_y == nullptr && grad_weights == nullptr)) return cudaSuccess;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kV = kPackElems<T>;
    const bool vec =
        cols % kV == 0 && grad_out_row_stride % kV == 0 && is_aligned<kVectorBytes>(grad_out) &&
        (grad_weights == nullptr || (y_row_stride % kV == 0 && is_aligned<kVectorBytes>(y))) &&
        (grad_y == nullptr || is_aligned<kVectorBytes>(grad_y));
    if (vec) {
      return launch<T, kV>(grad_out, grad_out_row_stride, y, y_row_stride, cols, weights, inverse,
                           order, tokens, top_k, grad_y, grad_weights, stream);
    }
    return launch<T, 1>(grad_out, grad_out_row_stride, y, y_row_stride, cols, weights, inverse,
                        order, tokens, top_k, grad_y, grad_weights, stream);
  });
}

}  // namespace gemmt
