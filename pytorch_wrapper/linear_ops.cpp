// linear (act(x @ weight.T + bias)) and the pieces of its backward: validation, CPU kernels
// and CUDA dispatch. The forward is one GEMM whose epilogue adds the bias, applies the
// activation and, when the backward needs it, writes the pre-activation; the backward's
// elementwise part (activation derivative and bias gradient) is one pass over the gradient.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "gemm_launch.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemmt/linear.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kLinear = "gemmt::linear";
constexpr const char* kLinearWithPreact = "gemmt::linear_with_preact";
constexpr const char* kActBackward = "gemmt::linear_activation_backward";
constexpr const char* kBiasBackward = "gemmt::linear_bias_backward";

std::string activation_choices() {
  std::string all;
  for (const char* n : kActivationNames) all += std::string(all.empty() ? "" : ", ") + n;
  return all;
}

Activation parse_activation(const char* op, std::string_view name) {
  Activation a;
  TORCH_CHECK(activation_from_name(name, &a), op, ": argument 'activation' expected one of ",
              activation_choices(), ", got '", std::string(name), "'");
  return a;
}

void check_linear_operands(const char* op, const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias) {
  check_dtype(op, "x", x, float_dtypes_for(x));
  TORCH_CHECK(x.dim() >= 1, op,
              ": argument 'x' expected a tensor with at least 1 dimension "
              "(..., in_features), got ",
              describe(x));
  check_dim(op, "weight", weight, 2);
  check_same_dtype(op, "x", x, "weight", weight);
  check_same_device(op, "x", x, "weight", weight);
  TORCH_CHECK(x.sym_size(-1) == weight.sym_size(1), op,
              ": arguments 'x' and 'weight' expected x.shape[-1] == weight.shape[1] "
              "(in_features), got ",
              describe(x), " and ", describe(weight));
  if (bias.has_value() && bias->defined()) {
    check_dim(op, "bias", *bias, 1);
    check_same_dtype(op, "x", x, "bias", *bias);
    check_same_device(op, "x", x, "bias", *bias);
    TORCH_CHECK(bias->sym_size(0) == weight.sym_size(0), op, ": argument 'bias' expected shape [",
                weight.sym_size(0), "] (weight.shape[0], out_features), got ", describe(*bias));
  }
}

std::vector<c10::SymInt> linear_out_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  shape.push_back(weight.sym_size(0));
  return shape;
}

at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// The degenerate product with in_features == 0: z = bias (or 0), out = act(z).
void fill_without_product(const at::Tensor& out2d, const at::Tensor& bias, Activation act,
                          const at::Tensor& preact2d) {
  if (bias.defined()) {
    out2d.copy_(bias.unsqueeze(0).expand_as(out2d));
  } else {
    out2d.zero_();
  }
  if (preact2d.defined()) preact2d.copy_(out2d);
  aten_activation_out(act, out2d, out2d);
}

// The CPU forward: z = x @ w.T + b rounded once in the output dtype by ATen's addmm (as
// F.linear rounds it), then act(z) computed in the op-math type from that rounded z. The
// pre-activation, when wanted, is that same z, so a backward reads the value the output
// came from.
void linear_cpu_run(const at::Tensor& out2d, const at::Tensor& x2d, const at::Tensor& wt,
                    const at::Tensor& bias, Activation act, const at::Tensor& pre2d) {
  at::AutoDispatchBelowADInplaceOrView guard;
  at::Tensor out = out2d;
  at::Tensor z = pre2d.defined() ? pre2d : out2d;
  if (bias.defined()) {
    at::addmm_out(z, bias, x2d, wt);
  } else {
    at::mm_out(z, x2d, wt);
  }
  // act(z) from the rounded z, as torch's activation functions do with F.linear's output.
  aten_activation_out(act, z, out);
}

