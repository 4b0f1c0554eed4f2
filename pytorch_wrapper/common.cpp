#include "common.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#ifdef GEMMT_WITH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#include <torch/version.h>
#endif

namespace gemmt::wrapper {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream s;
  s << "a " << t.dim() << "-D " << t.scalar_type() << " tensor of shape " << t.sym_sizes() << " on "
    << t.device();
  return s.str();
}

std::string dtype_list(std::initializer_list<at::ScalarType> dtypes) {
  std::ostringstream s;
  bool first = true;
  for (auto d : dtypes) {
    s << (first ? "" : ", ") << d;
    first = false;
  }
  return s.str();
}

void check_defined(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": argument '", arg, "' expected a tensor, got None");
}

void check_dtype(const char* op, const char* arg, const at::Tensor& t,
                 std::initializer_list<at::ScalarType> allowed) {
  check_defined(op, arg, t);
  bool ok = std::find(allowed.begin(), allowed.end(), t.scalar_type()) != allowed.end();
  TORCH_CHECK(ok, op, ": argument '", arg, "' expected dtype ", dtype_list(allowed), ", got ",
              describe(t));
}

void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim) {
  check_defined(op, arg, t);
  TORCH_CHECK(t.dim() == dim, op, ": argument '", arg, "' expected a ", dim, "-D tensor, got ",
              describe(t));
}

void check_same_shape(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                      const at::Tensor& b) {
  TORCH_CHECK(a.sym_sizes() == b.sym_sizes(), op, ": arguments '", arg_a, "' and '", arg_b,
              "' expected the same shape, got ", describe(a), " and ", describe(b));
}

void check_same_dtype(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                      const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": arguments '", arg_a, "' and '", arg_b,
              "' expected the same dtype, got ", describe(a), " and ", describe(b));
}

void check_same_device(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                       const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), op, ": arguments '", arg_a, "' and '", arg_b,
              "' expected tensors on the same device, got ", describe(a), " and ", describe(b));
}

void check_cpu_reference(const char* op, const at::Tensor& t) {
  check_defined(op, "input", t);
  TORCH_CHECK(t.device().is_cpu(), op,
              " (reference loops): expected CPU tensors (the reference runs on the CPU only), got ",
              describe(t));
}

std::initializer_list<at::ScalarType> float_dtypes_for(const at::Tensor& /*t*/) {
  static const std::initializer_list<at::ScalarType> kAll = {at::kFloat, at::kHalf, at::kBFloat16,
                                                             at::kDouble};
  return kAll;
}

void aten_activation_out(Activation act, const at::Tensor& z, at::Tensor out) {
  switch (act) {
    case Activation::kReLU:
      at::clamp_min_out(out, z, 0);  // torch.relu: clamp_min, NaN kept
      break;
    case Activation::kGelu:
      at::gelu_out(out, z, "none");
      break;
    case Activation::kGeluTanh:
      at::gelu_out(out, z, "tanh");
      break;
    case Activation::kSilu:
      at::silu_out(out, z);
      break;
    default:
      if (!out.is_same(z)) out.copy_(z);
      break;
  }
}

at::Tensor aten_activation(const at::Tensor& z, Activation act) {
  if (act == Activation::kNone) return z;
  at::Tensor out = at::empty_like(z);
  aten_activation_out(act, z, out);
  return out;
}

at::Tensor aten_activation_backward(const at::Tensor& g, const at::Tensor& z, Activation act) {
  switch (act) {
    case Activation::kReLU:
      return at::threshold_backward(g, z, 0);
    case Activation::kGelu:
      return at::gelu_backward(g, z, "none");
    case Activation::kGeluTanh:
      return at::gelu_backward(g, z, "tanh");
    case Activation::kSilu: {
      // Composite (ATen's silu_backward has no derivative of its own).
      const at::Tensor s = at::sigmoid(z);
      return g * s * (1 + z * (1 - s));
    }
    default:
      return g;
  }
}

at::Tensor new_output(c10::SymIntArrayRef sizes, const at::TensorOptions& options) {
#ifdef GEMMT_WITH_CUDA
  if (options.device().is_cuda()) {
    return at::detail::empty_cuda(C10_AS_INTARRAYREF_SLOW(sizes),
                                  c10::typeMetaToScalarType(options.dtype()), options.device(),
                                  at::MemoryFormat::Contiguous);
  }
#endif
  return at::empty_symint(sizes, options.memory_format(at::MemoryFormat::Contiguous));
}

