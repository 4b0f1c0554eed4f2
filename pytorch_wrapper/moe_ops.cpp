// Mixture-of-experts ops: grouped_mm (the layouts and offsets of torch._grouped_mm), the
// routing (moe_route, moe_permute) and the expert layer (moe_experts). Argument checks, CPU
// kernels, Meta kernels and the autograd kernels.
//
// The CPU kernels are the reference the CUDA kernels are measured against: a loop of ATen
// products over the groups, written into one output. On CUDA, the routing (moe_route,
// moe_permute) runs gemmt's kernels in kernels/moe/, and moe_experts is composed of the gather
// kernel, grouped_mm, swiglu and the combine kernel, recorded as such under autograd for 16-bit
// tensors (the gather and combine as nodes whose backward passes are kernels too); grouped_mm
// runs the Hopper grouped GEMM (grouped_gemm_cuda.cpp) for 16-bit operands, never a detour
// through torch._grouped_mm.
//
// Offsets are data. The CPU kernels read and check them; the Meta kernels never do (their
// output shapes follow from the operands' shapes alone), so a CUDA kernel can take them on
// the device without a host synchronisation and stay capturable in a CUDA graph.
#include <torch/autograd.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common.h"
#include "gemmt/activation.h"
#include "grouped_gemm_cuda.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include "gemmt/moe.h"
#endif

namespace gemmt::wrapper {
namespace {

using OptTensor = std::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kGroupedMm = "gemmt::grouped_mm";
constexpr const char* kScaledGroupedMm = "gemmt::scaled_grouped_mm";
constexpr const char* kMoePermute = "gemmt::moe_permute";
constexpr const char* kMoeRoute = "gemmt::moe_route";
constexpr const char* kMoeExperts = "gemmt::moe_experts";
constexpr const char* kMoeExpertsFloat8 = "gemmt::moe_experts_float8";

bool has(const OptTensor& t) {
  return t.has_value() && t->defined();
}

// t in this dtype, with no call to Tensor::to when it has it already: aten::to then returns
// its own input, which torch.library.opcheck's schema check refuses from an op called below
// autograd.
at::Tensor as_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

// ---- grouped_mm: checks and shapes ----

// Which of torch._grouped_mm's layouts a call is, named by the ranks of a and b:
//   k2d3d  a (M, K), b (G, K, N), offs over M   -> (M, N)     rows of a grouped by expert
//   k3d3d  a (G, M, K), b (G, K, N), no offs    -> (G, M, N)  a batched product
//   k2d2d  a (M, K), b (K, N), offs over K      -> (G, M, N)  per-group products over K
//   k3d2d  a (G, M, K), b (K, N), offs over N   -> (M, N)     columns of b grouped
// Each layout's backward is made of the others (GroupedMmFunction below).
enum class Layout { k2d3d, k3d3d, k2d2d, k3d2d };

Layout layout_of(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() == 2) return b.dim() == 2 ? Layout::k2d2d : Layout::k2d3d;
  return b.dim() == 2 ? Layout::k3d2d : Layout::k3d3d;
}

std::string activation_choices() {
  std::string s;
  for (int i = 0; i < static_cast<int>(Activation::kCount); ++i) {
    if (i) s += ", ";
    s += std::string("'") + kActivationNames[i] + "'";
  }
  return s;
}

Activation parse_activation(const char* op, std::string_view name) {
  Activation a = Activation::kNone;
  TORCH_CHECK(activation_from_name(name, &a), op, ": argument 'activation' expected one of ",
              activation_choices(), ", got '", std::string(name), "'");
  return a;
}

bool reduced_float(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

struct GroupedMmShape {
  Layout layout;
  std::vector<c10::SymInt> out_sizes;
  at::ScalarType out_dtype;
  Activation activation;
  bool block_scales = false;  // scaled_grouped_mm: 1x128 scales of a, 128x128 ones of b
};

// The layout, the offsets and the bias's shape (not its dtype) of a call with torch._grouped_mm's
// layouts, and the output's sizes: what grouped_mm and scaled_grouped_mm check alike.
GroupedMmShape check_grouped_layout(const char* op, const at::Tensor& a, const at::Tensor& b,
                                    const OptTensor& offs, const OptTensor& bias) {
  check_same_device(op, "a", a, "b", b);
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, op, ": argument 'a' expected a 2-D or 3-D tensor, got ",
              describe(a));
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, op, ": argument 'b' expected a 2-D or 3-D tensor, got ",
              describe(b));
  TORCH_CHECK(a.sym_size(-1) == b.sym_size(-2), op,
              ": arguments 'a' and 'b' expected a.shape[-1] == b.shape[-2] (the contraction "
              "dimension), got ",
              describe(a), " and ", describe(b));
  const Layout layout = layout_of(a, b);
  if (layout == Layout::k3d3d) {
    TORCH_CHECK(!has(offs), op,
                ": argument 'offs' expected None when a and b are both 3-D (one group per batch "
                "entry), got ",
                describe(*offs));
    TORCH_CHECK(a.sym_size(0) == b.sym_size(0), op,
                ": arguments 'a' and 'b' expected the same number of groups (a.shape[0] == "
                "b.shape[0]), got ",
                describe(a), " and ", describe(b));
  } else {
    TORCH_CHECK(has(offs), op,
                ": argument 'offs' expected a 1-D int32 tensor of cumulative group end offsets "
                "when a is ",
                a.dim(), "-D and b is ", b.dim(), "-D, got None");
    check_dtype(op, "offs", *offs, {at::kInt});
    check_dim(op, "offs", *offs, 1);
    check_same_device(op, "a", a, "offs", *offs);
    if (layout == Layout::k2d3d) {
      TORCH_CHECK(offs->sym_size(0) == b.sym_size(0), op,
                  ": argument 'offs' expected one offset per group of b (b.shape[0] = ",
                  b.sym_size(0), "), got ", describe(*offs));
    } else if (layout == Layout::k3d2d) {
      TORCH_CHECK(offs->sym_size(0) == a.sym_size(0), op,
                  ": argument 'offs' expected one offset per group of a (a.shape[0] = ",
                  a.sym_size(0), "), got ", describe(*offs));
    }
  }
  if (has(bias)) {
    TORCH_CHECK(b.dim() == 3, op,
                ": argument 'bias' is supported only when b is 3-D (one bias row per group), got "
                "b ",
                describe(b));
    check_same_device(op, "a", a, "bias", *bias);
    TORCH_CHECK(bias->dim() == 2 && bias->sym_size(0) == b.sym_size(0) &&
                    bias->sym_size(1) == b.sym_size(2),
                op, ": argument 'bias' expected shape [", b.sym_size(0), ", ", b.sym_size(2),
                "] (b.shape[0], b.shape[2]), got ", describe(*bias));
  }
  GroupedMmShape s{layout, {}, a.scalar_type(), Activation::kNone};
  switch (layout) {
    case Layout::k2d3d:
      s.out_sizes = {a.sym_size(0), b.sym_size(2)};
      break;
    case Layout::k3d3d:
      s.out_sizes = {a.sym_size(0), a.sym_size(1), b.sym_size(2)};
      break;
    case Layout::k2d2d:
      s.out_sizes = {offs->sym_size(0), a.sym_size(0), b.sym_size(1)};
      break;
    case Layout::k3d2d:
      s.out_sizes = {a.sym_size(1), b.sym_size(1)};
      break;
  }
  return s;
}

GroupedMmShape check_grouped_mm(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                                const OptTensor& bias, std::optional<at::ScalarType> out_dtype,
                                std::string_view activation) {
  const char* op = kGroupedMm;
  check_dtype(op, "a", a, float_dtypes_for(a));
  check_dtype(op, "b", b, float_dtypes_for(b));
  check_same_dtype(op, "a", a, "b", b);
  GroupedMmShape s = check_grouped_layout(op, a, b, offs, bias);
  if (has(bias)) check_same_dtype(op, "a", a, "bias", *bias);
  const at::ScalarType od = out_dtype.value_or(a.scalar_type());
  TORCH_CHECK(od == a.scalar_type() || (od == at::kFloat && reduced_float(a.scalar_type())), op,
              ": argument 'out_dtype' expected None, ", a.scalar_type(),
              reduced_float(a.scalar_type()) ? " or Float" : "", " (for a ", a.scalar_type(),
              " a), got ", od);
  s.out_dtype = od;
  s.activation = parse_activation(op, activation);
  return s;
}

// ---- scaled_grouped_mm: checks ----

// The row scales of an operand of scaled_grouped_mm, as torch._scaled_grouped_mm takes them: a
// 2-D operand's one 1-D tensor over its scaled extent (times the groups when both operands are
// 2-D: a split of K has a set a group), a 3-D operand's (groups, extent) with a unit stride
// along the extent.
void check_group_scale(const char* arg, const at::Tensor& s, const at::Tensor& t, int scaled_dim,
                       const c10::SymInt& groups, bool per_group_sets) {
  const char* op = kScaledGroupedMm;
  check_dtype(op, arg, s, {at::kFloat});
  if (t.dim() == 2) {
    const c10::SymInt want =
        per_group_sets ? t.sym_size(scaled_dim) * groups : t.sym_size(scaled_dim);
    TORCH_CHECK(s.dim() == 1 && s.sym_size(0) == want, op, ": argument '", arg,
                "' expected a 1-D float32 tensor of ", want, " row scales (",
                per_group_sets ? "one set a group, " : "", "for ", describe(t), "), got ",
                describe(s));
  } else {
    const c10::SymInt extent = t.sym_size(1 + scaled_dim);
    TORCH_CHECK(s.dim() == 2 && s.sym_size(0) == t.sym_size(0) && s.sym_size(1) == extent, op,
                ": argument '", arg, "' expected a float32 tensor of shape [", t.sym_size(0), ", ",
                extent, "] (a scale a group and row), got ", describe(s));
    TORCH_CHECK(extent <= 1 || s.sym_stride(1) == 1, op, ": argument '", arg,
                "' expected a unit stride along its last dimension, got strides ", s.sym_strides());
  }
}

constexpr int64_t kScaleBlock = 128;