// out = act(x @ weight.T + bias) (and preact = x @ weight.T + bias when requested), on the
// device of x. Outputs are fresh contiguous tensors. `reference`: on CPU, gemmt's own loops
// (the activation read from the unrounded sum, as the CUDA epilogue does).
std::tuple<at::Tensor, at::Tensor> linear_impl(const char* op, const at::Tensor& x,
                                               const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias_opt,
                                               Activation act, bool with_preact,
                                               bool reference = false) {
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const int64_t rows = leading_rows(x);
  const at::Tensor x2d = x.reshape({rows, in});
  auto shape = linear_out_shape(x, weight);
  at::Tensor out = new_output(shape, x.options());
  at::Tensor preact = with_preact ? new_output(shape, x.options()) : at::Tensor();
  if (out.numel() == 0) return {out, preact};
  const at::Tensor out2d = out.view({rows, out_features});
  const at::Tensor pre2d = with_preact ? preact.view({rows, out_features}) : at::Tensor();
  EpilogueTensors epi;
  // The kernels read the bias as a packed vector (a strided view is copied: n elements).
  epi.bias = defined_or_empty(bias_opt);
  if (epi.bias.defined()) epi.bias = epi.bias.contiguous();
  epi.activation = act;
  epi.preact = pre2d;
  if (in == 0) {
    fill_without_product(out2d, epi.bias, act, pre2d);
    return {out, preact};
  }
  // weight.T is a view: element (p, j) at weight[j, p], read K-major by the kernels.
  const at::Tensor wt = weight.t();
#ifdef GEMMT_WITH_CUDA
  if (x.is_cuda()) {
    const at::cuda::CUDAGuard guard(x.device());
    gemm_cuda_run(op, out2d, x2d, wt, 1.0, 0.0, GemmVariant::kAuto, epi);
    return {out, preact};
  }
#endif
  (void)op;
  if (reference) {
    gemm_cpu_reference_run(out2d, x2d, wt, 1.0, 0.0, epi);
  } else {
    linear_cpu_run(out2d, x2d, wt, epi.bias, act, pre2d);
  }
  return {out, preact};
}

void check_act_backward(const at::Tensor& grad, const at::Tensor& preact, Activation act) {
  check_dtype(kActBackward, "grad", grad, float_dtypes_for(grad));
  TORCH_CHECK(grad.dim() >= 1, kActBackward,
              ": argument 'grad' expected a tensor with at least 1 dimension, got ",
              describe(grad));
  check_defined(kActBackward, "preact", preact);
  check_same_device(kActBackward, "grad", grad, "preact", preact);
  check_same_dtype(kActBackward, "grad", grad, "preact", preact);
  check_same_shape(kActBackward, "grad", grad, "preact", preact);
  TORCH_CHECK(act != Activation::kNone, kActBackward,
              ": argument 'activation' expected an activation other than 'none' (the gradient "
              "of 'none' is grad itself; use linear_bias_backward for the bias), got 'none'");
}

void check_bias_backward(const at::Tensor& grad) {
  check_dtype(kBiasBackward, "grad", grad, float_dtypes_for(grad));
  TORCH_CHECK(grad.dim() >= 1, kBiasBackward,
              ": argument 'grad' expected a tensor with at least 1 dimension, got ",
              describe(grad));
}

// ---- CPU kernels of the backward epilogue ----
template <typename scalar_t>
void act_backward_cpu_kernel(const at::Tensor& g2d, const at::Tensor& z2d, Activation act,
                             const at::Tensor& out2d) {
  using opmath = at::opmath_type<scalar_t>;
  const scalar_t* g = g2d.const_data_ptr<scalar_t>();
  const scalar_t* z = z2d.const_data_ptr<scalar_t>();
  scalar_t* o = out2d.mutable_data_ptr<scalar_t>();
  at::parallel_for(0, g2d.numel(), 32768, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const opmath d = activation_derivative(act, static_cast<opmath>(z[i]));
      o[i] = static_cast<scalar_t>(static_cast<opmath>(g[i]) * d);
    }
  });
}

// Column sums of a contiguous rows x cols matrix, each column added top to bottom.
template <typename scalar_t>
void column_sums_cpu_kernel(const at::Tensor& g2d, const at::Tensor& out) {
  using opmath = at::opmath_type<scalar_t>;
  const int64_t rows = g2d.size(0), cols = g2d.size(1);
  const scalar_t* g = g2d.const_data_ptr<scalar_t>();
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  constexpr int64_t kColBlock = 64;
  at::parallel_for(0, (cols + kColBlock - 1) / kColBlock, 1, [&](int64_t begin, int64_t end) {
    std::vector<opmath> acc(kColBlock);
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t j0 = blk * kColBlock, width = std::min(kColBlock, cols - j0);
      std::fill(acc.begin(), acc.end(), opmath(0));
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* row = g + r * cols + j0;
        for (int64_t j = 0; j < width; ++j) acc[j] += static_cast<opmath>(row[j]);
      }
      for (int64_t j = 0; j < width; ++j) o[j0 + j] = static_cast<scalar_t>(acc[j]);
    }
  });
}

