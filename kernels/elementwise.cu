// Float elementwise ops (add, square, scale, square_backward) as functors on the shared
// engine (elementwise_engine.cuh): inputs are widened to float32 (float64 stays double), the
// functor runs in that type and the result is rounded once, to nearest even, to the tensor's
// dtype. That is PyTorch's "opmath" scheme, so results match it bit for bit.
//
// Pack width is 16 bytes (4 floats or 8 halfs). Unary ops move one pack per thread and
// binary ops two packs of each input: on an H100 a 1 GiB float32 square ran at 3011 GB/s
// with one pack per thread, 3004 with two and 2983 with four (cudaMemcpy: 2995), i.e. more,
// smaller blocks keep the memory busier than deeper unrolling once 8 blocks of 256 threads
// are resident per SM.
#include <cstdint>

#include <cuda_runtime.h>

#include "common/elementwise_engine.cuh"
#include "gemmt/elementwise.h"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace {

// add_rn / mul_rn pin IEEE round-to-nearest single operations: the compiler may not fuse
// them into an FMA, which would change the rounding, nor flush subnormals.
struct AddOp {
  template <typename F>
  __device__ __forceinline__ F operator()(F a, F b) const {
    return add_rn(a, b);
  }
};

struct SquareOp {
  template <typename F>
  __device__ __forceinline__ F operator()(F x) const {
    return mul_rn(x, x);
  }
};

template <typename F>
struct ScaleOp {
  F factor;
  __device__ __forceinline__ F operator()(F x) const { return mul_rn(x, factor); }
};

// grad * (2 * x) in the order autograd evaluates pow(x, 2)'s backward: 2 * x is a tensor
// op of its own, rounded to T (exact unless it overflows T, then inf, as in PyTorch), and
// the product rounds once more. 2 * (x * grad) would differ when x * grad lands in the
// subnormal range.
template <typename T>
struct SquareBackwardOp {
  using F = opmath_t<T>;
  __device__ __forceinline__ F operator()(F grad, F x) const {
    const F twice_x = to_opmath(from_opmath<T>(mul_rn(F(2), x)));
    return mul_rn(grad, twice_x);
  }
};

// make_op(TypeTag<T>{}) builds the functor for storage type T.
template <int kArity, class MakeOp>
cudaError_t run_float_op(ScalarType dtype, std::int64_t numel, const MakeOp& make_op,
                         const void* const (&inputs)[kArity],
                         const StridedLayout* const (&layouts)[kArity], void* out,
                         cudaStream_t stream) {
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kUnroll = kArity == 1 ? 1 : 2;
    return engine::launch<kPackElems<T>, kUnroll, T, T>(make_op(tag), numel, inputs, layouts, out,
                                                        stream);
  });
}

}  // namespace

cudaError_t add_run(ScalarType dtype, int64_t numel, const void* a, const StridedLayout* a_layout,
                    const void* b, const StridedLayout* b_layout, void* out, cudaStream_t stream) {
  return run_float_op<2>(
      dtype, numel, [](auto) { return AddOp{}; }, {a, b}, {a_layout, b_layout}, out, stream);
}

cudaError_t square_run(ScalarType dtype, int64_t numel, const void* x,
                       const StridedLayout* x_layout, void* out, cudaStream_t stream) {
  return run_float_op<1>(
      dtype, numel, [](auto) { return SquareOp{}; }, {x}, {x_layout}, out, stream);
}

cudaError_t scale_run(ScalarType dtype, int64_t numel, const void* x, const StridedLayout* x_layout,
                      double factor, void* out, cudaStream_t stream) {
  return run_float_op<1>(
      dtype, numel,
      [factor](auto tag) {
        using F = opmath_t<typename decltype(tag)::type>;
        return ScaleOp<F>{static_cast<F>(factor)};
      },
      {x}, {x_layout}, out, stream);
}

cudaError_t square_backward_run(ScalarType dtype, int64_t numel, const void* grad,
                                const StridedLayout* grad_layout, const void* x,
                                const StridedLayout* x_layout, void* out, cudaStream_t stream) {
  return run_float_op<2>(
      dtype, numel, [](auto tag) { return SquareBackwardOp<typename decltype(tag)::type>{}; },
      {grad, x}, {grad_layout, x_layout}, out, stream);
}

}  // namespace gemmt
