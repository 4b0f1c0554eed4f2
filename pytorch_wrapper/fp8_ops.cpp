// FP8: scaled_mm (a product of float8 operands with dequantisation scales, bias and activation
// applied after the product) and quantize_fp8 / quantize_fp8_with_transpose (amax-scaled,
// saturating casts to float8). Argument checks shared by every backend, the CPU reference
// kernels, the Meta kernels, the CUDA kernels of the quantisation (kernels/fp8/, bit for bit
// the reference's), scaled_mm's on the Hopper grouped / scaled GEMM (grouped_gemm_cuda.cpp;
// decode-sized products on their own kernel, fp8_decode_cuda.cpp) and the Autograd kernels.
//
// Scales are dequantisation scales, as torch._scaled_mm takes them: a's real value is
// float(a) * scale_a. The scale layouts follow torch._scaled_mm (torch 2.13, its meta
// function and its CUDA checks):
//   tensorwise  scale_a and scale_b one float32 each (any shape of one element);
//   rowwise     scale_a (M, 1), scale_b (1, N);
//   blockwise   (K a multiple of 128, KB = K / 128) one of torch's three pairings:
//               1x128 for a, 128x128 for b: scale_a (M, KB), scale_b (KB, ceil(N / 128));
//               1x128 for a, 128x1 for b:   scale_a (M, KB), scale_b (KB, N);
//               128x128 for a, 128x1 for b: scale_a (ceil(M / 128), KB), scale_b (KB, N).
// torch's CUDA path wants scale_a of the 1x128 kind column-major (strides (1, M)) and the
// 128x128 scale_b as the transpose of a contiguous (ceil(N / 128), KB) tensor; those layouts
// are accepted, and so is any other with a unit stride along one dimension.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/SymInt.h>

#include <sstream>
#include <string>
#include <tuple>

#include "common.h"
#include "gemmt/activation.h"
#include "grouped_gemm_cuda.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemmt/fp8.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kScaledMm = "gemmt::scaled_mm";
constexpr const char* kQuantize = "gemmt::quantize_fp8";
constexpr const char* kQuantizeT = "gemmt::quantize_fp8_with_transpose";
constexpr int64_t kBlock = 128;
constexpr int64_t kAlignK = 16;
// torchao's floor on amax (float8_utils.EPS): an all-zero block gets a finite scale.
constexpr double kAmaxFloor = 1e-12;

enum class Scaling { kTensor, kRow, kBlock };

const char* scaling_name(Scaling s) {
  switch (s) {
    case Scaling::kTensor:
      return "tensorwise";
    case Scaling::kRow:
      return "rowwise";
    default:
      return "blockwise";
  }
}

struct ScaleConfig {
  Scaling kind = Scaling::kTensor;
  bool a_square_blocks = false;  // scale_a: one value per 128x128 block of a (else per 1x128)
  bool b_square_blocks = false;  // scale_b: one value per 128x128 block of b (else per 128x1)
};

c10::SymInt ceil_block(const c10::SymInt& n) {
  return (n + (kBlock - 1)) / kBlock;
}

bool has_shape(const at::Tensor& t, const c10::SymInt& rows, const c10::SymInt& cols) {
  return t.dim() == 2 && t.sym_size(0) == rows && t.sym_size(1) == cols;
}

void check_fp8_operand(const char* arg, const at::Tensor& t) {
  check_dtype(kScaledMm, arg, t, {at::kFloat8_e4m3fn, at::kFloat8_e5m2});
  check_dim(kScaledMm, arg, t, 2);
}