// Block scales (DeepSeek-V3's recipe, scaled_mm's 1x128 x 128x128 pairing a group at a time):
// a's 1x128 blocks along K, (M, K/128) for a 2-D a or (G, M, K/128) for a 3-D one, and each
// group's 128x128 blocks of b, (G, K/128, ceil(N/128)); a 2-D x 3-D or 3-D x 3-D product, K a
// multiple of 128.
void check_group_block_scales(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                              const at::Tensor& sb, Layout layout) {
  const char* op = kScaledGroupedMm;
  TORCH_CHECK(layout == Layout::k2d3d || layout == Layout::k3d3d, op,
              ": block scales (scale_a with a dimension for K's 128-blocks) expected a 2-D x 3-D "
              "or 3-D x 3-D product (a grouped forward or input gradient), got a ",
              describe(a), " and b ", describe(b));
  const c10::SymInt k = a.sym_size(-1);
  TORCH_CHECK(k % kScaleBlock == 0, op,
              ": block scales expected the contraction dimension (a.shape[-1]) a multiple of 128, "
              "got ",
              k);
  const c10::SymInt kb = k / kScaleBlock;
  const c10::SymInt nb = (b.sym_size(2) + (kScaleBlock - 1)) / kScaleBlock;
  check_dtype(op, "scale_a", sa, {at::kFloat});
  check_dtype(op, "scale_b", sb, {at::kFloat});
  const bool a_ok = a.dim() == 2 ? (sa.sym_size(0) == a.sym_size(0) && sa.sym_size(1) == kb)
                                 : (sa.sym_size(0) == a.sym_size(0) &&
                                    sa.sym_size(1) == a.sym_size(1) && sa.sym_size(2) == kb);
  if (!a_ok) {
    // a's sizes as symbols (a traced call has no concrete ones), all but K.
    const std::string rows =
        a.dim() == 3 ? c10::str(a.sym_size(0), ", ", a.sym_size(1)) : c10::str(a.sym_size(0));
    TORCH_CHECK(false, op, ": argument 'scale_a' expected 1x128 block scales of shape [", rows,
                ", ", kb, "] for a ", describe(a), ", got ", describe(sa));
  }
  TORCH_CHECK(sb.dim() == 3 && sb.sym_size(0) == b.sym_size(0) && sb.sym_size(1) == kb &&
                  sb.sym_size(2) == nb,
              op, ": argument 'scale_b' expected 128x128 block scales of shape [", b.sym_size(0),
              ", ", kb, ", ", nb, "] (a group's K/128 by ceil(N/128) blocks) for b ", describe(b),
              ", got ", describe(sb));
}

GroupedMmShape check_scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b,
                                       const at::Tensor& sa, const at::Tensor& sb,
                                       const OptTensor& offs, const OptTensor& bias,
                                       std::optional<at::ScalarType> out_dtype,
                                       std::string_view activation) {
  const char* op = kScaledGroupedMm;
  check_dtype(op, "a", a, {at::kFloat8_e4m3fn, at::kFloat8_e5m2});
  check_dtype(op, "b", b, {at::kFloat8_e4m3fn, at::kFloat8_e5m2});
  TORCH_CHECK(a.scalar_type() != at::kFloat8_e5m2 || b.scalar_type() != at::kFloat8_e5m2, op,
              ": arguments 'a' and 'b' expected at most one Float8_e5m2 operand, got both");
  GroupedMmShape s = check_grouped_layout(op, a, b, offs, bias);
  check_same_device(op, "a", a, "scale_a", sa);
  check_same_device(op, "a", a, "scale_b", sb);
  // Row scales have one dimension fewer than their operand; block scales as many.
  s.block_scales = sa.dim() == a.dim();
  if (s.block_scales) {
    check_group_block_scales(a, b, sa, sb, s.layout);
  } else {
    const bool sets = s.layout == Layout::k2d2d;
    const c10::SymInt groups = has(offs) ? offs->sym_size(0) : a.sym_size(0);
    check_group_scale("scale_a", sa, a, 0, groups, sets);
    check_group_scale("scale_b", sb, b, 1, groups, sets);
  }
  const c10::SymInt k = a.sym_size(-1);
  TORCH_CHECK(k % 16 == 0, op,
              ": the contraction dimension (a.shape[-1]) expected a multiple of 16 "
              "(16-byte rows of float8), got ",
              k);
  if (has(bias)) check_dtype(op, "bias", *bias, {at::kFloat, at::kHalf, at::kBFloat16});
  const at::ScalarType od = out_dtype.value_or(at::kBFloat16);
  TORCH_CHECK(od == at::kBFloat16 || od == at::kHalf || od == at::kFloat, op,
              ": argument 'out_dtype' expected None (BFloat16), BFloat16, Half or Float, got ", od);
  s.out_dtype = od;
  s.activation = parse_activation(op, activation);
  return s;
}

// The cumulative group ends, checked: non-negative, non-decreasing, none past `extent`.
std::vector<int64_t> read_offsets(const char* op, const at::Tensor& offs, int64_t extent,
                                  const char* extent_name) {
  // (On the host: a GPU tensor is copied, which synchronises.)
  const at::Tensor o = offs.is_cpu() ? offs.contiguous() : offs.cpu();
  const int32_t* p = o.const_data_ptr<int32_t>();
  std::vector<int64_t> ends(static_cast<size_t>(o.numel()));
  int64_t prev = 0;
  for (int64_t i = 0; i < o.numel(); ++i) {
    const int64_t v = p[i];
    if (i == 0) {
      TORCH_CHECK(v >= 0, op,
                  ": argument 'offs' expected non-negative cumulative group end offsets, got "
                  "offs[0] = ",
                  v);
    } else {
      TORCH_CHECK(v >= prev, op,
                  ": argument 'offs' expected non-decreasing offsets (cumulative group ends), "
                  "got offs[",
                  i, "] = ", v, " after offs[", i - 1, "] = ", prev);
    }
    TORCH_CHECK(v <= extent, op, ": argument 'offs' expected offsets <= ", extent, " (",
                extent_name, "), got offs[", i, "] = ", v);
    ends[static_cast<size_t>(i)] = v;
    prev = v;
  }
  return ends;
}

std::string cuda_not_built(const char* op) {
  return std::string(op) +
         ": this build of gemmt has no CUDA kernels (it was built without CUDA); move the "
         "tensors to the CPU";
}

// ---- dispatcher handles (backward passes and the composite expert layer) ----

template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

at::Tensor call_grouped_mm(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                           const OptTensor& bias = std::nullopt,
                           std::optional<at::ScalarType> out_dtype = std::nullopt,
                           std::string_view activation = "none") {
  static auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                           std::optional<at::ScalarType>, std::string_view)>("gemmt::grouped_mm");
  return op.call(a, b, offs, bias, out_dtype, activation);
}

at::Tensor call_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("gemmt::swiglu");
  return op.call(gate, up);
}

std::tuple<at::Tensor, at::Tensor> call_moe_permute(const at::Tensor& expert_ids,
                                                    int64_t num_experts) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t)>(
      "gemmt::moe_permute");
  return op.call(expert_ids, num_experts);
}

using RouteResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
RouteResult call_moe_route(const at::Tensor& logits, int64_t top_k, std::string_view score,
                           bool renormalize, int64_t n_group, int64_t topk_group,
                           const OptTensor& correction_bias) {
  static auto op = op_handle<RouteResult(const at::Tensor&, int64_t, std::string_view, bool,
                                         int64_t, int64_t, const OptTensor&)>("gemmt::moe_route");
  return op.call(logits, top_k, score, renormalize, n_group, topk_group, correction_bias);
}

at::Tensor call_moe_experts(const at::Tensor& x, const at::Tensor& w_gate_up,
                            const at::Tensor& w_down, const at::Tensor& weights,
                            const at::Tensor& expert_ids, const at::Tensor& token_order,
                            const at::Tensor& offsets) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&)>("gemmt::moe_experts");
  return op.call(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
}

std::tuple<at::Tensor, at::Tensor> call_quantize_rows(const at::Tensor& x) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, std::string_view, at::ScalarType)>("gemmt::quantize_fp8");
  return op.call(x, "row", at::kFloat8_e4m3fn);
}

at::Tensor call_scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                                  const at::Tensor& sb, const at::Tensor& offs,
                                  at::ScalarType out_dtype) {
  static auto op = op_handle<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
      const OptTensor&, std::optional<at::ScalarType>, std::string_view, bool)>(kScaledGroupedMm);
  return op.call(a, b, sa, sb, offs, std::nullopt, out_dtype, "none", false);
}

// ---- grouped_mm autograd ----

// The gradients of each layout are grouped products of the other layouts (transposed views,
// no copies), so they run whatever kernel grouped_mm has on the tensors' device:
//   k2d3d  da = g @ b^T per group (k2d3d);  db = a^T g per group over M (k2d2d)
//   k3d3d  da = g @ b^T (k3d3d);            db = a^T @ g (k3d3d)
//   k2d2d  da = g[i] @ b^T, columns by group (k3d2d);  db = a^T @ g[i], rows by group (k2d3d)
//   k3d2d  da = g @ b^T per column group (k2d2d);      db = a[i]^T @ g, columns (k3d2d)
// The bias gradient of k2d3d is a per-group row sum: a k2d2d product with a row of ones.
// A 3-D b stored column-major per group: the usual weight, w.transpose(1, 2) of a row-major
// (E, N, K) w. Its gradient is then made as the transpose of a row-major (E, N, K) product,
// in w's own layout; a row-major (E, K, N) result would be copied into that layout by
// autograd's gradient layout contract, a pass over the whole weight.
bool column_major(const at::Tensor& b) {
  return b.dim() == 3 && b.size(1) > 1 && b.stride(1) == 1 && b.stride(2) != 1;
}

class GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const OptTensor& offs, const OptTensor& bias,
                            std::optional<at::ScalarType> out_dtype, std::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const Activation act = parse_activation(kGroupedMm, activation);
    // With an activation the pre-activation is kept for the backward (the CPU kernel would
    // compute the same z, then act(z) in place).
    at::Tensor z = call_grouped_mm(a, b, offs, bias, out_dtype, "none");
    at::Tensor y = aten_activation(z, act);
    ctx->saved_data["activation"] = static_cast<int64_t>(act);
    ctx->saved_data["has_bias"] = has(bias);
    ctx->saved_data["out_dtype"] =
        out_dtype.has_value() ? static_cast<int64_t>(*out_dtype) : int64_t{-1};
    ctx->save_for_backward({a, b, has(offs) ? *offs : at::Tensor(),
                            has(bias) ? *bias : at::Tensor(),
                            act == Activation::kNone ? at::Tensor() : z});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &offs_t = saved[2], &bias = saved[3],
                     &z = saved[4];
    const OptTensor offs = offs_t.defined() ? OptTensor(offs_t) : std::nullopt;
    const auto act = static_cast<Activation>(ctx->saved_data["activation"].toInt());
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    at::Tensor g = grads[0];
    if (act != Activation::kNone) {
      at::Tensor pre = z;
      if (at::GradMode::is_enabled()) {
        // Recorded backward (create_graph): recompute z differentiably so that second
        // derivatives reach a, b and bias through it.
        const int64_t od = ctx->saved_data["out_dtype"].toInt();
        pre = call_grouped_mm(
            a, b, offs, bias.defined() ? OptTensor(bias) : std::nullopt,
            od < 0 ? std::nullopt : std::optional<at::ScalarType>(static_cast<at::ScalarType>(od)),
            "none");
      }
      g = aten_activation_backward(g, pre, act);
    }
    if (g.scalar_type() != a.scalar_type()) g = g.to(a.scalar_type());
    at::Tensor ga, gb, gbias;
    const bool need_a = ctx->needs_input_grad(0), need_b = ctx->needs_input_grad(1);
    // needs_input_grad counts tensor arguments only: bias is the third without offs.
    const bool need_bias = has_bias && ctx->needs_input_grad(offs.has_value() ? 3 : 2);
    switch (layout_of(a, b)) {
      case Layout::k2d3d:
        if (need_a) ga = call_grouped_mm(g, b.transpose(1, 2), offs);
        if (need_b) {
          gb = column_major(b) ? call_grouped_mm(g.t(), a, offs).transpose(1, 2)
                               : call_grouped_mm(a.t(), g, offs);
        }
        if (need_bias) {
          gbias = call_grouped_mm(at::ones_symint({c10::SymInt(1), g.sym_size(0)}, g.options()), g,
                                  offs)
                      .squeeze(1);
        }
        break;
      case Layout::k3d3d:
        if (need_a) ga = call_grouped_mm(g, b.transpose(1, 2), std::nullopt);
        if (need_b) {
          gb = column_major(b) ? call_grouped_mm(g.transpose(1, 2), a, std::nullopt).transpose(1, 2)
                               : call_grouped_mm(a.transpose(1, 2), g, std::nullopt);
        }
        if (need_bias) gbias = g.sum(1);
        break;
      case Layout::k2d2d:
        if (need_a) ga = call_grouped_mm(g, b.t(), offs);
        if (need_b) gb = call_grouped_mm(a.t(), g, offs);
        break;
      case Layout::k3d2d:
        if (need_a) ga = call_grouped_mm(g, b.t(), offs);
        if (need_b) gb = call_grouped_mm(a.transpose(1, 2), g, offs);
        break;
    }
    return {ga, gb, at::Tensor(), gbias, at::Tensor(), at::Tensor()};
  }
};

// ---- routing ----

bool is_index_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong;
}

void check_index(const char* op, const char* arg, const at::Tensor& t) {
  check_dtype(op, arg, t, {at::kInt, at::kLong});
}

at::ScalarType route_dtype(const at::Tensor& logits) {
  // Routing scores in float32 whatever the logits' dtype (float64 stays float64, for
  // gradcheck): a top-k decided in bfloat16 would be decided by rounding.
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

bool score_is_softmax(const char* op, std::string_view score) {
  TORCH_CHECK(score == "softmax" || score == "sigmoid", op,
              ": argument 'score' expected 'softmax' or 'sigmoid', got '", std::string(score), "'");
  return score == "softmax";
}

void check_moe_route(const at::Tensor& logits, int64_t top_k, std::string_view score,
                     int64_t n_group, int64_t topk_group, const OptTensor& correction_bias) {
  const char* op = kMoeRoute;
  check_dtype(op, "logits", logits, float_dtypes_for(logits));
  check_dim(op, "logits", logits, 2);
  score_is_softmax(op, score);
  const c10::SymInt experts = logits.sym_size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= experts, op,
              ": argument 'top_k' expected 1 <= top_k <= the number of experts (logits.shape[1] "
              "= ",
              experts, "), got ", top_k);
  TORCH_CHECK(n_group >= 0, op,
              ": argument 'n_group' expected >= 0 (0: no group-limited routing), got ", n_group);
  if (n_group == 0) {
    TORCH_CHECK(topk_group == 0, op,
                ": argument 'topk_group' expected 0 when n_group is 0 (no group-limited "
                "routing), got ",
                topk_group);
  } else {
    TORCH_CHECK(experts % n_group == 0, op,
                ": argument 'n_group' expected a divisor of the number of experts (", experts,
                "), got ", n_group);
    TORCH_CHECK(topk_group >= 1 && topk_group <= n_group, op,
                ": argument 'topk_group' expected 1 <= topk_group <= n_group (", n_group, "), got ",
                topk_group);
    TORCH_CHECK(top_k <= topk_group * (experts / n_group), op,
                ": argument 'top_k' expected at most topk_group * experts per group (",
                topk_group * (experts / n_group), ": the experts of the chosen groups), got ",
                top_k);
  }
  if (has(correction_bias)) {
    check_dtype(op, "correction_bias", *correction_bias, float_dtypes_for(*correction_bias));
    check_same_device(op, "logits", logits, "correction_bias", *correction_bias);
    TORCH_CHECK(correction_bias->dim() == 1 && correction_bias->sym_size(0) == experts, op,
                ": argument 'correction_bias' expected shape [", experts,
                "] (one per expert), got ", describe(*correction_bias));
  }
}

at::Tensor scores_of(const at::Tensor& logits, bool softmax) {
  const at::Tensor s = as_dtype(logits, route_dtype(logits));
  return softmax ? at::softmax(s, -1) : at::sigmoid(s);
}

// The routing weights of the chosen experts, from differentiable ATen ops: the CPU kernel and
// the autograd kernel (which records it, so the router's logits get their gradient) share it.
at::Tensor weights_from_scores(const at::Tensor& scores, const at::Tensor& expert_ids,
                               bool renormalize) {
  at::Tensor w = scores.gather(1, expert_ids);
  if (renormalize) {
    // The floor keeps all-underflowed sigmoid scores from dividing 0 by 0.
    w = w / w.sum(-1, true).clamp_min(std::numeric_limits<float>::min());
  }
  return w;
}

at::Tensor route_weights(const at::Tensor& logits, const at::Tensor& expert_ids, bool softmax,
                         bool renormalize) {
  return weights_from_scores(scores_of(logits, softmax), expert_ids, renormalize);
}

// Indices of the k largest values along the last dimension, largest first; equal values in
// ascending index order (a stable descending sort), so ties go to the lowest expert id.
at::Tensor top_indices(const at::Tensor& v, int64_t k) {
  return std::get<1>(at::sort(v, /*stable=*/true, /*dim=*/-1, /*descending=*/true))
      .narrow(-1, 0, k)
      .contiguous();
}

// ---- moe_experts ----

// The expert weights' shapes, transformers' layout: w_gate_up (E, 2 * I, H), w_down (E, H, I).
void check_expert_shapes(const char* op, const at::Tensor& x, const at::Tensor& w_gate_up,
                         const at::Tensor& w_down) {
  check_dim(op, "x", x, 2);
  check_dim(op, "w_gate_up", w_gate_up, 3);
  check_dim(op, "w_down", w_down, 3);
  check_same_device(op, "x", x, "w_gate_up", w_gate_up);
  check_same_device(op, "x", x, "w_down", w_down);
  const c10::SymInt experts = w_gate_up.sym_size(0), hidden = x.sym_size(1),
                    inter = w_down.sym_size(2);
  TORCH_CHECK(w_gate_up.sym_size(2) == hidden && w_gate_up.sym_size(1) == 2 * inter, op,
              ": argument 'w_gate_up' expected shape [E, 2 * I, H] = [", experts, ", ", 2 * inter,
              ", ", hidden, "] (H = x.shape[1], I = w_down.shape[2]), got ", describe(w_gate_up));
  TORCH_CHECK(w_down.sym_size(0) == experts && w_down.sym_size(1) == hidden, op,
              ": argument 'w_down' expected shape [E, H, I] = [", experts, ", ", hidden,
              ", I] (E = "
              "w_gate_up.shape[0], H = x.shape[1]), got ",
              describe(w_down));
}

// The routing arguments of an expert layer over `experts` experts: weights and expert_ids
// (T, top_k), token_order (T * top_k), offsets (experts,) int32.
void check_routing_args(const char* op, const at::Tensor& x, const c10::SymInt& experts,
                        const at::Tensor& weights, const at::Tensor& expert_ids,
                        const at::Tensor& token_order, const at::Tensor& offsets) {
  check_dtype(op, "weights", weights, float_dtypes_for(weights));
  check_dim(op, "weights", weights, 2);
  check_same_device(op, "x", x, "weights", weights);
  TORCH_CHECK(weights.sym_size(0) == x.sym_size(0), op,
              ": argument 'weights' expected shape [T, top_k] with T = x.shape[0] = ",
              x.sym_size(0), ", got ", describe(weights));
  check_index(op, "expert_ids", expert_ids);
  check_same_device(op, "x", x, "expert_ids", expert_ids);
  TORCH_CHECK(expert_ids.sym_sizes() == weights.sym_sizes(), op,
              ": argument 'expert_ids' expected the shape of 'weights' [T, top_k], got ",
              describe(expert_ids), " and weights ", describe(weights));
  check_index(op, "token_order", token_order);
  check_dim(op, "token_order", token_order, 1);
  check_same_device(op, "x", x, "token_order", token_order);
  TORCH_CHECK(token_order.sym_size(0) == weights.sym_numel(), op,
              ": argument 'token_order' expected T * top_k = ", weights.sym_numel(),
              " entries (one per routed slot), got ", describe(token_order));
  check_dtype(op, "offsets", offsets, {at::kInt});
  check_dim(op, "offsets", offsets, 1);
  check_same_device(op, "x", x, "offsets", offsets);
  TORCH_CHECK(offsets.sym_size(0) == experts, op,
              ": argument 'offsets' expected one offset per expert (", experts, "), got ",
              describe(offsets));
}

