// The one place every op is registered: schema, CPU, CUDA, Meta and Autograd kernels.
// Loading this library (import, or a bare torch.ops.load_library) is all torch.ops.gemmt
// needs: nothing here depends on the Python package.
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.h"
#include "gemmt/activation.h"
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
using OptTensor = std::optional<at::Tensor>;
at::Tensor call_linear(const at::Tensor& x, const at::Tensor& w, const OptTensor& b,
                       std::string_view activation) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&,
                                        std::string_view)>("gemmt::linear");
  return op.call(x, w, b, activation);
}
std::tuple<at::Tensor, at::Tensor> call_linear_with_preact(const at::Tensor& x, const at::Tensor& w,
                                                           const OptTensor& b,
                                                           std::string_view activation) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const OptTensor&, std::string_view)>(
      "gemmt::linear_with_preact");
  return op.call(x, w, b, activation);
}
std::tuple<at::Tensor, at::Tensor> call_linear_activation_backward(const at::Tensor& g,
                                                                   const at::Tensor& preact,
                                                                   std::string_view activation,
                                                                   bool bias_grad) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, std::string_view, bool)>(
      "gemmt::linear_activation_backward");
  return op.call(g, preact, activation, bias_grad);
}
at::Tensor call_linear_bias_backward(const at::Tensor& g) {
  static auto op = op_handle<at::Tensor(const at::Tensor&)>("gemmt::linear_bias_backward");
  return op.call(g);
}
at::Tensor call_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("gemmt::swiglu");
  return op.call(gate, up);
}
std::tuple<at::Tensor, at::Tensor> call_swiglu_backward(const at::Tensor& g, const at::Tensor& gate,
                                                        const at::Tensor& up) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&)>("gemmt::swiglu_backward");
  return op.call(g, gate, up);
}
at::Tensor call_scale(const at::Tensor& x, double factor) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, double)>("gemmt::scale");
  return op.call(x, factor);
}

// A matrix stored column by column (a transposed view of a row-major one), with more than
// one row and column so that the layout is not ambiguous.
bool is_column_major(const at::Tensor& t) {
  return t.dim() == 2 && t.size(0) > 1 && t.size(1) > 1 && t.stride(0) == 1 &&
         t.stride(1) >= t.size(0);
}

// d(a@b) = g @ b^T and a^T @ g: transposed views, no copies; gemm reads the strides. Each
// gradient comes out in its operand's layout: autograd copies a gradient whose strides differ
// from its leaf's into the leaf's layout (AccumulateGrad), so the gradient of a transposed
// weight (x @ W.t(), the usual way to call mm for a Linear) is computed as the transpose of
// a row-major product, (g^T @ a)^T, rather than written row-major and copied afterwards.
class MmFunction : public torch::autograd::Function<MmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    return call_mm(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) {
      ga = is_column_major(a) ? call_mm(b, g.t()).t() : call_mm(g, b.t());
    }
    if (ctx->needs_input_grad(1)) {
      gb = is_column_major(b) ? call_mm(g.t(), a).t() : call_mm(a.t(), g);
    }
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

// d(grad * 2x): with respect to grad, 2x * gg; with respect to x, 2 grad * gg. Both are
// square_backward again, so second derivatives of square run gemmt's kernels too.
class SquareBackwardFunction : public torch::autograd::Function<SquareBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({grad, x});
    return call_square_backward(grad, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& gg = grads[0];
    at::Tensor d_grad, d_x;
    if (ctx->needs_input_grad(0)) d_grad = call_square_backward(gg, saved[1]);
    if (ctx->needs_input_grad(1)) d_x = call_square_backward(gg, saved[0]);
    return {d_grad, d_x};
  }
};

// t with these sizes: t itself when it has them already. Under DTensor every reshape, even
// one that changes nothing, is a trip through its Python dispatch (about as costly on the
// host as the product it feeds), and tensor-parallel layers are often bound by the host.
at::Tensor with_sizes(const at::Tensor& t, at::IntArrayRef sizes) {
  return t.sizes().equals(sizes) ? t : t.reshape(sizes);
}