ScaleConfig classify_scales(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                            const at::Tensor& sb) {
  const c10::SymInt m = a.sym_size(0), k = a.sym_size(1), n = b.sym_size(1);
  if (sa.sym_numel() == 1 && sb.sym_numel() == 1) return {Scaling::kTensor, false, false};
  if (has_shape(sa, m, 1) && has_shape(sb, 1, n)) return {Scaling::kRow, false, false};
  const c10::SymInt kb = ceil_block(k), mb = ceil_block(m), nb = ceil_block(n);
  const bool a_rows = has_shape(sa, m, kb), a_squares = has_shape(sa, mb, kb);
  const bool b_cols = has_shape(sb, kb, n), b_squares = has_shape(sb, kb, nb);
  if (a_rows && b_squares) return {Scaling::kBlock, false, true};
  if (a_rows && b_cols) return {Scaling::kBlock, false, false};
  if (a_squares && b_cols) return {Scaling::kBlock, true, false};
  TORCH_CHECK(false, kScaledMm,
              ": arguments 'scale_a' and 'scale_b' match none of the accepted scalings for a of "
              "shape [",
              m, ", ", k, "] and b of shape [", k, ", ", n,
              "]: tensorwise (one element each), rowwise (scale_a [", m, ", 1], scale_b [1, ", n,
              "]), blockwise 1x128 x 128x128 (scale_a [", m, ", ", kb, "], scale_b [", kb, ", ", nb,
              "]), 1x128 x 128x1 (scale_a [", m, ", ", kb, "], scale_b [", kb, ", ", n,
              "]) or 128x128 x 128x1 (scale_a [", mb, ", ", kb, "], scale_b [", kb, ", ", n,
              "]); got scale_a ", describe(sa), " and scale_b ", describe(sb));
  return {};
}

// A 2-D scale must have a unit stride along one dimension (row- or column-major, any leading
// dimension at least the other extent): the layouts a kernel reads with two strides.
void check_scale_layout(const char* arg, const at::Tensor& s) {
  const auto sizes = s.sym_sizes();
  const auto strides = s.sym_strides();
  const auto unit = [&](int d) { return sizes[d] <= 1 || strides[d] == 1; };
  const auto spans = [&](int d, int other) {
    return sizes[d] <= 1 || strides[d] >= (sizes[other] > 1 ? sizes[other] : c10::SymInt(1));
  };
  const bool row_major = unit(1) && spans(0, 1);
  const bool col_major = unit(0) && spans(1, 0);
  TORCH_CHECK(row_major || col_major, kScaledMm, ": argument '", arg,
              "' expected a row-major or column-major layout (a unit stride along one "
              "dimension), got ",
              describe(s), " with strides ", strides);
}

Activation parse_activation(const char* op, std::string_view name) {
  Activation act = Activation::kNone;
  TORCH_CHECK(activation_from_name(name, &act), op,
              ": argument 'activation' expected one of none, relu, gelu, gelu_tanh, silu, got '",
              name, "'");
  return act;
}

// Every check that needs no data: the same on CPU, CUDA and Meta.
ScaleConfig check_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                            const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                            at::ScalarType out_dtype, std::string_view activation) {
  check_fp8_operand("a", a);
  check_fp8_operand("b", b);
  TORCH_CHECK(a.sym_size(1) == b.sym_size(0), kScaledMm,
              ": arguments 'a' (M, K) and 'b' (K, N) expected the same K, got ", describe(a),
              " and ", describe(b));
  check_dtype(kScaledMm, "scale_a", sa, {at::kFloat});
  check_dtype(kScaledMm, "scale_b", sb, {at::kFloat});
  check_same_device(kScaledMm, "a", a, "b", b);
  check_same_device(kScaledMm, "a", a, "scale_a", sa);
  check_same_device(kScaledMm, "a", a, "scale_b", sb);
  TORCH_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat,
              kScaledMm, ": argument 'out_dtype' expected BFloat16, Half or Float, got ",
              out_dtype);
  parse_activation(kScaledMm, activation);
  const ScaleConfig cfg = classify_scales(a, b, sa, sb);
  const int64_t align = cfg.kind == Scaling::kBlock ? kBlock : kAlignK;
  const c10::SymInt k = a.sym_size(1);
  TORCH_CHECK(k % align == 0, kScaledMm, ": K (a.size(1) == b.size(0)) expected a multiple of ",
              align, " for ", scaling_name(cfg.kind), " scaling, got K = ", k, " (a is ",
              describe(a), ")");
  if (cfg.kind != Scaling::kTensor) {
    check_scale_layout("scale_a", sa);
    check_scale_layout("scale_b", sb);
  }
  if (bias.has_value() && bias->defined()) {
    check_dtype(kScaledMm, "bias", *bias, {at::kFloat, at::kHalf, at::kBFloat16});
    check_same_device(kScaledMm, "a", a, "bias", *bias);
    TORCH_CHECK(bias->dim() == 1 && bias->sym_size(0) == b.sym_size(1), kScaledMm,
                ": argument 'bias' expected a 1-D tensor of N = ", b.sym_size(1), " elements, got ",
                describe(*bias));
  }
  return cfg;
}