void check_moe_experts(const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_down,
                       const at::Tensor& weights, const at::Tensor& expert_ids,
                       const at::Tensor& token_order, const at::Tensor& offsets) {
  const char* op = kMoeExperts;
  check_dtype(op, "x", x, float_dtypes_for(x));
  check_same_dtype(op, "x", x, "w_gate_up", w_gate_up);
  check_same_dtype(op, "x", x, "w_down", w_down);
  check_expert_shapes(op, x, w_gate_up, w_down);
  check_routing_args(op, x, w_gate_up.sym_size(0), weights, expert_ids, token_order, offsets);
}

// moe_experts_float8: float8 experts with a float32 scale an output row of each expert,
// (E, 2 * I) and (E, H), and activations of a floating dtype.
void check_moe_experts_float8(const at::Tensor& x, const at::Tensor& w_gate_up,
                              const at::Tensor& w_gate_up_scale, const at::Tensor& w_down,
                              const at::Tensor& w_down_scale, const at::Tensor& weights,
                              const at::Tensor& expert_ids, const at::Tensor& token_order,
                              const at::Tensor& offsets) {
  const char* op = kMoeExpertsFloat8;
  check_dtype(op, "x", x, {at::kFloat, at::kHalf, at::kBFloat16});
  check_dtype(op, "w_gate_up", w_gate_up, {at::kFloat8_e4m3fn, at::kFloat8_e5m2});
  check_dtype(op, "w_down", w_down, {at::kFloat8_e4m3fn, at::kFloat8_e5m2});
  check_expert_shapes(op, x, w_gate_up, w_down);
  // Each weight's scales: float32, one an output row of each expert.
  auto check_row_scales = [&](const char* name, const at::Tensor& sc, const at::Tensor& w) {
    check_dtype(op, name, sc, {at::kFloat});
    check_same_device(op, "x", x, name, sc);
    TORCH_CHECK(sc.dim() == 2 && sc.sym_size(0) == w.sym_size(0) && sc.sym_size(1) == w.sym_size(1),
                op, ": argument '", name,
                "' expected a float32 scale an output row of each expert, shape [", w.sym_size(0),
                ", ", w.sym_size(1), "], got ", describe(sc));
  };
  check_row_scales("w_gate_up_scale", w_gate_up_scale, w_gate_up);
  check_row_scales("w_down_scale", w_down_scale, w_down);
  const c10::SymInt hidden = x.sym_size(1), inter = w_down.sym_size(2);
  TORCH_CHECK(hidden % 16 == 0 && inter % 16 == 0, op,
              ": expected the hidden size (x.shape[1]) and the intermediate size (w_down.shape[2]) "
              "multiples of 16 (the contractions of the float8 products), got ",
              hidden, " and ", inter);
  check_routing_args(op, x, w_gate_up.sym_size(0), weights, expert_ids, token_order, offsets);
}

// The routing data, checked against each other (CPU only: the values are read): token_order
// a permutation of the T * top_k slots, offsets the cumulative counts of expert_ids, and the
// slots in token_order sorted by expert.
void check_moe_routing_values(const at::Tensor& expert_ids, const at::Tensor& token_order,
                              const at::Tensor& offsets, int64_t num_experts,
                              const char* op = kMoeExperts) {
  const int64_t slots = token_order.numel();
  const std::vector<int64_t> ends = read_offsets(op, offsets, slots, "T * top_k, the routed slots");
  TORCH_CHECK(ends.empty() ? slots == 0 : ends.back() == slots, op,
              ": argument 'offsets' expected its last entry to be T * top_k = ", slots,
              " (every routed slot belongs to an expert), got ", ends.empty() ? 0 : ends.back());
  if (slots == 0) return;
  const at::Tensor order = as_dtype(token_order, at::kLong);
  const int64_t lo = order.min().item<int64_t>(), hi = order.max().item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < slots, op, ": argument 'token_order' expected values in [0, ", slots,
              "), got values in [", lo, ", ", hi, "]");
  TORCH_CHECK(at::bincount(order, {}, slots).eq(1).all().item<bool>(), op,
              ": argument 'token_order' expected a permutation of the T * top_k = ", slots,
              " routed slots, got repeated entries");
  const at::Tensor ids = as_dtype(expert_ids.reshape(-1), at::kLong);
  const int64_t ilo = ids.min().item<int64_t>(), ihi = ids.max().item<int64_t>();
  TORCH_CHECK(ilo >= 0 && ihi < num_experts, op, ": argument 'expert_ids' expected values in [0, ",
              num_experts, "), got values in [", ilo, ", ", ihi, "]");
  const at::Tensor counts =
      at::diff(at::cat({at::zeros({1}, at::kLong), as_dtype(offsets, at::kLong)}));
  const at::Tensor expected =
      at::repeat_interleave(at::arange(num_experts, at::kLong), counts, std::nullopt, slots);
  TORCH_CHECK(at::equal(ids.index_select(0, order), expected), op,
              ": arguments 'token_order' and 'offsets' expected the slots of expert e at "
              "positions [offsets[e-1], offsets[e]) of token_order (as moe_permute returns "
              "them), got an order that does not match expert_ids");
}

// A CPU tensor whose values can be read here: not a tracing stand-in (torch.compile's fake
// and functional tensors), which has no data.
bool readable_on_host(const at::Tensor& t) {
  return t.is_cpu() && !t.key_set().has(c10::DispatchKey::Python) &&
         !t.key_set().has(c10::DispatchKey::Functionalize);
}

// The expert layer from registered ops: gather, gate/up grouped product, swiglu, down grouped
// product, weighted combine. Below autograd (the CPU kernel) it computes; above it (the
// autograd kernel) every step is recorded and the backward is grouped products again.
at::Tensor moe_experts_composite(const at::Tensor& x, const at::Tensor& w_gate_up,
                                 const at::Tensor& w_down, const at::Tensor& weights,
                                 const at::Tensor& token_order, const at::Tensor& offsets) {
  const at::Tensor order = as_dtype(token_order, at::kLong);
  const at::Tensor token = at::div(order, weights.sym_size(1), "floor");
  const at::Tensor xs = x.index_select(0, token);
  // transformers' experts store each expert's weights as (out_features, in_features); the
  // grouped product wants (in, out): a transposed view, read through its strides.
  const at::Tensor h = call_grouped_mm(xs, w_gate_up.transpose(1, 2), offsets);
  const c10::SymInt inter = w_down.sym_size(2);
  const at::Tensor act =
      call_swiglu(h.narrow_symint(1, 0, inter), h.narrow_symint(1, inter, inter));
  const at::Tensor o = call_grouped_mm(act, w_down.transpose(1, 2), offsets);
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor w = as_dtype(weights.reshape(-1).index_select(0, order), acc);
  const at::Tensor contrib = as_dtype(o, acc) * w.unsqueeze(1);
  // Each token's top_k contributions summed in float32, rounded once.
  return at::zeros_symint(x.sym_sizes(), x.options().dtype(acc))
      .index_add(0, token, contrib)
      .to(x.scalar_type());
}

// moe_experts_float8 between its gather and its combine: the gate/up product of the float8
// token rows xg (expert order) with their scales sg, rounded to x's 16-bit type (bfloat16 for
// a float32 x), silu(gate) * up quantised a row at a time, the down product in float32.
at::Tensor float8_expert_rows(const at::Tensor& xg, const at::Tensor& sg,
                              const at::Tensor& w_gate_up, const at::Tensor& w_gate_up_scale,
                              const at::Tensor& w_down, const at::Tensor& w_down_scale,
                              const at::Tensor& offsets, at::ScalarType x_dtype) {
  const at::ScalarType mid = reduced_float(x_dtype) ? x_dtype : at::kBFloat16;
  const at::Tensor h =
      call_scaled_grouped_mm(xg, w_gate_up.transpose(1, 2), sg, w_gate_up_scale, offsets, mid);
  const int64_t inter = w_down.size(2);
  const auto [aq, as] =
      call_quantize_rows(call_swiglu(h.narrow(1, 0, inter), h.narrow(1, inter, inter)));
  return call_scaled_grouped_mm(aq, w_down.transpose(1, 2), as.reshape(-1), w_down_scale, offsets,
                                at::kFloat);
}

}  // namespace

// ---- grouped_mm ----

at::Tensor grouped_mm_meta(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                           const OptTensor& bias, std::optional<at::ScalarType> out_dtype,
                           std::string_view activation) {
  const GroupedMmShape s = check_grouped_mm(a, b, offs, bias, out_dtype, activation);
  return at::empty_symint(s.out_sizes, a.options().dtype(s.out_dtype));
}