#define GEMMT_DISPATCH_LINEAR_FLOATS(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, name, __VA_ARGS__)

at::Tensor flat_2d(const at::Tensor& t) {
  return t.contiguous().view({leading_rows(t), t.size(-1)});
}

at::Tensor empty_bias_grad(const at::Tensor& grad, bool wanted) {
  return new_output({wanted ? grad.sym_size(-1) : c10::SymInt(0)}, grad.options());
}

}  // namespace

// ---- linear ----
at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, std::string_view activation) {
  check_linear_operands(kLinear, x, weight, bias);
  parse_activation(kLinear, activation);
  return new_output(linear_out_shape(x, weight), x.options());
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, std::string_view activation) {
  check_linear_operands(kLinear, x, weight, bias);
  return std::get<0>(
      linear_impl(kLinear, x, weight, bias, parse_activation(kLinear, activation), false));
}

std::tuple<at::Tensor, at::Tensor> linear_cpu_reference(const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias,
                                                        std::string_view activation) {
  check_linear_operands(kLinearWithPreact, x, weight, bias);
  check_cpu_reference(kLinearWithPreact, x);
  return linear_impl(kLinearWithPreact, x, weight, bias,
                     parse_activation(kLinearWithPreact, activation), true, true);
}

std::tuple<at::Tensor, at::Tensor> linear_with_preact_meta(const at::Tensor& x,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           std::string_view activation) {
  check_linear_operands(kLinearWithPreact, x, weight, bias);
  parse_activation(kLinearWithPreact, activation);
  const auto shape = linear_out_shape(x, weight);
  return {new_output(shape, x.options()), new_output(shape, x.options())};
}

std::tuple<at::Tensor, at::Tensor> linear_with_preact_cpu(const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          std::string_view activation) {
  check_linear_operands(kLinearWithPreact, x, weight, bias);
  return linear_impl(kLinearWithPreact, x, weight, bias,
                     parse_activation(kLinearWithPreact, activation), true);
}

// ---- linear_activation_backward: (grad * act'(preact), column sums of that) ----
std::tuple<at::Tensor, at::Tensor> linear_activation_backward_meta(const at::Tensor& grad,
                                                                   const at::Tensor& preact,
                                                                   std::string_view activation,
                                                                   bool bias_grad) {
  check_act_backward(grad, preact, parse_activation(kActBackward, activation));
  return {new_output(grad.sym_sizes(), grad.options()), empty_bias_grad(grad, bias_grad)};
}

std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cpu(const at::Tensor& grad,
                                                                  const at::Tensor& preact,
                                                                  std::string_view activation,
                                                                  bool bias_grad) {
  const Activation act = parse_activation(kActBackward, activation);
  check_act_backward(grad, preact, act);
  at::Tensor out = new_output(grad.sym_sizes(), grad.options());
  at::Tensor bias = empty_bias_grad(grad, bias_grad);
  if (grad.numel() == 0) {
    if (bias_grad) bias.zero_();
    return {out, bias};
  }
  // ATen's activation backwards: act'(z) in the op-math type, times grad, rounded once.
  at::AutoDispatchBelowADInplaceOrView guard;
  switch (act) {
    case Activation::kReLU:
      at::threshold_backward_out(out, grad, preact, 0);
      break;
    case Activation::kGelu:
      at::gelu_backward_out(out, grad, preact, "none");
      break;
    case Activation::kGeluTanh:
      at::gelu_backward_out(out, grad, preact, "tanh");
      break;
    default:
      at::silu_backward_out(out, grad, preact);
      break;
  }
  if (bias_grad) {
    at::sum_out(bias, out.view({leading_rows(grad), grad.size(-1)}), at::IntArrayRef{0});
  }
  return {out, bias};
}

std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cpu_reference(
    const at::Tensor& grad, const at::Tensor& preact, std::string_view activation, bool bias_grad) {
  const Activation act = parse_activation(kActBackward, activation);
  check_act_backward(grad, preact, act);
  check_cpu_reference(kActBackward, grad);
  at::Tensor out = new_output(grad.sym_sizes(), grad.options());
  at::Tensor bias = empty_bias_grad(grad, bias_grad);
  if (grad.numel() == 0) {
    if (bias_grad) bias.zero_();
    return {out, bias};
  }
  const at::Tensor out2d = out.view({leading_rows(grad), grad.size(-1)});
  GEMMT_DISPATCH_LINEAR_FLOATS(grad.scalar_type(), "gemmt_linear_act_backward_cpu", [&] {
    act_backward_cpu_kernel<scalar_t>(flat_2d(grad), flat_2d(preact), act, out2d);
    if (bias_grad) column_sums_cpu_kernel<scalar_t>(out2d, bias);
  });
  return {out, bias};
}