// sum_k float(a[m, k]) * float(b[k, n]) with the scales applied, float32 (M, N).
at::Tensor scaled_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                          const at::Tensor& sb, const ScaleConfig& cfg) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  // float8 values and their products are exact in float32: the rounding is in the sums.
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  if (cfg.kind == Scaling::kTensor) {
    const at::Tensor alpha = sa.reshape({1, 1}) * sb.reshape({1, 1});
    return at::mm(af, bf).mul_(alpha);
  }
  if (cfg.kind == Scaling::kRow) {
    return at::mm(af, bf).mul_(sa.reshape({m, 1})).mul_(sb.reshape({1, n}));
  }
  // Blockwise: one float32 product per 128-wide slice of K, its scales applied, then the
  // slices summed in float64, so that the reference's own rounding does not grow with K.
  const at::Tensor sa_rows =
      cfg.a_square_blocks ? sa.repeat_interleave(kBlock, 0).narrow(0, 0, m) : sa;
  const at::Tensor sb_cols =
      cfg.b_square_blocks ? sb.repeat_interleave(kBlock, 1).narrow(1, 0, n) : sb;
  at::Tensor acc = at::zeros({m, n}, a.options().dtype(at::kDouble));
  for (int64_t kb = 0; kb < k / kBlock; ++kb) {
    at::Tensor part = at::mm(af.narrow(1, kb * kBlock, kBlock), bf.narrow(0, kb * kBlock, kBlock));
    part.mul_(sa_rows.select(1, kb).unsqueeze(1)).mul_(sb_cols.select(0, kb).unsqueeze(0));
    acc.add_(part);
  }
  return acc.to(at::kFloat);
}

// ---- quantize_fp8 ----

enum class Granularity { kTensor, kRow, kBlock, kBlock2d };

Granularity parse_granularity(const char* op, std::string_view name) {
  if (name == "tensor") return Granularity::kTensor;
  if (name == "row") return Granularity::kRow;
  if (name == "block") return Granularity::kBlock;
  if (name == "block_128x128") return Granularity::kBlock2d;
  TORCH_CHECK(false, op,
              ": argument 'granularity' expected one of tensor, row, block, block_128x128, got '",
              name, "'");
  return Granularity::kTensor;
}

double fp8_max(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
}

Granularity check_quantize(const char* op, const at::Tensor& x, std::string_view granularity,
                           at::ScalarType dtype) {
  check_dtype(op, "x", x, {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble});
  check_dim(op, "x", x, 2);
  TORCH_CHECK(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2, op,
              ": argument 'dtype' expected Float8_e4m3fn or Float8_e5m2, got ", dtype);
  return parse_granularity(op, granularity);
}

// The scale's shape and layout for x of shape (rows, cols): what scaled_mm takes for the
// operand, in torch's layout (1x128 scales column-major).
at::Tensor empty_scale(const c10::SymInt& rows, const c10::SymInt& cols, Granularity g,
                       const at::TensorOptions& options) {
  const at::TensorOptions f = options.dtype(at::kFloat);
  switch (g) {
    case Granularity::kTensor:
      return at::empty_symint({}, f);
    case Granularity::kRow:
      return at::empty_symint({rows, 1}, f);
    case Granularity::kBlock:
      return at::empty_symint({ceil_block(cols), rows}, f).t();
    default:
      return at::empty_symint({ceil_block(rows), ceil_block(cols)}, f);
  }
}