at::Tensor grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                          const OptTensor& bias, std::optional<at::ScalarType> out_dtype,
                          std::string_view activation) {
  const char* op = kGroupedMm;
  const GroupedMmShape s = check_grouped_mm(a, b, offs, bias, out_dtype, activation);
  at::AutoDispatchBelowADInplaceOrView guard;
  // Zeros: rows (k2d3d) or columns (k3d2d) past the last offset belong to no group and stay
  // 0, as does an empty group's product over K (k2d2d).
  at::Tensor out = at::zeros(C10_AS_INTARRAYREF_SLOW(s.out_sizes), a.options().dtype(s.out_dtype));
  // A float32 result of half-precision operands: products in float32 throughout.
  const at::Tensor A = a.scalar_type() == s.out_dtype ? a : a.to(s.out_dtype);
  const at::Tensor B = b.scalar_type() == s.out_dtype ? b : b.to(s.out_dtype);
  at::Tensor C = has(bias) ? (bias->scalar_type() == s.out_dtype ? *bias : bias->to(s.out_dtype))
                           : at::Tensor();
  int64_t start = 0;
  switch (s.layout) {
    case Layout::k3d3d:
      at::bmm_out(out, A, B);
      if (C.defined()) out.add_(C.unsqueeze(1));
      break;
    case Layout::k2d3d: {
      const auto ends = read_offsets(op, *offs, a.size(0), "a.shape[0], the rows of a");
      for (size_t g = 0; g < ends.size(); ++g) {
        const int64_t n = ends[g] - start;
        if (n > 0) {
          at::Tensor rows = out.narrow(0, start, n);
          at::mm_out(rows, A.narrow(0, start, n), B.select(0, static_cast<int64_t>(g)));
          if (C.defined()) rows.add_(C.select(0, static_cast<int64_t>(g)));
        }
        start = ends[g];
      }
      break;
    }
    case Layout::k2d2d: {
      const auto ends = read_offsets(op, *offs, a.size(1), "a.shape[1], the contraction dimension");
      for (size_t g = 0; g < ends.size(); ++g) {
        const int64_t n = ends[g] - start;
        if (n > 0) {
          at::Tensor dst = out.select(0, static_cast<int64_t>(g));
          at::mm_out(dst, A.narrow(1, start, n), B.narrow(0, start, n));
        }
        start = ends[g];
      }
      break;
    }
    case Layout::k3d2d: {
      const auto ends = read_offsets(op, *offs, b.size(1), "b.shape[1], the columns of b");
      for (size_t g = 0; g < ends.size(); ++g) {
        const int64_t n = ends[g] - start;
        if (n > 0) {
          out.narrow(1, start, n)
              .copy_(at::mm(A.select(0, static_cast<int64_t>(g)), B.narrow(1, start, n)));
        }
        start = ends[g];
      }
      break;
    }
  }
  aten_activation_out(s.activation, out, out);
  return out;
}

at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                           const OptTensor& bias, std::optional<at::ScalarType> out_dtype,
                           std::string_view activation) {
  const GroupedMmShape s = check_grouped_mm(a, b, offs, bias, out_dtype, activation);
#ifdef GEMMT_WITH_CUDA
  TORCH_CHECK(a.is_cuda(), kGroupedMm, ": the CUDA kernel expected CUDA tensors, got ",
              describe(a));
  if (!reduced_float(a.scalar_type())) {
    // float32 and float64 (gradcheck's dtype): the CPU kernel's loop of ATen products on the
    // GPU, with the offsets read on the host, a synchronisation the 16-bit kernel avoids.
    return grouped_mm_cpu(a, b, offs, bias, out_dtype, activation);
  }
  // The offsets stay on the GPU, unchecked (a check would synchronise with the host);
  // GEMMT_CHECK_OFFSETS=1 reads and checks them as the CPU kernel does, for debugging.
  static const bool check_offsets = [] {
    const char* v = std::getenv("GEMMT_CHECK_OFFSETS");
    return v != nullptr && v[0] == '1';
  }();
  if (check_offsets && has(offs)) {
    const int64_t extent = s.layout == Layout::k2d3d   ? a.size(0)
                           : s.layout == Layout::k2d2d ? a.size(1)
                                                       : b.size(1);
    read_offsets(kGroupedMm, offs->cpu(), extent, "the extent the offsets split");
  }
  at::Tensor out = at::empty(C10_AS_INTARRAYREF_SLOW(s.out_sizes), a.options().dtype(s.out_dtype));
  grouped_mm_cuda_into(kGroupedMm, a, b, offs, bias, static_cast<GroupedLayout>(s.layout),
                       s.activation, out);
  return out;
#else
  (void)s;
  TORCH_CHECK_NOT_IMPLEMENTED(false, cuda_not_built(kGroupedMm), "; got a ", describe(a));
  return {};
#endif
}

at::Tensor grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs,
                               const OptTensor& bias, std::optional<at::ScalarType> out_dtype,
                               std::string_view activation) {
  const bool record = at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad() ||
                                                     (has(bias) && bias->requires_grad()));
  if (!record) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_grouped_mm(a, b, offs, bias, out_dtype, activation);
  }
  return GroupedMmFunction::apply(a, b, offs, bias, out_dtype, activation);
}

// ---- scaled_grouped_mm ----

namespace {

// The group of each index of an extent that the offsets split, clamped to the last group, and
// whether it lies in a group (indices past the last offset do not: their products are zero).
std::pair<at::Tensor, at::Tensor> groups_of(const at::Tensor& offs, int64_t extent) {
  const at::Tensor idx = at::arange(extent, offs.options().dtype(at::kLong));
  const at::Tensor group = at::searchsorted(offs.to(at::kLong), idx, false, true);
  return {group.clamp_max(offs.size(0) - 1), group < offs.size(0)};
}

// The block-scaled reference: a float32 grouped product of each 128-deep slice of K (exact
// products, float32 sums), scaled by its rows' 1x128 and its group's 128x128 scales, the slices
// summed in float64 (so that the reference's own rounding does not grow with K); then the bias
// and the activation in float32, one rounding to out_dtype.
at::Tensor block_scaled_grouped_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                                    const at::Tensor& sb, const OptTensor& offs,
                                    const OptTensor& bias, const GroupedMmShape& s) {
  const bool rows = s.layout == Layout::k2d3d;
  const int64_t k = a.size(-1), n = b.size(2);
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  // (G, K/128, N): each column's scale of each k-block.
  const at::Tensor sb_cols = sb.repeat_interleave(kScaleBlock, 2).narrow(2, 0, n);
  at::Tensor acc = at::zeros(C10_AS_INTARRAYREF_SLOW(s.out_sizes), a.options().dtype(at::kDouble));
  const at::Tensor none;
  std::optional<std::pair<at::Tensor, at::Tensor>> row_groups;
  if (rows && offs->size(0) > 0) row_groups = groups_of(*offs, a.size(0));
  for (int64_t kb = 0; kb < k / kScaleBlock; ++kb) {
    at::Tensor part =
        grouped_mm_cpu(af.narrow(-1, kb * kScaleBlock, kScaleBlock),
                       bf.narrow(1, kb * kScaleBlock, kScaleBlock), offs, none, at::kFloat, "none");
    const at::Tensor sbk = sb_cols.select(1, kb);  // (G, N)
    if (rows) {
      if (!row_groups) continue;  // no groups: every row is zero
      part.mul_(sa.select(1, kb).unsqueeze(1)).mul_(sbk.index_select(0, row_groups->first));
    } else {
      part.mul_(sa.select(2, kb).unsqueeze(2)).mul_(sbk.unsqueeze(1));
    }
    acc.add_(part);
  }
  at::Tensor z = acc.to(at::kFloat);
  if (has(bias) && z.numel() > 0) {
    const at::Tensor bias_f = bias->to(at::kFloat);
    if (!rows) {
      z.add_(bias_f.unsqueeze(1));
    } else if (row_groups) {
      z.add_(at::where(row_groups->second.unsqueeze(1), bias_f.index_select(0, row_groups->first),
                       at::zeros({}, bias_f.options())));
    }
  }
  aten_activation_out(s.activation, z, z);
  return z.to(s.out_dtype);
}

}  // namespace

at::Tensor scaled_grouped_mm_meta(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& scale_a, const at::Tensor& scale_b,
                                  const OptTensor& offs, const OptTensor& bias,
                                  std::optional<at::ScalarType> out_dtype,
                                  std::string_view activation, bool /*use_fast_accum*/) {
  const GroupedMmShape s =
      check_scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, out_dtype, activation);
  return at::empty_symint(s.out_sizes, a.options().dtype(s.out_dtype));
}

// The reference: the float32 grouped product of the float8 values (exact products, float32
// sums), each element then multiplied by its row's and column's scales, the group's bias added
// and the activation applied, in float32; one rounding to out_dtype.
at::Tensor scaled_grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& scale_a, const at::Tensor& scale_b,
                                 const OptTensor& offs, const OptTensor& bias,
                                 std::optional<at::ScalarType> out_dtype,
                                 std::string_view activation, bool /*use_fast_accum*/) {
  const GroupedMmShape s =
      check_scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, out_dtype, activation);
  check_scale_values(kScaledGroupedMm, "scale_a", scale_a);
  check_scale_values(kScaledGroupedMm, "scale_b", scale_b);
  at::AutoDispatchBelowADInplaceOrView guard;
  if (s.block_scales) return block_scaled_grouped_cpu(a, b, scale_a, scale_b, offs, bias, s);
  at::Tensor z =
      grouped_mm_cpu(a.to(at::kFloat), b.to(at::kFloat), offs, std::nullopt, at::kFloat, "none");
  const int64_t groups = has(offs) ? offs->size(0) : a.size(0);
  if (groups > 0 && z.numel() > 0) {
    const at::Tensor bias_f = has(bias) ? bias->to(at::kFloat) : at::Tensor();
    switch (s.layout) {
      case Layout::k3d3d:
        z.mul_(scale_a.unsqueeze(2)).mul_(scale_b.unsqueeze(1));
        if (bias_f.defined()) z.add_(bias_f.unsqueeze(1));
        break;
      case Layout::k2d2d:
        z.mul_(scale_a.reshape({groups, a.size(0), 1}))
            .mul_(scale_b.reshape({groups, 1, b.size(1)}));
        break;
      case Layout::k2d3d: {
        const auto [g, in_group] = groups_of(*offs, a.size(0));
        z.mul_(scale_a.unsqueeze(1)).mul_(scale_b.index_select(0, g));
        if (bias_f.defined()) {
          z.add_(at::where(in_group.unsqueeze(1), bias_f.index_select(0, g),
                           at::zeros({}, bias_f.options())));
        }
        break;
      }
      case Layout::k3d2d: {
        const auto [g, in_group] = groups_of(*offs, b.size(1));
        z.mul_(scale_a.index_select(0, g).t()).mul_(scale_b.unsqueeze(0));
        break;
      }
    }
  }
  aten_activation_out(s.activation, z, z);
  return z.to(s.out_dtype);
}

at::Tensor scaled_grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& scale_a, const at::Tensor& scale_b,
                                  const OptTensor& offs, const OptTensor& bias,
                                  std::optional<at::ScalarType> out_dtype,
                                  std::string_view activation, bool use_fast_accum) {
  const GroupedMmShape s =
      check_scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, out_dtype, activation);
