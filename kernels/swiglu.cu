// swiglu(gate, up) = silu(gate) * up, the gated activation of LLaMA-style MLPs, and its
// backward. The forward is a binary functor on the elementwise engine (elementwise_engine.cuh:
// vector and strided paths, 64-bit indexing); the backward reads three tensors and writes
// two, which is outside the engine's shape, so it is a short kernel of its own.
// Arithmetic is float32 for the float32 and 16-bit dtypes (double for float64), rounded once to
// the tensor's dtype.
#include <cstdint>

#include <cuda_runtime.h>

#include "common/elementwise_engine.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/elementwise.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

// sigmoid(x) = 1 / (1 + e^-x): for x -> -inf, e^-x overflows to inf and the result is 0, the
// limit, with no NaN on the way.
__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ double sigmoid(double x) {
  return 1.0 / (1.0 + exp(-x));
}

struct SwigluOp {
  template <typename F>
  __device__ __forceinline__ F operator()(F gate, F up) const {
    return gate * sigmoid(gate) * up;
  }
};

// d_gate = grad * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);
// d_up = grad * silu(gate). Inputs are contiguous (the wrapper makes them so).
template <typename T>
__global__ void __launch_bounds__(256)
    swiglu_backward_kernel(const T* __restrict__ grad, const T* __restrict__ gate,
                           const T* __restrict__ up, T* __restrict__ d_gate, T* __restrict__ d_up,
                           std::int64_t numel) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    using F = opmath_t<T>;
    const F g = to_opmath(grad[i]), x = to_opmath(gate[i]), u = to_opmath(up[i]);
    const F s = sigmoid(x);
    d_gate[i] = from_opmath<T>(g * u * s * (F(1) + x * (F(1) - s)));
    d_up[i] = from_opmath<T>(g * x * s);
  }
}

}  // namespace

cudaError_t swiglu_run(ScalarType dtype, int64_t numel, const void* gate,
                       const StridedLayout* gate_layout, const void* up,
                       const StridedLayout* up_layout, void* out, cudaStream_t stream) {
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    // Two packs of each input per thread, as for the other binary ops (elementwise.cu).
    return engine::launch<kPackElems<T>, 2, T, T>(SwigluOp{}, numel, {gate, up},
                                                  {gate_layout, up_layout}, out, stream);
  });
}

cudaError_t swiglu_backward_run(ScalarType dtype, int64_t numel, const void* grad, const void* gate,
                                const void* up, void* d_gate, void* d_up, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kBlock = 256;
    swiglu_backward_kernel<T><<<grid_1d(numel, kBlock), kBlock, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<const T*>(gate), static_cast<const T*>(up),
        static_cast<T*>(d_gate), static_cast<T*>(d_up), numel);
    GEMMT_RETURN_LAUNCH_ERROR();
  });
}

}  // namespace gemmt