std::tuple<at::Tensor, at::Tensor> empty_quantized(const c10::SymInt& rows, const c10::SymInt& cols,
                                                   Granularity g, at::ScalarType dtype,
                                                   const at::TensorOptions& options) {
  return {at::empty_symint({rows, cols}, options.dtype(dtype)),
          empty_scale(rows, cols, g, options)};
}

// Pads a float32 (rows, cols) matrix with zeros to whole 128-blocks along the given dims.
at::Tensor pad_to_blocks(const at::Tensor& t, bool rows, bool cols) {
  const int64_t pr = rows ? (kBlock - t.size(0) % kBlock) % kBlock : 0;
  const int64_t pc = cols ? (kBlock - t.size(1) % kBlock) % kBlock : 0;
  return (pr == 0 && pc == 0) ? t : at::constant_pad_nd(t, {0, pc, 0, pr}, 0);
}

// The CPU reference of quantize_fp8, written into q and scale (allocated by empty_quantized).
void quantize_into(const at::Tensor& x, Granularity g, at::ScalarType dtype, at::Tensor& q,
                   at::Tensor& scale) {
  at::AutoDispatchBelowADInplaceOrView guard;
  const int64_t rows = x.size(0), cols = x.size(1);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  // Non-finite elements do not set the scale of the finite ones: +-inf saturates and NaN
  // stays NaN in the cast below.
  const at::Tensor mag = xf.abs().nan_to_num_(0.0, 0.0, 0.0);
  at::Tensor amax;
  switch (g) {
    case Granularity::kTensor:
      amax = mag.numel() > 0 ? mag.max() : at::zeros({}, xf.options());
      break;
    case Granularity::kRow:
      amax = cols > 0 ? mag.amax({1}, true) : at::zeros({rows, 1}, xf.options());
      break;
    case Granularity::kBlock: {
      const at::Tensor p = pad_to_blocks(mag, false, true);
      amax = p.view({rows, p.size(1) / kBlock, kBlock}).amax({2});
      break;
    }
    default: {
      const at::Tensor p = pad_to_blocks(mag, true, true);
      amax = p.view({p.size(0) / kBlock, kBlock, p.size(1) / kBlock, kBlock}).amax({1, 3});
      break;
    }
  }
  // torchao's scale: fp8_max / max(amax, 1e-12), computed in float64, rounded to float32.
  const double top = fp8_max(dtype);
  const at::Tensor mult = (top / amax.to(at::kDouble).clamp_min(kAmaxFloor)).to(at::kFloat);
  at::Tensor full = mult;
  if (g == Granularity::kBlock) {
    full = mult.repeat_interleave(kBlock, 1).narrow(1, 0, cols);
  } else if (g == Granularity::kBlock2d) {
    full = mult.repeat_interleave(kBlock, 0)
               .narrow(0, 0, rows)
               .repeat_interleave(kBlock, 1)
               .narrow(1, 0, cols);
  }
  q.copy_(xf.mul(full).clamp_(-top, top));
  scale.copy_(mult.reciprocal());
}