#ifdef GEMMT_WITH_CUDA
  TORCH_CHECK(a.is_cuda(), kScaledGroupedMm, ": the CUDA kernel expected CUDA tensors, got ",
              describe(a));
  if (s.layout == Layout::k2d2d) {
    // A split of K (the per-group weight gradient): the FP8 tensor cores read K-major operands
    // only, and a split's ranges start anywhere along K. Widened to bfloat16 (exact for both
    // float8 formats), the 16-bit kernel's split runs it with float32 sums; the scales follow.
    const int64_t groups = offs->size(0);
    at::Tensor z =
        call_grouped_mm(a.to(at::kBFloat16), b.to(at::kBFloat16), offs, std::nullopt, at::kFloat);
    z.mul_(scale_a.reshape({groups, a.size(0), 1})).mul_(scale_b.reshape({groups, 1, b.size(1)}));
    aten_activation_out(s.activation, z, z);
    return s.out_dtype == at::kFloat ? z : z.to(s.out_dtype);
  }
  at::Tensor out = at::empty(C10_AS_INTARRAYREF_SLOW(s.out_sizes), a.options().dtype(s.out_dtype));
  scaled_grouped_mm_cuda_into(kScaledGroupedMm, a, b, scale_a, scale_b, offs, bias,
                              static_cast<GroupedLayout>(s.layout), s.activation, use_fast_accum,
                              out);
  return out;
#else
  (void)s;
  (void)use_fast_accum;
  TORCH_CHECK_NOT_IMPLEMENTED(false, cuda_not_built(kScaledGroupedMm), "; got a ", describe(a));
  return {};
#endif
}

// Not differentiable (its operands are quantised): a gradient through it is refused, not
// silently dropped.
at::Tensor scaled_grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& scale_a, const at::Tensor& scale_b,
                                      const OptTensor& offs, const OptTensor& bias,
                                      std::optional<at::ScalarType> out_dtype,
                                      std::string_view activation, bool use_fast_accum) {
  if (at::GradMode::is_enabled()) {
    const std::pair<const char*, const at::Tensor*> args[] = {
        {"a", &a},
        {"b", &b},
        {"scale_a", &scale_a},
        {"scale_b", &scale_b},
        {"bias", has(bias) ? &*bias : nullptr}};
    for (const auto& [name, t] : args) {
      TORCH_CHECK(t == nullptr || !t->requires_grad(), kScaledGroupedMm,
                  " is not differentiable, but argument '", name,
                  "' requires grad: call it under torch.no_grad() or on detached tensors");
    }
  }
  static auto op = op_handle<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
      const OptTensor&, std::optional<at::ScalarType>, std::string_view, bool)>(kScaledGroupedMm);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(a, b, scale_a, scale_b, offs, bias, out_dtype, activation, use_fast_accum);
}

// ---- moe_permute ----

std::tuple<at::Tensor, at::Tensor> moe_permute_meta(const at::Tensor& expert_ids,
                                                    int64_t num_experts) {
  check_index(kMoePermute, "expert_ids", expert_ids);
  TORCH_CHECK(num_experts >= 1, kMoePermute, ": argument 'num_experts' expected >= 1, got ",
              num_experts);
  const auto opts = expert_ids.options();
  return {at::empty_symint({expert_ids.sym_numel()}, opts.dtype(at::kLong)),
          at::empty({num_experts}, opts.dtype(at::kInt))};
}

namespace {

// (token_order, offsets) of flattened int64 expert ids, all in [0, num_experts). Stable: the
// slots of one expert keep their (token, k) order, so the permutation is deterministic.
std::tuple<at::Tensor, at::Tensor> permutation_of(const at::Tensor& ids, int64_t num_experts) {
  at::Tensor order = std::get<1>(at::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  at::Tensor offsets = at::bincount(ids, {}, num_experts).cumsum(0, at::kInt);
  return {order, offsets};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_permute_cpu(const at::Tensor& expert_ids,
                                                   int64_t num_experts) {
  moe_permute_meta(expert_ids, num_experts);
  at::AutoDispatchBelowADInplaceOrView guard;
  const at::Tensor ids = as_dtype(expert_ids.reshape(-1), at::kLong);
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < num_experts, kMoePermute,
                ": argument 'expert_ids' expected values in [0, num_experts = ", num_experts,
                "), got values in [", lo, ", ", hi, "]");
  }
  return permutation_of(ids, num_experts);
}

// ---- moe_route ----

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_meta(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool /*renormalize*/,
    int64_t n_group, int64_t topk_group, const OptTensor& correction_bias) {
  check_moe_route(logits, top_k, score, n_group, topk_group, correction_bias);
  const auto opts = logits.options();
  const c10::SymInt tokens = logits.sym_size(0);
  return {at::empty_symint({tokens, c10::SymInt(top_k)}, opts.dtype(route_dtype(logits))),
          at::empty_symint({tokens, c10::SymInt(top_k)}, opts.dtype(at::kLong)),
          at::empty_symint({tokens * top_k}, opts.dtype(at::kLong)),
          at::empty_symint({logits.sym_size(1)}, opts.dtype(at::kInt))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_cpu(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const OptTensor& correction_bias) {
  check_moe_route(logits, top_k, score, n_group, topk_group, correction_bias);
  at::AutoDispatchBelowADInplaceOrView guard;
  const bool softmax = score_is_softmax(kMoeRoute, score);
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  const at::Tensor scores = scores_of(logits, softmax);
  // The bias steers the choice only; the weights are the unbiased scores (DeepSeek-V3).
  at::Tensor choice =
      has(correction_bias) ? scores + correction_bias->to(scores.scalar_type()) : scores;
  if (n_group > 0) {
    // Group-limited routing: a group's score is the sum of its two best experts' scores;
    // only the experts of the topk_group best groups may be chosen.
    const int64_t per = experts / n_group;
    const at::Tensor grouped = choice.view({tokens, n_group, per});
    const at::Tensor best =
        std::get<0>(at::sort(grouped, /*stable=*/true, /*dim=*/-1, /*descending=*/true));
    const at::Tensor group_score = best.narrow(-1, 0, std::min<int64_t>(2, per)).sum(-1);
    const at::Tensor groups = top_indices(group_score, topk_group);
    const at::Tensor keep =
        at::zeros({tokens, n_group}, logits.options().dtype(at::kBool)).scatter_(1, groups, true);
    choice = choice.masked_fill(
        keep.logical_not().unsqueeze(-1).expand({tokens, n_group, per}).reshape({tokens, experts}),
        -std::numeric_limits<double>::infinity());
  }
  at::Tensor ids = top_indices(choice, top_k);
  at::Tensor weights = weights_from_scores(scores, ids, renormalize);
  // The ids are the top-k's own, in range: no check (and no host read) needed.
  auto [order, offsets] = permutation_of(ids.reshape(-1), experts);
  return {weights, ids, order, offsets};
}

// The choice of experts is not differentiable; the weights are, through the scores: recorded
// here from the chosen ids.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_autograd(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const OptTensor& correction_bias) {
  RouteResult r;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    r = call_moe_route(logits, top_k, score, renormalize, n_group, topk_group, correction_bias);
  }
  if (at::GradMode::is_enabled() && logits.requires_grad()) {
    std::get<0>(r) =
        route_weights(logits, std::get<1>(r), score_is_softmax(kMoeRoute, score), renormalize);
  }
  return r;
}

// ---- moe_experts ----

at::Tensor moe_experts_meta(const at::Tensor& x, const at::Tensor& w_gate_up,
                            const at::Tensor& w_down, const at::Tensor& weights,
                            const at::Tensor& expert_ids, const at::Tensor& token_order,
                            const at::Tensor& offsets) {
  check_moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
  return at::empty_symint(x.sym_sizes(), x.options());
}

at::Tensor moe_experts_cpu(const at::Tensor& x, const at::Tensor& w_gate_up,
                           const at::Tensor& w_down, const at::Tensor& weights,
                           const at::Tensor& expert_ids, const at::Tensor& token_order,
                           const at::Tensor& offsets) {
  check_moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
  at::AutoDispatchBelowADInplaceOrView guard;
  check_moe_routing_values(expert_ids, token_order, offsets, w_gate_up.size(0));
  return moe_experts_composite(x, w_gate_up, w_down, weights, token_order, offsets);
}

// ---- moe_experts_float8 ----

at::Tensor moe_experts_float8_meta(const at::Tensor& x, const at::Tensor& w_gate_up,
                                   const at::Tensor& w_gate_up_scale, const at::Tensor& w_down,
                                   const at::Tensor& w_down_scale, const at::Tensor& weights,
                                   const at::Tensor& expert_ids, const at::Tensor& token_order,
                                   const at::Tensor& offsets) {
  check_moe_experts_float8(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, expert_ids,
                           token_order, offsets);
  return at::empty_symint(x.sym_sizes(), x.options());
}

// The reference: each token quantised once (e4m3, a scale a row), its float8 rows gathered
// into expert order, the two float8 products (float8_expert_rows), and each token's top_k
// float32 rows weighted and summed in float32, rounded once to x's dtype.
at::Tensor moe_experts_float8_cpu(const at::Tensor& x, const at::Tensor& w_gate_up,
                                  const at::Tensor& w_gate_up_scale, const at::Tensor& w_down,
                                  const at::Tensor& w_down_scale, const at::Tensor& weights,
                                  const at::Tensor& expert_ids, const at::Tensor& token_order,
                                  const at::Tensor& offsets) {
  check_moe_experts_float8(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, expert_ids,
                           token_order, offsets);
  at::AutoDispatchBelowADInplaceOrView guard;
  check_moe_routing_values(expert_ids, token_order, offsets, w_gate_up.size(0), kMoeExpertsFloat8);
  if (x.numel() == 0) return at::empty_like(x);
  const at::Tensor order = as_dtype(token_order, at::kLong);
  const at::Tensor token = at::div(order, weights.size(1), "floor");
  const auto [xq, xs] = call_quantize_rows(x);
  // float8 rows moved as bytes.
  const at::Tensor xg = xq.view(at::kByte).index_select(0, token).view(xq.scalar_type());
  const at::Tensor o =
      float8_expert_rows(xg, xs.reshape(-1).index_select(0, token), w_gate_up, w_gate_up_scale,
                         w_down, w_down_scale, offsets, x.scalar_type());
  const at::Tensor w = as_dtype(weights.reshape(-1).index_select(0, order), at::kFloat);
  return at::zeros(x.sizes(), x.options().dtype(at::kFloat))
      .index_add(0, token, o * w.unsqueeze(1))
      .to(x.scalar_type());
}

// For inference: the experts are quantised, so no gradient flows through them; a gradient
// asked of any argument is refused, not silently dropped.
at::Tensor moe_experts_float8_autograd(const at::Tensor& x, const at::Tensor& w_gate_up,
                                       const at::Tensor& w_gate_up_scale, const at::Tensor& w_down,
                                       const at::Tensor& w_down_scale, const at::Tensor& weights,
                                       const at::Tensor& expert_ids, const at::Tensor& token_order,
                                       const at::Tensor& offsets) {
  if (at::GradMode::is_enabled()) {
    const std::pair<const char*, const at::Tensor*> args[] = {{"x", &x},
                                                              {"w_gate_up_scale", &w_gate_up_scale},
                                                              {"w_down_scale", &w_down_scale},
                                                              {"weights", &weights}};
    for (const auto& [name, t] : args) {
      TORCH_CHECK(!t->requires_grad(), kMoeExpertsFloat8,
                  " is for inference (float8 experts, not differentiable), but argument '", name,
                  "' requires grad: call it under torch.no_grad() or on detached tensors");
    }
  }
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      kMoeExpertsFloat8);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, expert_ids,
                 token_order, offsets);
}

