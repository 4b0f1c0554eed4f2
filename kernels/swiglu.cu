// swiglu(gate, up) = silu(gate) * up, the gated activation of LLaMA-style MLPs, and its
// backward. The forward is a binary functor on the elementwise engine (elementwise_engine.cuh:
// vector, row-view and strided paths, 64-bit indexing); the backward reads three tensors and
// writes two, which is outside the engine's shape, so it is a short kernel of its own.
// Arithmetic is float32 for the float32 and 16-bit dtypes (double for float64), rounded once to
// the tensor's dtype.
#include <cstdint>

#include <cuda_runtime.h>

#include "common/elementwise_engine.cuh"
#include "common/strided_index.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/elementwise.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

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
// d_up = grad * silu(gate).
template <typename F>
__device__ __forceinline__ void swiglu_grads(F g, F x, F u, F* dg, F* du) {
  const F s = sigmoid(x);
  *dg = g * u * s * (F(1) + x * (F(1) - s));
  *du = g * x * s;
}

// Every tensor a row view (rows x cols, dense rows spaced by its own row stride), so that
// the halves of a fused gate/up product are read, and its gradient's halves written, in
// place. kElems elements a thread: 16-byte packs when every row is aligned whole packs, one
// element otherwise.
template <typename T, int kElems>
__global__ void __launch_bounds__(256)
    swiglu_backward_kernel(SwigluBackwardRows rows, std::int64_t packs_per_row) {
  using F = opmath_t<T>;
  const std::int64_t packs = rows.rows * packs_per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    std::int64_t row, col;
    divmod_index(p, packs_per_row, &row, &col);
    col *= kElems;
    const auto at = [&](const void* base, std::int64_t ld) {
      return static_cast<const T*>(base) + row * ld + col;
    };
    const Pack<T, kElems> g = load_elems<T, kElems>(at(rows.grad, rows.ld_grad));
    const Pack<T, kElems> x = load_elems<T, kElems>(at(rows.gate, rows.ld_gate));
    const Pack<T, kElems> u = load_elems<T, kElems>(at(rows.up, rows.ld_up));
    Pack<T, kElems> dg, du;
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      F a, b;
      swiglu_grads(to_opmath(g.v[e]), to_opmath(x.v[e]), to_opmath(u.v[e]), &a, &b);
      dg.v[e] = from_opmath<T>(a);
      du.v[e] = from_opmath<T>(b);
    }
    store_elems<T, kElems>(static_cast<T*>(rows.d_gate) + row * rows.ld_d_gate + col, dg);
    store_elems<T, kElems>(static_cast<T*>(rows.d_up) + row * rows.ld_d_up + col, du);
  }
}

template <typename T, int kElems>
cudaError_t launch_swiglu_backward(const SwigluBackwardRows& rows, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const std::int64_t packs_per_row = rows.cols / kElems;
  swiglu_backward_kernel<T, kElems>
      <<<grid_1d(rows.rows * packs_per_row, kBlock), kBlock, 0, stream>>>(rows, packs_per_row);
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <typename T>
bool rows_take_packs(const SwigluBackwardRows& r) {
  constexpr int kElems = kPackElems<T>;
  if (r.cols % kElems != 0) return false;
  for (const std::int64_t ld : {r.ld_grad, r.ld_gate, r.ld_up, r.ld_d_gate, r.ld_d_up}) {
    if (ld % kElems != 0) return false;
  }
  return is_aligned<kVectorBytes>(r.grad) && is_aligned<kVectorBytes>(r.gate) &&
         is_aligned<kVectorBytes>(r.up) && is_aligned<kVectorBytes>(r.d_gate) &&
         is_aligned<kVectorBytes>(r.d_up);
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

cudaError_t swiglu_backward_run(ScalarType dtype, const SwigluBackwardRows& rows,
                                cudaStream_t stream) {
  if (rows.rows < 0 || rows.cols < 0) return cudaErrorInvalidValue;
  if (rows.rows == 0 || rows.cols == 0) return cudaSuccess;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (rows_take_packs<T>(rows)) return launch_swiglu_backward<T, kPackElems<T>>(rows, stream);
    return launch_swiglu_backward<T, 1>(rows, stream);
  });
}

}  // namespace gemmt