// ---- linear_bias_backward: column sums of grad ----
at::Tensor linear_bias_backward_meta(const at::Tensor& grad) {
  check_bias_backward(grad);
  return empty_bias_grad(grad, true);
}

at::Tensor linear_bias_backward_cpu(const at::Tensor& grad) {
  check_bias_backward(grad);
  at::Tensor bias = empty_bias_grad(grad, true);
  if (grad.numel() == 0) return bias.zero_();
  at::AutoDispatchBelowADInplaceOrView guard;
  // ATen's column sums accumulate in the op-math type, as the reference loop does.
  at::sum_out(bias, grad.reshape({leading_rows(grad), grad.size(-1)}), at::IntArrayRef{0});
  return bias;
}

at::Tensor linear_bias_backward_cpu_reference(const at::Tensor& grad) {
  check_bias_backward(grad);
  check_cpu_reference(kBiasBackward, grad);
  at::Tensor bias = empty_bias_grad(grad, true);
  if (grad.numel() == 0) return bias.zero_();
  GEMMT_DISPATCH_LINEAR_FLOATS(grad.scalar_type(), "gemmt_linear_bias_backward_cpu",
                               [&] { column_sums_cpu_kernel<scalar_t>(flat_2d(grad), bias); });
  return bias;
}

#ifdef GEMMT_WITH_CUDA
// linear_impl dispatches on the tensors' device: the CUDA kernels share the CPU entry's body.
at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, std::string_view activation) {
  return linear_cpu(x, weight, bias, activation);
}

std::tuple<at::Tensor, at::Tensor> linear_with_preact_cuda(const at::Tensor& x,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           std::string_view activation) {
  return linear_with_preact_cpu(x, weight, bias, activation);
}

namespace {
// One launch of the fused backward epilogue on contiguous 2-D views.
void run_linear_backward(const char* op, const at::Tensor& g2d, const at::Tensor& z2d,
                         Activation act, const at::Tensor& out2d, const at::Tensor& bias) {
  const at::cuda::CUDAGuard guard(g2d.device());
  const int sms = usable_sm_count(op);
  const ScalarType dtype = to_kernel_dtype(g2d.scalar_type());
  const int64_t rows = g2d.size(0), cols = g2d.size(1);
  const std::size_t ws_bytes = linear_backward_workspace_bytes(dtype, rows, cols, sms);
  at::Tensor ws;
  if (ws_bytes > 0 && bias.defined()) {
    ws = at::empty({static_cast<int64_t>(ws_bytes)}, g2d.options().dtype(at::kByte));
  }
  check_launch(op,
               linear_backward_run(dtype, rows, cols, g2d.const_data_ptr(),
                                   z2d.defined() ? z2d.const_data_ptr() : nullptr, act,
                                   out2d.defined() ? out2d.data_ptr() : nullptr,
                                   bias.defined() ? bias.data_ptr() : nullptr,
                                   ws.defined() ? ws.data_ptr() : nullptr, sms, stream_for(g2d)));
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cuda(const at::Tensor& grad,
                                                                   const at::Tensor& preact,
                                                                   std::string_view activation,
                                                                   bool bias_grad) {
  const Activation act = parse_activation(kActBackward, activation);
  check_act_backward(grad, preact, act);
  at::Tensor out = new_output(grad.sym_sizes(), grad.options());
  at::Tensor bias = empty_bias_grad(grad, bias_grad);
  if (grad.numel() == 0) {
    if (bias_grad) bias.zero_();
    return {out, bias};
  }
  run_linear_backward(kActBackward, flat_2d(grad), flat_2d(preact), act,
                      out.view({leading_rows(grad), grad.size(-1)}),
                      bias_grad ? bias : at::Tensor());
  return {out, bias};
}

at::Tensor linear_bias_backward_cuda(const at::Tensor& grad) {
  check_bias_backward(grad);
  at::Tensor bias = empty_bias_grad(grad, true);
  if (grad.numel() == 0) return bias.zero_();
  run_linear_backward(kBiasBackward, flat_2d(grad), at::Tensor(), Activation::kNone, at::Tensor(),
                      bias);
  return bias;
}
#endif

}  // namespace gemmt::wrapper