#ifdef GEMMT_WITH_CUDA
// The CUDA kernels (gemmt/fp8.h) into q and scale (and qt, scale_t), allocated by
// empty_quantized. They read rows with a unit column stride and any row stride.
void quantize_cuda_into(const char* op, const at::Tensor& x_in, Granularity g, at::ScalarType dtype,
                        at::Tensor& q, at::Tensor& scale, at::Tensor* qt, at::Tensor* scale_t) {
  TORCH_CHECK(x_in.is_cuda(), op, ": argument 'x' expected a CUDA tensor, got ", describe(x_in));
  const at::cuda::CUDAGuard guard(x_in.device());
  const int64_t rows = x_in.size(0), cols = x_in.size(1);
  at::Tensor x = x_in;
  if ((cols > 1 && x.stride(1) != 1) || (rows > 1 && x.stride(0) < cols)) x = x.contiguous();
  Fp8QuantizeArgs args;
  args.x_dtype = to_kernel_dtype(x.scalar_type());
  args.x = x.const_data_ptr();
  args.rows = rows;
  args.cols = cols;
  args.ld = rows > 1 ? x.stride(0) : cols;
  args.format = dtype == at::kFloat8_e4m3fn ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  switch (g) {
    case Granularity::kTensor:
      args.granularity = Fp8Granularity::kTensor;
      break;
    case Granularity::kRow:
      args.granularity = Fp8Granularity::kRow;
      break;
    case Granularity::kBlock:
      args.granularity = Fp8Granularity::kBlock;
      break;
    default:
      args.granularity = Fp8Granularity::kBlock128x128;
      break;
  }
  args.q = static_cast<uint8_t*>(q.data_ptr());
  args.scale = scale.data_ptr<float>();
  if (qt != nullptr) {
    args.qt = static_cast<uint8_t*>(qt->data_ptr());
    args.scale_t = scale_t->data_ptr<float>();
  }
  const size_t bytes = quantize_fp8_workspace_bytes(args.granularity, rows, cols, qt != nullptr);
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
    args.workspace = workspace.data_ptr();
    args.workspace_bytes = bytes;
  }
  check_launch(op, quantize_fp8_run(args, stream_for(x)));
}
#else
void refuse_without_cuda(const char* op, const at::Tensor& t) {
  TORCH_CHECK(false, op,
              ": this build of gemmt has no CUDA kernels (it was built without CUDA); got ",
              describe(t));
}
#endif

}  // namespace

// ---- scaled_mm ----

at::Tensor scaled_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype, std::string_view activation,
                          bool /*use_fast_accum*/) {
  check_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation);
  return at::empty_symint({a.sym_size(0), b.sym_size(1)}, a.options().dtype(out_dtype));
}

at::Tensor scaled_mm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                         const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, std::string_view activation,
                         bool /*use_fast_accum*/) {
  const ScaleConfig cfg = check_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation);
  check_scale_values(kScaledMm, "scale_a", scale_a);
  check_scale_values(kScaledMm, "scale_b", scale_b);
  at::AutoDispatchBelowADInplaceOrView guard;
  at::Tensor z = scaled_product(a, b, scale_a, scale_b, cfg);
  if (bias.has_value() && bias->defined()) z.add_(bias->to(at::kFloat).unsqueeze(0));
  aten_activation_out(parse_activation(kScaledMm, activation), z, z);
  return z.to(out_dtype);
}

at::Tensor scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype, std::string_view activation,
                          bool use_fast_accum) {
  const ScaleConfig cfg = check_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation);
#ifdef GEMMT_WITH_CUDA
  const Fp8Scaling scaling{static_cast<int>(cfg.kind), cfg.a_square_blocks, cfg.b_square_blocks};
  return scaled_mm_cuda_run(kScaledMm, a, b, scale_a, scale_b, bias, out_dtype,
                            parse_activation(kScaledMm, activation), scaling, use_fast_accum);
#else
  (void)cfg;
  refuse_without_cuda(kScaledMm, a);
  return {};
#endif
}

// ---- quantize_fp8 / quantize_fp8_with_transpose ----