// ---- moe_experts under autograd on CUDA ----
// For 16-bit tensors the recorded layer is gemmt's gather and combine kernels, each its own
// autograd node, around the recorded grouped products and swiglu. The composite's ATen steps
// would instead materialise a float32 copy of the whole down product, sum it with atomics,
// and in the backward run a float32 multiply, a reduction and an atomic index_add over the
// (slots, hidden) rows. Here the combine's backward is one pass (moe_combine_backward_run)
// and the gather's is the combine kernel with unit weights.
#ifdef GEMMT_WITH_CUDA
namespace {

// GEMMT_MOE_FUSED_BACKWARD=0 records the ATen composite instead. Read on every call, so one
// process can time both.
bool fused_backward_enabled() {
  const char* v = std::getenv("GEMMT_MOE_FUSED_BACKWARD");
  return v == nullptr || std::string_view(v) != "0";
}

// Tensors with real device memory, and nothing tracing the calls: fake and functional
// tensors (torch.compile) have no data for a kernel, and a dispatch mode would not see the
// kernels launched directly. Those cases record the composite, made of registered ops.
bool fused_path_applies(const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_down,
                        const at::Tensor& weights, const at::Tensor& token_order) {
  if (!fused_backward_enabled() || !x.is_cuda() || !reduced_float(x.scalar_type())) return false;
  if (x.numel() == 0 || weights.numel() == 0) return false;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  for (const at::Tensor* t : {&x, &w_gate_up, &w_down, &weights, &token_order}) {
    const auto keys = t->key_set();
    if (keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize)) {
      return false;
    }
  }
  return true;
}

at::Tensor cols_contiguous(const at::Tensor& t) {
  return t.stride(1) == 1 ? t : t.contiguous();
}

// The gather kernel: xs[p] = x[order[p] / top_k], and inverse (where each (token, k) slot
// went). order: contiguous int64 on x's device.
std::pair<at::Tensor, at::Tensor> gather_slots(const at::Tensor& x, const at::Tensor& order,
                                               int64_t top_k) {
  const int64_t tokens = x.size(0), hidden = x.size(1), slots = order.numel();
  at::Tensor xs = at::empty({slots, hidden}, x.options());
  at::Tensor inverse = at::empty({slots}, order.options());
  check_launch(kMoeExperts,
               moe_gather_run(to_kernel_dtype(x.scalar_type()), x.const_data_ptr(), tokens, hidden,
                              x.stride(0), x.stride(1), order.const_data_ptr<int64_t>(), slots,
                              top_k, xs.data_ptr(), inverse.data_ptr<int64_t>(), stream_for(x)));
  return {xs, inverse};
}

// The combine kernel: out[t] = sum over k of weights[t, k] * y[inverse[t * top_k + k]], summed
// in float32 (float64 for float64 rows) and rounded once; weights nullptr: unit weights.
at::Tensor combine_slots(const at::Tensor& y_in, const at::Tensor* weights,
                         const at::Tensor& inverse, int64_t tokens, int64_t top_k) {
  const at::Tensor y = cols_contiguous(y_in);
  const int64_t hidden = y.size(1);
  at::Tensor w;
  if (weights != nullptr) {
    const at::ScalarType acc = y.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    w = as_dtype(*weights, acc).contiguous();
  }
  at::Tensor out = at::empty({tokens, hidden}, y.options());
  check_launch(kMoeExperts,
               moe_combine_run(to_kernel_dtype(y.scalar_type()), y.const_data_ptr(), y.size(0),
                               y.stride(0), hidden, w.defined() ? w.const_data_ptr() : nullptr,
                               inverse.const_data_ptr<int64_t>(), tokens, top_k, out.data_ptr(),
                               stream_for(y)));
  return out;
}

// act = silu(h[:, :inter]) * h[:, inter:], the swiglu of the fused gate/up product read in
// place. Backward: one pass that writes both halves of grad_h, instead of swiglu's node
// (which would copy the strided halves) and two narrow nodes (a zero-filled grad_h each,
// then a sum).
class MoeSwigluFunction : public torch::autograd::Function<MoeSwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, int64_t inter) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({h});
    ctx->saved_data["inter"] = inter;
    return call_swiglu(h.narrow(1, 0, inter), h.narrow(1, inter, inter));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const int64_t inter = ctx->saved_data["inter"].toInt();
    const at::Tensor gate = h.narrow(1, 0, inter), up = h.narrow(1, inter, inter);
    const at::Tensor& g = grads[0];
    if (at::GradMode::is_enabled()) {
      // Recorded backward (create_graph): the formulas as differentiable ATen ops.
      const at::Tensor s = at::sigmoid(gate);
      return {at::cat({g * up * s * (1 + gate * (1 - s)), g * gate * s}, 1), at::Tensor()};
    }
    at::Tensor dh = at::empty(h.sizes(), h.options());
    at::Tensor d_gate = dh.narrow(1, 0, inter), d_up = dh.narrow(1, inter, inter);
    swiglu_backward_cuda_into(g, gate, up, d_gate, d_up);
    return {dh, at::Tensor()};
  }
};

// xs[p] = x[order[p] / top_k] (the gather kernel), and inverse (where each slot went; not
// differentiable). Backward: grad_x[t] = sum over k of grad_xs[inverse[t * top_k + k]], the
// combine kernel with unit weights (float32 sum, one rounding; no atomics).
class MoeGatherFunction : public torch::autograd::Function<MoeGatherFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& order,
                               int64_t top_k) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const int64_t tokens = x.size(0);
    auto [xs, inverse] = gather_slots(x, order, top_k);
    ctx->mark_non_differentiable({inverse});
    // No zeros made up for the inverse's (never defined) gradient.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({order, inverse});
    ctx->saved_data["tokens"] = tokens;
    ctx->saved_data["top_k"] = top_k;
    return {xs, inverse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!ctx->needs_input_grad(0) || !grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &order = saved[0], &inverse = saved[1];
    const int64_t tokens = ctx->saved_data["tokens"].toInt();
    const int64_t top_k = ctx->saved_data["top_k"].toInt();
    const at::Tensor& g = grads[0];
    const int64_t hidden = g.size(1);
    if (at::GradMode::is_enabled()) {
      // Recorded backward (create_graph): the composite's differentiable form.
      const at::Tensor token = at::div(order, top_k, "floor");
      const at::Tensor sum = at::zeros({tokens, hidden}, g.options().dtype(at::kFloat))
                                 .index_add(0, token, as_dtype(g, at::kFloat));
      return {as_dtype(sum, g.scalar_type()), at::Tensor(), at::Tensor()};
    }
    const at::cuda::CUDAGuard device(g.device());
    return {combine_slots(g, /*weights=*/nullptr, inverse, tokens, top_k), at::Tensor(),
            at::Tensor()};
  }
};

// out[t] = sum over k of weights[t, k] * o[inverse[t * top_k + k]] (the combine kernel).
// Backward: one pass of moe_combine_backward_run for both grad_o and grad_weights.
class MoeCombineFunction : public torch::autograd::Function<MoeCombineFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& o, const at::Tensor& weights,
                            const at::Tensor& inverse, const at::Tensor& order) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = combine_slots(o, &weights, inverse, weights.size(0), weights.size(1));
    ctx->save_for_backward({o, weights, inverse, order});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool need_o = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    if (!need_o && !need_w) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &o = saved[0], &weights = saved[1], &inverse = saved[2], &order = saved[3];
    const int64_t tokens = weights.size(0), top_k = weights.size(1), hidden = o.size(1);
    const int64_t slots = tokens * top_k;
    const at::Tensor& go = grads[0];
    at::Tensor grad_o, grad_w;
    if (at::GradMode::is_enabled()) {
      // Recorded backward (create_graph): the same gradients from differentiable ATen ops,
      // rows in expert order (row p is slot order[p] of token order[p] / top_k).
      const at::Tensor token = at::div(order, top_k, "floor");
      const at::Tensor g = as_dtype(go, at::kFloat).index_select(0, token);
      if (need_o) {
        const at::Tensor w_rows = as_dtype(weights, at::kFloat).reshape(-1).index_select(0, order);
        grad_o = as_dtype(g * w_rows.unsqueeze(1), o.scalar_type());
      }
      if (need_w) {
        const at::Tensor dots = (g * as_dtype(o, at::kFloat)).sum(1);
        grad_w = as_dtype(at::zeros({slots}, dots.options()).index_copy(0, order, dots),
                          weights.scalar_type())
                     .view(weights.sizes());
      }
      return {grad_o, grad_w, at::Tensor(), at::Tensor()};
    }
    const at::cuda::CUDAGuard device(go.device());
    const at::Tensor g = cols_contiguous(go);
    const at::Tensor y = cols_contiguous(o);
    const at::Tensor w = as_dtype(weights, at::kFloat).contiguous();
    if (need_o) grad_o = at::empty({slots, hidden}, o.options());
    if (need_w) grad_w = at::empty({tokens, top_k}, w.options());
    check_launch(kMoeExperts,
                 moe_combine_backward_run(
                     to_kernel_dtype(g.scalar_type()), g.const_data_ptr(), g.stride(0),
                     need_w ? y.const_data_ptr() : nullptr, y.stride(0), hidden, w.const_data_ptr(),
                     inverse.const_data_ptr<int64_t>(), order.const_data_ptr<int64_t>(), tokens,
                     top_k, need_o ? grad_o.data_ptr() : nullptr,
                     need_w ? grad_w.data_ptr() : nullptr, stream_for(g)));
    if (need_w) grad_w = as_dtype(grad_w, weights.scalar_type());
    return {grad_o, grad_w, at::Tensor(), at::Tensor()};
  }
};

