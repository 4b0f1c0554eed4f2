// add, square, scale and square's backward: validation, CPU kernels, CUDA dispatch.
// Arithmetic happens in the dtype's op-math type (float for float16/bfloat16) and is
// rounded once, as PyTorch does, so float32 results are bit-identical to torch. The CPU
// kernels run ATen's vectorised loops (the very kernels of torch.add, torch.square and
// x * factor); gemmt's own loops stay as the *_cpu_reference functions.
#include <ATen/OpMathType.h>
#include <ATen/ScalarOps.h>

#include "common.h"
#include "cpu_loops.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemmt/elementwise.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kAdd = "gemmt::add";
constexpr const char* kSquare = "gemmt::square";
constexpr const char* kSquareBackward = "gemmt::square_backward";
constexpr const char* kScale = "gemmt::scale";

void check_float(const char* op, const char* arg, const at::Tensor& t) {
  check_dtype(op, arg, t, float_dtypes_for(t));
}

void check_binary(const char* op, const char* an, const at::Tensor& a, const char* bn,
                  const at::Tensor& b) {
  check_float(op, an, a);
  check_defined(op, bn, b);
  check_same_device(op, an, a, bn, b);
  check_same_dtype(op, an, a, bn, b);
  check_same_shape(op, an, a, bn, b);
}

at::Tensor empty_like_contiguous(const at::Tensor& t) {
  return new_output(t.sym_sizes(), t.options());
}

#define GEMMT_DISPATCH_FLOATS(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, name, __VA_ARGS__)

}  // namespace

// ---- add ----
at::Tensor add_meta(const at::Tensor& a, const at::Tensor& b) {
  check_binary(kAdd, "a", a, "b", b);
  return empty_like_contiguous(a);
}

at::Tensor add_cpu(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = add_meta(a, b);
  at::AutoDispatchBelowADInplaceOrView guard;
  at::add_out(out, a, b);
  return out;
}

at::Tensor add_cpu_reference(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = add_meta(a, b);
  check_cpu_reference(kAdd, a);
  GEMMT_DISPATCH_FLOATS(a.scalar_type(), "gemmt_add_cpu", [&] {
    using opmath = at::opmath_type<scalar_t>;
    cpu_binary<scalar_t, scalar_t>(kAdd, a, b, out, [](scalar_t x, scalar_t y) {
      return static_cast<scalar_t>(static_cast<opmath>(x) + static_cast<opmath>(y));
    });
  });
  return out;
}

// ---- square ----
at::Tensor square_meta(const at::Tensor& x) {
  check_float(kSquare, "x", x);
  return empty_like_contiguous(x);
}

at::Tensor square_cpu(const at::Tensor& x) {
  at::Tensor out = square_meta(x);
  at::AutoDispatchBelowADInplaceOrView guard;
  at::square_out(out, x);
  return out;
}

at::Tensor square_cpu_reference(const at::Tensor& x) {
  at::Tensor out = square_meta(x);
  check_cpu_reference(kSquare, x);
  GEMMT_DISPATCH_FLOATS(x.scalar_type(), "gemmt_square_cpu", [&] {
    using opmath = at::opmath_type<scalar_t>;
    cpu_unary<scalar_t, scalar_t>(kSquare, x, out, [](scalar_t v) {
      const opmath f = static_cast<opmath>(v);
      return static_cast<scalar_t>(f * f);
    });
  });
  return out;
}

// ---- square_backward: grad * 2x ----
at::Tensor square_backward_meta(const at::Tensor& grad, const at::Tensor& x) {
  check_binary(kSquareBackward, "grad", grad, "x", x);
  return empty_like_contiguous(x);
}

at::Tensor square_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  at::Tensor out = square_backward_meta(grad, x);
  at::AutoDispatchBelowADInplaceOrView guard;
  // (grad * x) * 2 rounds as grad * (2x) does: doubling is exact in every float format
  // (outside the subnormal range), so it commutes with the product's one rounding.
  at::mul_out(out, grad, x);
  out.mul_(at::native::wrapped_scalar_tensor(at::Scalar(2.0)));
  return out;
}