std::tuple<at::Tensor, at::Tensor> quantize_fp8_meta(const at::Tensor& x,
                                                     std::string_view granularity,
                                                     at::ScalarType dtype) {
  const Granularity g = check_quantize(kQuantize, x, granularity, dtype);
  return empty_quantized(x.sym_size(0), x.sym_size(1), g, dtype, x.options());
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_cpu(const at::Tensor& x,
                                                    std::string_view granularity,
                                                    at::ScalarType dtype) {
  const Granularity g = check_quantize(kQuantize, x, granularity, dtype);
  auto [q, scale] = empty_quantized(x.sym_size(0), x.sym_size(1), g, dtype, x.options());
  quantize_into(x, g, dtype, q, scale);
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_cuda(const at::Tensor& x,
                                                     std::string_view granularity,
                                                     at::ScalarType dtype) {
  const Granularity g = check_quantize(kQuantize, x, granularity, dtype);
#ifdef GEMMT_WITH_CUDA
  auto [q, scale] = empty_quantized(x.sym_size(0), x.sym_size(1), g, dtype, x.options());
  quantize_cuda_into(kQuantize, x, g, dtype, q, scale, nullptr, nullptr);
  return {q, scale};
#else
  (void)g;
  refuse_without_cuda(kQuantize, x);
  return {};
#endif
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_meta(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype) {
  const Granularity g = check_quantize(kQuantizeT, x, granularity, dtype);
  auto [q, s] = empty_quantized(x.sym_size(0), x.sym_size(1), g, dtype, x.options());
  auto [qt, st] = empty_quantized(x.sym_size(1), x.sym_size(0), g, dtype, x.options());
  return {q, s, qt, st};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_cpu(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype) {
  auto [q, s, qt, st] = quantize_fp8_with_transpose_meta(x, granularity, dtype);
  const Granularity g = parse_granularity(kQuantizeT, granularity);
  quantize_into(x, g, dtype, q, s);
  at::AutoDispatchBelowADInplaceOrView guard;
  if (g == Granularity::kTensor || g == Granularity::kBlock2d) {
    // The same scale covers each element either way: the transpose is a copy, bit for bit.
    qt.copy_(q.t());
    st.copy_(g == Granularity::kTensor ? s : s.t());
  } else {
    quantize_into(x.t(), g, dtype, qt, st);
  }
  return {q, s, qt, st};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_cuda(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype) {
  const Granularity g = check_quantize(kQuantizeT, x, granularity, dtype);
#ifdef GEMMT_WITH_CUDA
  auto [q, s] = empty_quantized(x.sym_size(0), x.sym_size(1), g, dtype, x.options());
  auto [qt, st] = empty_quantized(x.sym_size(1), x.sym_size(0), g, dtype, x.options());
  quantize_cuda_into(kQuantizeT, x, g, dtype, q, s, &qt, &st);
  return {q, s, qt, st};
#else
  (void)g;
  refuse_without_cuda(kQuantizeT, x);
  return {};
#endif
}

// ---- Autograd: the ops are not differentiable (their operands and outputs are quantised);
// gemmt.nn.Float8Linear differentiates through them with its own backward. ----

namespace {

void refuse_grad(const char* op,
                 std::initializer_list<std::pair<const char*, const at::Tensor*>> args) {
  if (!c10::GradMode::is_enabled()) return;
  for (const auto& [name, t] : args) {
    TORCH_CHECK(t == nullptr || !t->defined() || !t->requires_grad(), op,
                " is not differentiable, but argument '", name,
                "' requires grad: train through gemmt.nn.Float8Linear (its backward runs "
                "scaled_mm on quantised gradients), or call the op under torch.no_grad() or on "
                "detached tensors");
  }
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> fp8_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

}  // namespace

at::Tensor scaled_mm_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                              at::ScalarType out_dtype, std::string_view activation,
                              bool use_fast_accum) {
  refuse_grad(kScaledMm, {{"a", &a},
                          {"b", &b},
                          {"scale_a", &scale_a},
                          {"scale_b", &scale_b},
                          {"bias", bias.has_value() ? &*bias : nullptr}});
  static auto op =
      fp8_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, at::ScalarType, std::string_view, bool)>(
          kScaledMm);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(a, b, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum);
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_autograd(const at::Tensor& x,
                                                         std::string_view granularity,
                                                         at::ScalarType dtype) {
  refuse_grad(kQuantize, {{"x", &x}});
  static auto op = fp8_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, std::string_view,
                                                             at::ScalarType)>(kQuantize);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(x, granularity, dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_autograd(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype) {
  refuse_grad(kQuantizeT, {{"x", &x}});
  static auto op = fp8_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, std::string_view, at::ScalarType)>(kQuantizeT);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(x, granularity, dtype);
}

}  // namespace gemmt::wrapper