// The recorded layer: gather node, grouped products (each recorded by its own autograd
// kernel), the swiglu node on the fused gate/up product, combine node. The forward runs the
// kernels moe_experts_cuda runs, in the same order, so its result is bitwise the no-grad
// result.
at::Tensor moe_experts_fused(const at::Tensor& x, const at::Tensor& w_gate_up,
                             const at::Tensor& w_down, const at::Tensor& weights,
                             const at::Tensor& token_order, const at::Tensor& offsets) {
  const at::cuda::CUDAGuard guard(x.device());
  const int64_t top_k = weights.size(1), inter = w_down.size(2);
  const at::Tensor order = as_dtype(token_order, at::kLong).contiguous();
  const variable_list gathered = MoeGatherFunction::apply(x, order, top_k);
  const at::Tensor &xs = gathered[0], &inverse = gathered[1];
  const at::Tensor h = call_grouped_mm(xs, w_gate_up.transpose(1, 2), offsets);
  const at::Tensor act = MoeSwigluFunction::apply(h, inter);
  const at::Tensor o = call_grouped_mm(act, w_down.transpose(1, 2), offsets);
  return MoeCombineFunction::apply(o, weights, inverse, order);
}

}  // namespace
#endif

at::Tensor moe_experts_autograd(const at::Tensor& x, const at::Tensor& w_gate_up,
                                const at::Tensor& w_down, const at::Tensor& weights,
                                const at::Tensor& expert_ids, const at::Tensor& token_order,
                                const at::Tensor& offsets) {
  const bool record =
      at::GradMode::is_enabled() && (x.requires_grad() || w_gate_up.requires_grad() ||
                                     w_down.requires_grad() || weights.requires_grad());
  if (!record) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
  }
  check_moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
  if (readable_on_host(token_order) && readable_on_host(offsets) && readable_on_host(expert_ids)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    check_moe_routing_values(expert_ids, token_order, offsets, w_gate_up.size(0));
  }
#ifdef GEMMT_WITH_CUDA
  if (fused_path_applies(x, w_gate_up, w_down, weights, token_order)) {
    return moe_experts_fused(x, w_gate_up, w_down, weights, token_order, offsets);
  }
#endif
  return moe_experts_composite(x, w_gate_up, w_down, weights, token_order, offsets);
}

// ---- CUDA ----
// No host synchronisation anywhere below: sizes come from shapes, and the routing values
// (ids, orders, offsets) stay on the device, so the ops can be captured in a CUDA graph. The
// price is that routing values are not checked against each other on CUDA as they are on
// the CPU (see moe_permute_run and moe_gather_run for what bad values do: never a write out of
// bounds).
#ifdef GEMMT_WITH_CUDA
namespace {

// token_order and offsets of the flat expert ids (contiguous int32 or int64, on the current
// device).
std::tuple<at::Tensor, at::Tensor> permute_on_device(const char* op, const at::Tensor& ids,
                                                     int64_t num_experts) {
  const int64_t slots = ids.numel();
  TORCH_CHECK(slots <= std::numeric_limits<int32_t>::max(), op,
              ": expected at most 2^31 - 1 routed slots (the offsets are int32), got ", slots,
              " in expert ids ", describe(ids));
  TORCH_CHECK(num_experts < std::numeric_limits<int32_t>::max(), op,
              ": argument 'num_experts' expected less than 2^31 - 1 on CUDA, got ", num_experts);
  const auto opts = ids.options();
  at::Tensor order = at::empty({slots}, opts.dtype(at::kLong));
  at::Tensor offsets = at::empty({num_experts}, opts.dtype(at::kInt));
  const auto bytes = static_cast<int64_t>(moe_permute_workspace_bytes(slots, num_experts));
  at::Tensor scratch = at::empty({bytes}, opts.dtype(at::kByte));
  check_launch(op, moe_permute_run(ids.const_data_ptr(), ids.scalar_type() == at::kLong, slots,
                                   num_experts, scratch.data_ptr(), order.data_ptr<int64_t>(),
                                   offsets.data_ptr<int32_t>(), stream_for(ids)));
  return {order, offsets};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_permute_cuda(const at::Tensor& expert_ids,
                                                    int64_t num_experts) {
  moe_permute_meta(expert_ids, num_experts);
  const at::cuda::CUDAGuard guard(expert_ids.device());
  at::AutoDispatchBelowADInplaceOrView below;
  return permute_on_device(kMoePermute, expert_ids.reshape(-1).contiguous(), num_experts);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_cuda(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const OptTensor& correction_bias) {
  check_moe_route(logits, top_k, score, n_group, topk_group, correction_bias);
  const bool softmax = score_is_softmax(kMoeRoute, score);
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  TORCH_CHECK(experts <= kMoeRouteMaxExperts, kMoeRoute, ": argument 'logits' expected at most ",
              kMoeRouteMaxExperts, " experts (logits.shape[1]) on CUDA, got ", describe(logits));
  const at::cuda::CUDAGuard guard(logits.device());
  at::AutoDispatchBelowADInplaceOrView below;
  const at::ScalarType sd = route_dtype(logits);
  const auto opts = logits.options();
  at::Tensor weights = at::empty({tokens, top_k}, opts.dtype(sd));
  at::Tensor ids = at::empty({tokens, top_k}, opts.dtype(at::kLong));
  // The bias in the score type, as the reference adds it.
  const at::Tensor bias =
      has(correction_bias) ? as_dtype(*correction_bias, sd).contiguous() : at::Tensor();
  MoeRouteArgs args;
  args.tokens = tokens;
  args.experts = experts;
  args.top_k = top_k;
  args.softmax = softmax;
  args.renormalize = renormalize;
  args.n_group = n_group;
  args.topk_group = topk_group;
  check_launch(kMoeRoute,
               moe_route_run(to_kernel_dtype(logits.scalar_type()), logits.const_data_ptr(),
                             logits.stride(0), logits.stride(1),
                             bias.defined() ? bias.const_data_ptr() : nullptr, args,
                             weights.data_ptr(), ids.data_ptr<int64_t>(), stream_for(logits)));
  auto [order, offsets] = permute_on_device(kMoeRoute, ids.view({-1}), experts);
  return {weights, ids, order, offsets};
}

// moe_experts_composite's steps with gemmt's kernels for the gather and the combine: the
// gather also records where each slot went, so the combine reads each token's top_k rows
// directly and sums them in registers (no atomics, one rounding per output element).
at::Tensor moe_experts_cuda(const at::Tensor& x, const at::Tensor& w_gate_up,
                            const at::Tensor& w_down, const at::Tensor& weights,
                            const at::Tensor& expert_ids, const at::Tensor& token_order,
                            const at::Tensor& offsets) {
  check_moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets);
  const at::cuda::CUDAGuard guard(x.device());
  at::AutoDispatchBelowADInplaceOrView below;
  const int64_t tokens = x.size(0), hidden = x.size(1), top_k = weights.size(1);
  const int64_t slots = tokens * top_k, inter = w_down.size(2);
  if (tokens * hidden == 0) return at::empty({tokens, hidden}, x.options());
  if (slots == 0) return at::zeros({tokens, hidden}, x.options());
  const at::Tensor order = as_dtype(token_order, at::kLong).contiguous();
  const auto [xs, inverse] = gather_slots(x, order, top_k);
  // transformers' (out_features, in_features) expert weights, read as (in, out) views.
  const at::Tensor h = call_grouped_mm(xs, w_gate_up.transpose(1, 2), offsets);
  const at::Tensor act = call_swiglu(h.narrow(1, 0, inter), h.narrow(1, inter, inter));
  const at::Tensor y = call_grouped_mm(act, w_down.transpose(1, 2), offsets);
  return combine_slots(y, &weights, inverse, tokens, top_k);
}

// The reference's steps with gemmt's gather (the float8 rows moved as bytes, 16 at a time) and
// combine (each token's top_k float32 rows read in place through the gather's inverse, summed
// in registers): no float32 copy of the down product in token order, no atomics.
at::Tensor moe_experts_float8_cuda(const at::Tensor& x, const at::Tensor& w_gate_up,
                                   const at::Tensor& w_gate_up_scale, const at::Tensor& w_down,
                                   const at::Tensor& w_down_scale, const at::Tensor& weights,
                                   const at::Tensor& expert_ids, const at::Tensor& token_order,
                                   const at::Tensor& offsets) {
  check_moe_experts_float8(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, expert_ids,
                           token_order, offsets);
  const at::cuda::CUDAGuard guard(x.device());
  at::AutoDispatchBelowADInplaceOrView below;
  const int64_t tokens = x.size(0), hidden = x.size(1), top_k = weights.size(1);
  if (tokens * hidden == 0) return at::empty_like(x);
  if (tokens * top_k == 0) return at::zeros_like(x);
  const at::Tensor order = as_dtype(token_order, at::kLong).contiguous();
  const auto [xq, xs] = call_quantize_rows(x);
  const auto [xg, inverse] = gather_slots(xq.view(at::kByte), order, top_k);
  const at::Tensor sg = xs.reshape(-1).index_select(0, at::div(order, top_k, "floor"));
  const at::Tensor o = float8_expert_rows(xg.view(xq.scalar_type()), sg, w_gate_up, w_gate_up_scale,
                                          w_down, w_down_scale, offsets, x.scalar_type());
  return combine_slots(o, &weights, inverse, tokens, top_k).to(x.scalar_type());
}
#endif

}  // namespace gemmt::wrapper