// y = act(x @ w.T + b). Saved for backward: x, w, b and, for GELU and SiLU, the pre-activation
// z that the forward's epilogue wrote beside y (for ReLU, y itself: it is positive exactly
// where z is). The backward is one fused pass for act'(z) and the bias gradient, then two
// gemmt products: grad_x = gz @ w and grad_w = gz.T @ x.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const OptTensor& b, std::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Activation act = Activation::kNone;
    activation_from_name(activation, &act);  // an unknown name is refused by the op below
    at::Tensor y, saved_act;
    if (act == Activation::kGelu || act == Activation::kGeluTanh || act == Activation::kSilu) {
      std::tie(y, saved_act) = call_linear_with_preact(x, w, b, activation);
    } else {
      y = call_linear(x, w, b, activation);
      if (act == Activation::kReLU) saved_act = y;
    }
    ctx->saved_data["activation"] = static_cast<int64_t>(act);
    ctx->saved_data["has_bias"] = b.has_value() && b->defined();
    ctx->save_for_backward({x, w, b.has_value() ? *b : at::Tensor(), saved_act});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2], &z = saved[3];
    const auto act = static_cast<Activation>(ctx->saved_data["activation"].toInt());
    const bool need_b = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    const int64_t out_features = w.size(0), in_features = w.size(1);
    const at::Tensor g = with_sizes(grads[0], {leading_rows(grads[0]), out_features});
    at::Tensor gz, gb;
    if (at::GradMode::is_enabled()) {
      // Recorded backward (create_graph): recompute z differentiably so that second
      // derivatives reach x, w and b through it.
      gz = g;
      if (act != Activation::kNone) {
        const at::Tensor zz = call_linear(x, w, b.defined() ? OptTensor(b) : OptTensor(), "none");
        gz = aten_activation_backward(g, with_sizes(zz, g.sizes()), act);
      }
      if (need_b) gb = gz.sum(0);
    } else if (act == Activation::kNone) {
      gz = g;
      if (need_b) gb = call_linear_bias_backward(g);
    } else {
      std::tie(gz, gb) = call_linear_activation_backward(g, with_sizes(z, g.sizes()),
                                                         activation_name(act), need_b);
      if (!need_b) gb = at::Tensor();
    }
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) gx = with_sizes(call_mm(gz, w), x.sizes());
    if (ctx->needs_input_grad(1))
      gw = call_mm(gz.t(), with_sizes(x, {leading_rows(x), in_features}));
    return {gx, gw, gb, at::Tensor()};
  }
};

// y = silu(gate) * up. The backward is gemmt's swiglu_backward (one pass for both
// gradients); when the backward is itself recorded (create_graph), the same formulas run as
// differentiable ATen ops, so second derivatives exist.
class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({gate, up});
    return call_swiglu(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    if (at::GradMode::is_enabled()) {
      const at::Tensor s = at::sigmoid(gate);
      return {grads[0] * up * s * (1 + gate * (1 - s)), grads[0] * gate * s};
    }
    auto [d_gate, d_up] = call_swiglu_backward(grads[0], gate, up);
    return {d_gate, d_up};
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
at::Tensor square_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  return apply_or_call<SquareBackwardFunction>(records_graph(grad, x), call_square_backward, grad,
                                               x);
}
at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& w, const OptTensor& b,
                           std::string_view activation) {
  const bool record =
      at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() ||
                                     (b.has_value() && b->defined() && b->requires_grad()));
  if (!record) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_linear(x, w, b, activation);
  }
  return LinearFunction::apply(x, w, b, activation);
}
at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  return apply_or_call<SwigluFunction>(records_graph(gate, up), call_swiglu, gate, up);
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
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation=\"none\") -> Tensor");
  // The pieces of linear's forward and backward (called by its autograd kernel).
  m.def(
      "linear_with_preact(Tensor x, Tensor weight, Tensor? bias=None, "
      "str activation=\"none\") -> (Tensor, Tensor)");
  m.def(
      "linear_activation_backward(Tensor grad, Tensor preact, str activation, bool bias_grad) "
      "-> (Tensor, Tensor)");
  m.def("linear_bias_backward(Tensor grad) -> Tensor");
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
}

