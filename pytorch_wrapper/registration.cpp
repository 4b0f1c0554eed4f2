// The one place every op is registered: schema, CPU, CUDA, Meta and Autograd kernels.
// Loading this library (import, or a bare torch.ops.load_library) is all torch.ops.gemmt
// needs: nothing here depends on the Python package.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops.h"

namespace gemmt::wrapper {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Typed handles that call back into the dispatcher, so backward passes run gemmt kernels
// on whatever backend the tensors live on.
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

at::Tensor call_mm(const at::Tensor& a, const at::Tensor& b) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("gemmt::mm");
  return op.call(a, b);
}
at::Tensor call_add(const at::Tensor& a, const at::Tensor& b) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("gemmt::add");
  return op.call(a, b);
}
at::Tensor call_square(const at::Tensor& x) {
  static auto op = op_handle<at::Tensor(const at::Tensor&)>("gemmt::square");
  return op.call(x);
}
at::Tensor call_square_backward(const at::Tensor& g, const at::Tensor& x) {
  static auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("gemmt::square_backward");
  return op.call(g, x);
}
at::Tensor call_scale(const at::Tensor& x, double factor) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, double)>("gemmt::scale");
  return op.call(x, factor);
}

// d(a@b) = g @ b^T and a^T @ g: transposed views, no copies; gemm reads the strides.
class MmFunction : public torch::autograd::Function<MmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    return call_mm(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = call_mm(g, saved[1].t());
    if (ctx->needs_input_grad(1)) gb = call_mm(saved[0].t(), g);
    return {ga, gb};
  }
};

class AddFunction : public torch::autograd::Function<AddFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_add(a, b);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0], grads[0]};
  }
};

class SquareFunction : public torch::autograd::Function<SquareFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x});
    return call_square(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {call_square_backward(grads[0], ctx->get_saved_variables()[0])};
  }
};

class ScaleFunction : public torch::autograd::Function<ScaleFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double factor) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["factor"] = factor;
    return call_scale(x, factor);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {call_scale(grads[0], ctx->saved_data["factor"].toDouble()), at::Tensor()};
  }
};

// True when the call must be recorded for backward. Otherwise the Autograd kernels go
// straight to the backend kernel: Function::apply would only pack and unpack its inputs, a
// measurable share of a small tensor's per-call time.
bool records_graph(const at::Tensor& a, const at::Tensor& b = at::Tensor()) {
  return at::GradMode::is_enabled() &&
         ((a.defined() && a.requires_grad()) || (b.defined() && b.requires_grad()));
}

template <class Function, class Direct, class... Args>
at::Tensor apply_or_call(bool record, Direct direct, const Args&... args) {
  if (!record) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return direct(args...);
  }
  return Function::apply(args...);
}

at::Tensor mm_autograd(const at::Tensor& a, const at::Tensor& b) {
  return apply_or_call<MmFunction>(records_graph(a, b), call_mm, a, b);
}
at::Tensor add_autograd(const at::Tensor& a, const at::Tensor& b) {
  return apply_or_call<AddFunction>(records_graph(a, b), call_add, a, b);
}
at::Tensor square_autograd(const at::Tensor& x) {
  return apply_or_call<SquareFunction>(records_graph(x), call_square, x);
}
at::Tensor scale_autograd(const at::Tensor& x, double factor) {
  return apply_or_call<ScaleFunction>(records_graph(x), call_scale, x, factor);
}

}  // namespace
}  // namespace gemmt::wrapper

TORCH_LIBRARY(gemmt, m) {
  m.def(
      "gemm(Tensor(a!) c, Tensor a, Tensor b, float alpha=1., float beta=0., *, "
      "str variant=\"auto\") -> ()");
  m.def("mm(Tensor a, Tensor b) -> Tensor");
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.def("square(Tensor x) -> Tensor");
  m.def("square_backward(Tensor grad, Tensor x) -> Tensor");
  m.def("scale(Tensor x, float factor=2.) -> Tensor");
  m.def("rgb_to_gray(Tensor img, bool bgr=False) -> Tensor");
  m.def("normalize_volume(Tensor vol, float max_val) -> Tensor");
}

#define GEMMT_IMPL_ALL(m, suffix)                                  \
  m.impl("gemm", &gemmt::wrapper::gemm_##suffix);                  \
  m.impl("mm", &gemmt::wrapper::mm_##suffix);                      \
  m.impl("add", &gemmt::wrapper::add_##suffix);                    \
  m.impl("square", &gemmt::wrapper::square_##suffix);              \
  m.impl("square_backward", &gemmt::wrapper::square_backward_##suffix); \
  m.impl("scale", &gemmt::wrapper::scale_##suffix);                \
  m.impl("rgb_to_gray", &gemmt::wrapper::rgb_to_gray_##suffix);    \
  m.impl("normalize_volume", &gemmt::wrapper::normalize_volume_##suffix)

TORCH_LIBRARY_IMPL(gemmt, CPU, m) { GEMMT_IMPL_ALL(m, cpu); }
TORCH_LIBRARY_IMPL(gemmt, Meta, m) { GEMMT_IMPL_ALL(m, meta); }
#ifdef GEMMT_WITH_CUDA
TORCH_LIBRARY_IMPL(gemmt, CUDA, m) { GEMMT_IMPL_ALL(m, cuda); }
#endif

TORCH_LIBRARY_IMPL(gemmt, Autograd, m) {
  m.impl("mm", &gemmt::wrapper::mm_autograd);
  m.impl("add", &gemmt::wrapper::add_autograd);
  m.impl("square", &gemmt::wrapper::square_autograd);
  m.impl("scale", &gemmt::wrapper::scale_autograd);
}