at::Tensor square_backward_cpu_reference(const at::Tensor& grad, const at::Tensor& x) {
  at::Tensor out = square_backward_meta(grad, x);
  check_cpu_reference(kSquareBackward, x);
  GEMMT_DISPATCH_FLOATS(x.scalar_type(), "gemmt_square_backward_cpu", [&] {
    using opmath = at::opmath_type<scalar_t>;
    cpu_binary<scalar_t, scalar_t>(kSquareBackward, grad, x, out, [](scalar_t g, scalar_t v) {
      return static_cast<scalar_t>(static_cast<opmath>(g) * (opmath(2) * static_cast<opmath>(v)));
    });
  });
  return out;
}

// ---- scale ----
at::Tensor scale_meta(const at::Tensor& x, double /*factor*/) {
  check_float(kScale, "x", x);
  return empty_like_contiguous(x);
}

at::Tensor scale_cpu(const at::Tensor& x, double factor) {
  at::Tensor out = scale_meta(x, factor);
  at::AutoDispatchBelowADInplaceOrView guard;
  // A wrapped number, as torch's `x * factor` passes it: it enters ATen's loop in the
  // op-math type, as float(factor) does below. (mul_out with a Scalar would compute into a
  // temporary and copy it.)
  at::mul_out(out, x, at::native::wrapped_scalar_tensor(at::Scalar(factor)));
  return out;
}

at::Tensor scale_cpu_reference(const at::Tensor& x, double factor) {
  at::Tensor out = scale_meta(x, factor);
  check_cpu_reference(kScale, x);
  GEMMT_DISPATCH_FLOATS(x.scalar_type(), "gemmt_scale_cpu", [&] {
    using opmath = at::opmath_type<scalar_t>;
    const opmath f = static_cast<opmath>(factor);
    cpu_unary<scalar_t, scalar_t>(kScale, x, out, [f](scalar_t v) {
      return static_cast<scalar_t>(static_cast<opmath>(v) * f);
    });
  });
  return out;
}

#ifdef GEMMT_WITH_CUDA
at::Tensor add_cuda(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = add_meta(a, b);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(a.device());
  CudaInput ia(kAdd, "a", a), ib(kAdd, "b", b);
  check_launch(kAdd,
               add_run(to_kernel_dtype(a.scalar_type()), out.numel(), ia.ptr, ia.layout_or_null(),
                       ib.ptr, ib.layout_or_null(), out.data_ptr(), stream_for(a)));
  return out;
}

at::Tensor square_cuda(const at::Tensor& x) {
  at::Tensor out = square_meta(x);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(x.device());
  CudaInput ix(kSquare, "x", x);
  check_launch(kSquare, square_run(to_kernel_dtype(x.scalar_type()), out.numel(), ix.ptr,
                                   ix.layout_or_null(), out.data_ptr(), stream_for(x)));
  return out;
}

at::Tensor square_backward_cuda(const at::Tensor& grad, const at::Tensor& x) {
  at::Tensor out = square_backward_meta(grad, x);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(x.device());
  CudaInput ig(kSquareBackward, "grad", grad), ix(kSquareBackward, "x", x);
  check_launch(kSquareBackward,
               square_backward_run(to_kernel_dtype(x.scalar_type()), out.numel(), ig.ptr,
                                   ig.layout_or_null(), ix.ptr, ix.layout_or_null(), out.data_ptr(),
                                   stream_for(x)));
  return out;
}

at::Tensor scale_cuda(const at::Tensor& x, double factor) {
  at::Tensor out = scale_meta(x, factor);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(x.device());
  CudaInput ix(kScale, "x", x);
  check_launch(kScale, scale_run(to_kernel_dtype(x.scalar_type()), out.numel(), ix.ptr,
                                 ix.layout_or_null(), factor, out.data_ptr(), stream_for(x)));
  return out;
}
#endif

}  // namespace gemmt::wrapper