#define GEMMT_IMPL_ALL(m, suffix)                                                             \
  m.impl("gemm", &gemmt::wrapper::gemm_##suffix);                                             \
  m.impl("mm", &gemmt::wrapper::mm_##suffix);                                                 \
  m.impl("add", &gemmt::wrapper::add_##suffix);                                               \
  m.impl("square", &gemmt::wrapper::square_##suffix);                                         \
  m.impl("square_backward", &gemmt::wrapper::square_backward_##suffix);                       \
  m.impl("scale", &gemmt::wrapper::scale_##suffix);                                           \
  m.impl("rgb_to_gray", &gemmt::wrapper::rgb_to_gray_##suffix);                               \
  m.impl("normalize_volume", &gemmt::wrapper::normalize_volume_##suffix);                     \
  m.impl("linear", &gemmt::wrapper::linear_##suffix);                                         \
  m.impl("linear_with_preact", &gemmt::wrapper::linear_with_preact_##suffix);                 \
  m.impl("linear_activation_backward", &gemmt::wrapper::linear_activation_backward_##suffix); \
  m.impl("linear_bias_backward", &gemmt::wrapper::linear_bias_backward_##suffix);             \
  m.impl("swiglu", &gemmt::wrapper::swiglu_##suffix);                                         \
  m.impl("swiglu_backward", &gemmt::wrapper::swiglu_backward_##suffix)

TORCH_LIBRARY_IMPL(gemmt, CPU, m) {
  GEMMT_IMPL_ALL(m, cpu);
}
TORCH_LIBRARY_IMPL(gemmt, Meta, m) {
  GEMMT_IMPL_ALL(m, meta);
}
#ifdef GEMMT_WITH_CUDA
TORCH_LIBRARY_IMPL(gemmt, CUDA, m) {
  GEMMT_IMPL_ALL(m, cuda);
}
#endif

TORCH_LIBRARY_IMPL(gemmt, Autograd, m) {
  m.impl("mm", &gemmt::wrapper::mm_autograd);
  m.impl("add", &gemmt::wrapper::add_autograd);
  m.impl("square", &gemmt::wrapper::square_autograd);
  m.impl("scale", &gemmt::wrapper::scale_autograd);
  m.impl("square_backward", &gemmt::wrapper::square_backward_autograd);
  m.impl("linear", &gemmt::wrapper::linear_autograd);
  m.impl("swiglu", &gemmt::wrapper::swiglu_autograd);
}

// FP8 (fp8_ops.cpp). On CUDA: the quantisation kernels (kernels/fp8/) and scaled_mm on the
// Hopper grouped / scaled GEMM; a CUDA tensor never falls through to another implementation.
TORCH_LIBRARY_FRAGMENT(gemmt, m) {
  m.def(
      "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
      "ScalarType out_dtype=bfloat16, str activation=\"none\", bool use_fast_accum=False) "
      "-> Tensor");
  m.def(
      "quantize_fp8(Tensor x, str granularity=\"tensor\", ScalarType dtype=float8_e4m3fn) "
      "-> (Tensor, Tensor)");
  m.def(
      "quantize_fp8_with_transpose(Tensor x, str granularity=\"tensor\", "
      "ScalarType dtype=float8_e4m3fn) -> (Tensor, Tensor, Tensor, Tensor)");
}

#define GEMMT_IMPL_FP8(m, suffix)                                 \
  m.impl("scaled_mm", &gemmt::wrapper::scaled_mm_##suffix);       \
  m.impl("quantize_fp8", &gemmt::wrapper::quantize_fp8_##suffix); \
  m.impl("quantize_fp8_with_transpose", &gemmt::wrapper::quantize_fp8_with_transpose_##suffix)

TORCH_LIBRARY_IMPL(gemmt, CPU, m) {
  GEMMT_IMPL_FP8(m, cpu);
}
TORCH_LIBRARY_IMPL(gemmt, Meta, m) {
  GEMMT_IMPL_FP8(m, meta);
}
TORCH_LIBRARY_IMPL(gemmt, CUDA, m) {
  GEMMT_IMPL_FP8(m, cuda);
}
TORCH_LIBRARY_IMPL(gemmt, Autograd, m) {
  GEMMT_IMPL_FP8(m, autograd);
}

// ---- Mixture of experts (moe_ops.cpp) ----
// grouped_mm follows torch._grouped_mm: offs are int32 cumulative group ends; scaled_grouped_mm
// is its float8 form with row scales (torch._scaled_grouped_mm's layouts). moe_route picks
// each token's top_k experts and the permutation that sorts the (token, k) slots by expert;
// moe_experts runs the gate/up product, silu(gate) * up, the down product and the weighted
// combine; moe_experts_float8 the same on float8 experts (inference). On CUDA the routing runs
// kernels/moe/, grouped_mm the Hopper grouped GEMM, and moe_experts composes them.
TORCH_LIBRARY_FRAGMENT(gemmt, m) {
  m.def(
      "grouped_mm(Tensor a, Tensor b, Tensor? offs=None, Tensor? bias=None, "
      "ScalarType? out_dtype=None, str activation=\"none\") -> Tensor");
  m.def(
      "scaled_grouped_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? offs=None, "
      "Tensor? bias=None, ScalarType? out_dtype=None, str activation=\"none\", "
      "bool use_fast_accum=False) -> Tensor");
  m.def("moe_permute(Tensor expert_ids, int num_experts) -> (Tensor, Tensor)");
  m.def(
      "moe_route(Tensor logits, int top_k, str score=\"softmax\", bool renormalize=True, "
      "int n_group=0, int topk_group=0, Tensor? correction_bias=None) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "moe_experts(Tensor x, Tensor w_gate_up, Tensor w_down, Tensor weights, "
      "Tensor expert_ids, Tensor token_order, Tensor offsets) -> Tensor");
  m.def(
      "moe_experts_float8(Tensor x, Tensor w_gate_up, Tensor w_gate_up_scale, Tensor w_down, "
      "Tensor w_down_scale, Tensor weights, Tensor expert_ids, Tensor token_order, "
      "Tensor offsets) -> Tensor");
}

#define GEMMT_MOE_IMPL_ALL(m, suffix)                                       \
  m.impl("grouped_mm", &gemmt::wrapper::grouped_mm_##suffix);               \
  m.impl("scaled_grouped_mm", &gemmt::wrapper::scaled_grouped_mm_##suffix); \
  m.impl("moe_permute", &gemmt::wrapper::moe_permute_##suffix);             \
  m.impl("moe_route", &gemmt::wrapper::moe_route_##suffix);                 \
  m.impl("moe_experts", &gemmt::wrapper::moe_experts_##suffix);             \
  m.impl("moe_experts_float8", &gemmt::wrapper::moe_experts_float8_##suffix)

TORCH_LIBRARY_IMPL(gemmt, CPU, m) {
  GEMMT_MOE_IMPL_ALL(m, cpu);
}
TORCH_LIBRARY_IMPL(gemmt, Meta, m) {
  GEMMT_MOE_IMPL_ALL(m, meta);
}
#ifdef GEMMT_WITH_CUDA
TORCH_LIBRARY_IMPL(gemmt, CUDA, m) {
  GEMMT_MOE_IMPL_ALL(m, cuda);
}
#endif
TORCH_LIBRARY_IMPL(gemmt, Autograd, m) {
  m.impl("grouped_mm", &gemmt::wrapper::grouped_mm_autograd);
  m.impl("scaled_grouped_mm", &gemmt::wrapper::scaled_grouped_mm_autograd);
  m.impl("moe_route", &gemmt::wrapper::moe_route_autograd);
  m.impl("moe_experts", &gemmt::wrapper::moe_experts_autograd);
  m.impl("moe_experts_float8", &gemmt::wrapper::moe_experts_float8_autograd);
}