ScalarType to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ScalarType::kFloat32;
    case at::kHalf:
      return ScalarType::kFloat16;
    case at::kBFloat16:
      return ScalarType::kBFloat16;
    case at::kByte:
      return ScalarType::kUInt8;
    case at::kUInt16:
      return ScalarType::kUInt16;
    case at::kDouble:
      return ScalarType::kFloat64;
    default:
      TORCH_CHECK(false, "gemmt: no kernel dtype for ", t);
  }
}

int64_t leading_rows(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

StridedLayout strided_layout(const char* op, const char* arg, const at::Tensor& t) {
  // Collect (size, stride) pairs, innermost last, skipping size-1 dims.
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) dims.emplace_back(t.size(d), t.stride(d));
  }
  // Merge an outer dim into the next inner one when it steps exactly over it.
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (auto& d : dims) {
    if (!merged.empty() && merged.back().second == d.first * d.second) {
      merged.back() = {merged.back().first * d.first, d.second};
    } else {
      merged.push_back(d);
    }
  }
  TORCH_CHECK(static_cast<int64_t>(merged.size()) <= kMaxDims, op, ": argument '", arg,
              "' expected a tensor whose strides collapse to at most ", kMaxDims,
              " dimensions, got ", describe(t), " with strides ", t.strides(),
              " (call .contiguous() first)");
  StridedLayout layout;
  layout.ndim = static_cast<int>(merged.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    layout.sizes[i] = merged[i].first;
    layout.strides[i] = merged[i].second;
  }
  return layout;
}

#ifdef GEMMT_WITH_CUDA
int usable_sm_count(const char* op) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
  const std::optional<int32_t> carveout = at::globalContext()._SMCarveout_EXPERIMENTAL();
#else
  const std::optional<int32_t> carveout;  // torch < 2.7 has no carve-out setting
#endif
  if (!carveout.has_value()) return sms;
  TORCH_CHECK(*carveout >= 0 && *carveout < sms, op,
              ": torch's SM carve-out (torch._C._set_sm_carveout_experimental) must leave at "
              "least one of the device's ",
              sms, " SMs, got ", *carveout);
  return sms - *carveout;
}

namespace {
// Attributes, not cudaDeviceProp: CUDA 13 dropped the clock fields from the struct (and
// torch's cached properties with them), while cudaDeviceGetAttribute still reports them.
// A query that fails (an attribute a platform does not report) leaves the field unknown.
DeviceInfo query_device_info(int device) {
  const auto attribute = [device](cudaDeviceAttr attr) -> int64_t {
    int value = 0;
    return cudaDeviceGetAttribute(&value, attr, device) == cudaSuccess && value > 0 ? value : 0;
  };
  DeviceInfo info;
  info.l2_bytes = attribute(cudaDevAttrL2CacheSize);
  info.memory_clock_khz = static_cast<int>(attribute(cudaDevAttrMemoryClockRate));
  info.memory_bus_bits = static_cast<int>(attribute(cudaDevAttrGlobalMemoryBusWidth));
  info.sm_clock_khz = static_cast<int>(attribute(cudaDevAttrClockRate));
  return info;
}
}  // namespace

const DeviceInfo& device_info(int device) {
  // One slot per device index, filled under its own once_flag: the first caller queries,
  // the others wait for it, and later calls read without a lock.
  constexpr int kMaxCachedDevices = 64;
  static std::array<std::once_flag, kMaxCachedDevices> once;
  static std::array<DeviceInfo, kMaxCachedDevices> cached;
  if (device < 0 || device >= kMaxCachedDevices) {
    thread_local DeviceInfo uncached;
    uncached = query_device_info(device);
    return uncached;
  }
  std::call_once(once[device], [device] { cached[device] = query_device_info(device); });
  return cached[device];
}
#endif

// Values, on CPU only (a Meta or traced tensor has none): every scale finite and positive.
void check_scale_values(const char* op, const char* arg, const at::Tensor& s) {
  if (!s.device().is_cpu() || s.numel() == 0) return;
  const at::Tensor flat = s.reshape({-1});
  const at::Tensor bad = at::logical_not(at::logical_and(at::isfinite(flat), flat > 0));
  if (!bad.any().item<bool>()) return;
  const int64_t i = bad.nonzero().select(1, 0)[0].item<int64_t>();
  std::ostringstream where;
  if (s.dim() == 2) {
    where << "[" << i / s.size(1) << ", " << i % s.size(1) << "]";
  } else {
    where << "flat index " << i;
  }
  TORCH_CHECK(false, op, ": argument '", arg,
              "' expected finite, positive dequantisation scales, got ", flat[i].item<float>(),
              " at ", where.str(), " of ", describe(s));
}

}  // namespace gemmt::wrapper
