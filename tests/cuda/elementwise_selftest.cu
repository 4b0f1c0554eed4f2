// Standalone check of the memory-bound launchers (kernels/elementwise.cu, kernels/image.cu).
//
// Build from the repository root (one line):
//   nvcc -std=c++17 -O2 -Iinclude -gencode arch=compute_90,code=sm_90
//        tests/cuda/elementwise_selftest.cu kernels/elementwise.cu kernels/image.cu -o ewtest
//   ./ewtest [--no-bench] [--no-large] [--bench-only]
//
// Every launcher x dtype x input placement (aligned contiguous, storage offset 1, strided
// views, broadcast) x size (empty, 1..37, larger odd sizes) is compared bit for bit with a
// CPU reference that performs the same float32 operations and rounds with its own
// round-to-nearest-even code. NaN matches any NaN (payloads are not specified). Then tensors
// past 2^31 elements / bytes check the 64-bit indexing, and each op is timed on 256M
// elements against a device-to-device copy moving the same number of bytes.
// Exit status: 0 all passed (or no GPU), 1 a check failed, 2 a CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gemmt/elementwise.h"
#include "gemmt/types.h"

using gemmt::ScalarType;
using gemmt::StridedLayout;

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, \
                   __LINE__, #expr);                                                         \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

int g_failed = 0;
int g_passed = 0;

void pass() {
  ++g_passed;
}

void record(bool ok, const char* fmt, ...) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  if (g_failed > 50) return;  // the first failures say enough
  std::va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "FAIL: ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

// ---- Host-side reference arithmetic -----------------------------------------------------

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to +-inf (65520 and up)
  if (ax >= 0x38800000u) {                       // normal half: 2^-14 and up
    const std::uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | static_cast<std::uint16_t>((rounded - 0x38000000u) >> 13);
  }
  // Subnormal half: a multiple of 2^-24; scaling by 2^24 is exact and nearbyint rounds to
  // nearest even. 1024 (rounded up from the top of the range) encodes the smallest normal.
  const float scaled = bits_float(ax) * 16777216.0f;
  return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
}

float bf16_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

bool is_nan_bits(ScalarType t, std::uint32_t bits) {
  switch (t) {
    case ScalarType::kFloat32:
      return (bits & 0x7fffffffu) > 0x7f800000u;
    case ScalarType::kFloat16:
      return (bits & 0x7fffu) > 0x7c00u;
    case ScalarType::kBFloat16:
      return (bits & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

// Element i of a host byte buffer as float32 / raw bits.
float load_elem(ScalarType t, const std::vector<std::uint8_t>& buf, std::int64_t i) {
  switch (t) {
    case ScalarType::kFloat32: {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
    case ScalarType::kFloat16:
    case ScalarType::kBFloat16:
    case ScalarType::kUInt16: {
      std::uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      if (t == ScalarType::kFloat16) return half_to_float(h);
      if (t == ScalarType::kBFloat16) return bf16_to_float(h);
      return static_cast<float>(h);
    }
    case ScalarType::kUInt8:
      return static_cast<float>(buf[i]);
  }
  return 0.0f;
}

std::uint32_t load_bits(ScalarType t, const std::vector<std::uint8_t>& buf, std::int64_t i) {
  if (t == ScalarType::kFloat32) {
    std::uint32_t u;
    std::memcpy(&u, buf.data() + 4 * i, 4);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return h;
}

std::uint32_t round_to(ScalarType t, float v) {
  switch (t) {
    case ScalarType::kFloat32:
      return float_bits(v);
    case ScalarType::kFloat16:
      return float_to_half(v);
    case ScalarType::kBFloat16:
      return float_to_bf16(v);
    default:
      return 0;
  }
}

float round_trip(ScalarType t, float v) {
  switch (t) {
    case ScalarType::kFloat16:
      return half_to_float(float_to_half(v));
    case ScalarType::kBFloat16:
      return bf16_to_float(float_to_bf16(v));
    default:
      return v;
  }
}

// ---- Random data ------------------------------------------------------------------------

struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 1) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// Float32 test values: mostly ordinary magnitudes, some arbitrary bit patterns (NaN, inf,
// subnormals, huge values) and the usual suspects.
float random_float(Rng& rng) {
  static const float kSpecial[] = {0.0f,    -0.0f,         INFINITY,      -INFINITY, NAN,
                                   1e-45f,  -1.17549e-38f, 3.40282e+38f,  1.0f,      -1.5f,
                                   65504.f, 65520.f,       1.8446744e19f, 5.96e-8f};
  const std::uint64_t r = rng.next();
  switch (r % 8) {
    case 0:
      return bits_float(static_cast<std::uint32_t>(r >> 32));
    case 1:
      return kSpecial[(r >> 8) % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
    default: {
      const double unit = static_cast<double>(r >> 11) / 9007199254740992.0 - 0.5;
      const int exponent = static_cast<int>((r >> 3) % 41) - 20;
      return static_cast<float>(std::ldexp(unit, exponent));
    }
  }
}

void fill_random(ScalarType t, std::vector<std::uint8_t>& buf, Rng& rng) {
  const std::size_t es = gemmt::element_size(t);
  const std::size_t n = buf.size() / es;
  for (std::size_t i = 0; i < n; ++i) {
    if (t == ScalarType::kFloat32) {
      const float f = random_float(rng);
      std::memcpy(buf.data() + 4 * i, &f, 4);
    } else if (es == 2) {
      const std::uint16_t h = static_cast<std::uint16_t>(rng.next());
      std::memcpy(buf.data() + 2 * i, &h, 2);
    } else {
      buf[i] = static_cast<std::uint8_t>(rng.next());
    }
  }
}

// ---- Device memory ------------------------------------------------------------------------

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    if (n > 0) CHECK_CUDA(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint8_t* bytes_ptr() const { return static_cast<std::uint8_t*>(ptr); }
};

cudaStream_t g_stream = nullptr;

// Host-to-device copy ordered before the next launch on g_stream. A plain cudaMemcpy from
// pageable memory may return before its DMA lands, and g_stream is non-blocking, so it
// would not wait for that copy: kernels could read the old contents of the buffer.
void upload(void* dst, const void* src, std::size_t bytes) {
  CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
}

// ---- Views: how an input tensor of a given logical shape sits in its storage ---------------

enum class Placement {
  kAligned,       // contiguous, 16-byte aligned, no layout
  kOffset1,       // contiguous at storage offset 1 (misaligned), no layout
  kContigLayout,  // contiguous and aligned but described by a (dense) layout
  kTransposed,    // all dimensions reversed: the storage holds the transpose
  kSliced,        // every other element of the innermost dimension
  kBroadcast,     // stride 0 along the outermost dimension
};

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kAligned:
      return "aligned";
    case Placement::kOffset1:
      return "offset1";
    case Placement::kContigLayout:
      return "contig-layout";
    case Placement::kTransposed:
      return "transposed";
    case Placement::kSliced:
      return "sliced";
    case Placement::kBroadcast:
      return "broadcast";
  }
  return "?";
}

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    out += std::to_string(s[i]);
    if (i + 1 < s.size()) out += ",";
  }
  return out + "]";
}

struct View {
  Placement placement;
  std::int64_t storage_elems = 0;  // elements the storage must hold
  std::int64_t offset = 0;         // element offset of the view in its storage
  bool has_layout = false;
  StridedLayout layout;
};

View make_view(const Shape& shape, Placement p) {
  View v;
  v.placement = p;
  const int nd = static_cast<int>(shape.size());
  const std::int64_t numel = shape_numel(shape);
  switch (p) {
    case Placement::kAligned:
      v.storage_elems = numel;
      break;
    case Placement::kOffset1:
      v.storage_elems = numel + 1;
      v.offset = 1;
      break;
    case Placement::kContigLayout:
    case Placement::kTransposed:
    case Placement::kSliced:
    case Placement::kBroadcast: {
      v.has_layout = true;
      v.layout.ndim = nd;
      for (int d = 0; d < nd; ++d) v.layout.sizes[d] = shape[d];
      if (p == Placement::kContigLayout || p == Placement::kSliced) {
        std::int64_t stride = p == Placement::kSliced ? 2 : 1;
        for (int d = nd - 1; d >= 0; --d) {
          v.layout.strides[d] = stride;
          stride *= shape[d];
        }
        v.storage_elems = (p == Placement::kSliced ? 2 : 1) * numel;
      } else if (p == Placement::kTransposed) {
        // Storage is row-major over the reversed shape, so dimension d of the view walks
        // storage dimension nd - 1 - d: its stride is the product of the sizes before it.
        std::int64_t stride = 1;
        for (int d = 0; d < nd; ++d) {
          v.layout.strides[d] = stride;
          stride *= shape[d];
        }
        v.storage_elems = numel;
      } else {  // kBroadcast
        std::int64_t stride = 1;
        for (int d = nd - 1; d >= 1; --d) {
          v.layout.strides[d] = stride;
          stride *= shape[d];
        }
        v.layout.strides[0] = 0;
        v.storage_elems = nd > 0 && shape[0] > 0 ? numel / shape[0] : numel;
      }
      break;
    }
  }
  return v;
}

// Reference offset (in elements, relative to the view's start) of element `linear`.
std::int64_t view_offset(const View& v, std::int64_t linear) {
  if (!v.has_layout) return linear;
  std::int64_t off = 0;
  for (int d = v.layout.ndim - 1; d >= 0; --d) {
    const std::int64_t size = v.layout.sizes[d];
    off += (linear % size) * v.layout.strides[d];
    linear /= size;
  }
  return off;
}

// A view's storage on host and device.
struct Input {
  ScalarType dtype;
  View view;
  std::vector<std::uint8_t> host;
  DeviceBuffer dev;
  Input(ScalarType t, const View& v, Rng& rng)
      : dtype(t),
        view(v),
        host(static_cast<std::size_t>(v.storage_elems) * gemmt::element_size(t)),
        dev(host.size()) {
    fill_random(t, host, rng);
    if (!host.empty()) {
      upload(dev.ptr, host.data(), host.size());
    }
  }
  const void* device_ptr() const {
    if (dev.ptr == nullptr) return nullptr;
    return dev.bytes_ptr() + view.offset * gemmt::element_size(dtype);
  }
  const StridedLayout* layout() const { return view.has_layout ? &view.layout : nullptr; }
  std::int64_t storage_index(std::int64_t linear) const {
    return view.offset + view_offset(view, linear);
  }
  float value(std::int64_t linear) const { return load_elem(dtype, host, storage_index(linear)); }
};

// ---- Float elementwise ops ------------------------------------------------------------------

enum class FloatOp { kAdd, kSquare, kScale, kSquareBackward };

const char* op_name(FloatOp op) {
  switch (op) {
    case FloatOp::kAdd:
      return "add";
    case FloatOp::kSquare:
      return "square";
    case FloatOp::kScale:
      return "scale";
    case FloatOp::kSquareBackward:
      return "square_backward";
  }
  return "?";
}

int arity(FloatOp op) {
  return op == FloatOp::kAdd || op == FloatOp::kSquareBackward ? 2 : 1;
}

// volatile stops the host compiler from contracting or reassociating anything.
float reference_float_op(FloatOp op, ScalarType t, float a, float b, float factor) {
  volatile float r = 0.0f;
  switch (op) {
    case FloatOp::kAdd:
      r = a + b;
      break;
    case FloatOp::kSquare:
      r = a * a;
      break;
    case FloatOp::kScale:
      r = a * factor;
      break;
    case FloatOp::kSquareBackward: {
      volatile float twice = 2.0f * b;  // b is x, a is grad
      r = a * round_trip(t, twice);
      break;
    }
  }
  return r;
}

cudaError_t launch_float_op(FloatOp op, ScalarType t, std::int64_t numel, const void* a,
                            const StridedLayout* la, const void* b, const StridedLayout* lb,
                            float factor, void* out) {
  switch (op) {
    case FloatOp::kAdd:
      return gemmt::add_run(t, numel, a, la, b, lb, out, g_stream);
    case FloatOp::kSquare:
      return gemmt::square_run(t, numel, a, la, out, g_stream);
    case FloatOp::kScale:
      return gemmt::scale_run(t, numel, a, la, factor, out, g_stream);
    case FloatOp::kSquareBackward:
      return gemmt::square_backward_run(t, numel, a, la, b, lb, out, g_stream);
  }
  return cudaErrorInvalidValue;
}

// Runs one case and compares every element. out_offset1 shifts the output by one element
// (misaligned output: the kernels must fall back to the scalar path).
void check_float_case(FloatOp op, ScalarType t, const Shape& shape, Placement pa, Placement pb,
                      float factor, bool out_offset1, Rng& rng) {
  const std::int64_t numel = shape_numel(shape);
  Input a(t, make_view(shape, pa), rng);
  Input b(t, make_view(shape, pb), rng);
  const std::size_t es = gemmt::element_size(t);
  const std::int64_t out_shift = out_offset1 ? 1 : 0;
  DeviceBuffer out(static_cast<std::size_t>(numel + out_shift) * es);
  std::uint8_t* out_ptr = out.ptr ? out.bytes_ptr() + out_shift * es : nullptr;

  const cudaError_t err = launch_float_op(op, t, numel, a.device_ptr(), a.layout(), b.device_ptr(),
                                          b.layout(), factor, out_ptr);
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  const std::string what = std::string(op_name(op)) + " " + gemmt::scalar_type_name(t) + " " +
                           shape_str(shape) + " a=" + placement_name(pa) +
                           (arity(op) == 2 ? std::string(" b=") + placement_name(pb) : "") +
                           (out_offset1 ? " out=offset1" : "");
  if (err != cudaSuccess) {
    record(false, "%s: launcher returned %s", what.c_str(), cudaGetErrorName(err));
    return;
  }
  if (numel == 0) {
    pass();
    return;
  }
  std::vector<std::uint8_t> result(static_cast<std::size_t>(numel) * es);
  CHECK_CUDA(cudaMemcpy(result.data(), out_ptr, result.size(), cudaMemcpyDeviceToHost));

  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < numel; ++i) {
    const float expect_f = reference_float_op(op, t, a.value(i), b.value(i), factor);
    const std::uint32_t expect = round_to(t, expect_f);
    const std::uint32_t got = load_bits(t, result, i);
    const bool ok = got == expect || (is_nan_bits(t, got) && is_nan_bits(t, expect));
    if (!ok && bad++ < 3) {
      std::fprintf(stderr, "  %s: element %lld: a=%.9g b=%.9g expected 0x%x got 0x%x\n",
                   what.c_str(), static_cast<long long>(i), a.value(i), b.value(i), expect, got);
    }
  }
  record(bad == 0, "%s: %lld mismatches", what.c_str(), static_cast<long long>(bad));
}

void test_float_ops() {
  Rng rng(1);
  const ScalarType dtypes[] = {ScalarType::kFloat32, ScalarType::kFloat16, ScalarType::kBFloat16};
  const FloatOp ops[] = {FloatOp::kAdd, FloatOp::kSquare, FloatOp::kScale,
                         FloatOp::kSquareBackward};
  const float factors[] = {2.5f, 0.1f, -3.0f, 1e-30f, 0.0f};

  std::vector<Shape> flat;  // vector-path sizes: empty, every tail 1..37, odd larger sizes
  for (std::int64_t n = 0; n <= 37; ++n) flat.push_back({n});
  flat.push_back({1000});
  flat.push_back({4096 + 3});
  flat.push_back({(1 << 20) + 5});
  const std::vector<Shape> nd = {
      {2, 3},       {5, 7},       {16, 33},        {3, 1, 4},
      {2, 3, 4, 5}, {37, 41},     {7, 1, 9, 1, 3}, {2, 2, 2, 2, 2, 2, 2, 2},
      {257, 255},   {1031, 1023}, {0, 5}};
  const Placement all[] = {Placement::kAligned,    Placement::kOffset1, Placement::kContigLayout,
                           Placement::kTransposed, Placement::kSliced,  Placement::kBroadcast};

  for (ScalarType t : dtypes) {
    for (FloatOp op : ops) {
      int fi = 0;
      for (const Shape& s : flat) {
        const float factor = factors[fi++ % 5];
        check_float_case(op, t, s, Placement::kAligned, Placement::kAligned, factor, false, rng);
        check_float_case(op, t, s, Placement::kOffset1, Placement::kOffset1, factor, false, rng);
        if (arity(op) == 2) {
          check_float_case(op, t, s, Placement::kAligned, Placement::kOffset1, factor, false, rng);
        }
        check_float_case(op, t, s, Placement::kAligned, Placement::kAligned, factor, true, rng);
      }
      for (const Shape& s : nd) {
        for (Placement pa : all) {
          if (arity(op) == 1) {
            check_float_case(op, t, s, pa, pa, factors[fi++ % 5], false, rng);
          } else {
            for (Placement pb : all) {
              if (shape_numel(s) > 100000 && pb != Placement::kAligned && pb != pa) continue;
              check_float_case(op, t, s, pa, pb, factors[fi++ % 5], false, rng);
            }
          }
        }
      }
    }
  }
}

// ---- rgb_to_gray ----------------------------------------------------------------------------

std::uint8_t reference_gray(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, bool bgr) {
  const std::uint32_t r = bgr ? c2 : c0;
  const std::uint32_t b = bgr ? c0 : c2;
  return static_cast<std::uint8_t>((299 * r + 587 * c1 + 114 * b + 500) / 1000);
}

void check_rgb_case(const Shape& shape, Placement p, bool bgr, bool out_offset1, Rng& rng,
                    const std::vector<std::uint8_t>* fixed_data = nullptr,
                    const StridedLayout* custom_layout = nullptr, std::int64_t custom_storage = 0) {
  const std::int64_t numel = shape_numel(shape);
  const std::int64_t pixels = numel / 3;
  View view = make_view(shape, p);
  if (custom_layout != nullptr) {
    view.has_layout = true;
    view.layout = *custom_layout;
    view.storage_elems = custom_storage;
  }
  Input in(ScalarType::kUInt8, view, rng);
  if (fixed_data != nullptr) {
    std::copy(fixed_data->begin(), fixed_data->end(), in.host.begin() + view.offset);
    upload(in.dev.ptr, in.host.data(), in.host.size());
  }
  const std::int64_t out_shift = out_offset1 ? 1 : 0;
  DeviceBuffer out(static_cast<std::size_t>(pixels + out_shift));
  std::uint8_t* out_ptr = out.ptr ? out.bytes_ptr() + out_shift : nullptr;
  const cudaError_t err =
      gemmt::rgb_to_gray_run(pixels, static_cast<const std::uint8_t*>(in.device_ptr()), in.layout(),
                             bgr, out_ptr, g_stream);
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  const std::string what = std::string("rgb_to_gray ") + shape_str(shape) + " " +
                           (custom_layout ? "custom-layout" : placement_name(p)) +
                           (bgr ? " bgr" : " rgb") + (out_offset1 ? " out=offset1" : "");
  if (err != cudaSuccess) {
    record(false, "%s: launcher returned %s", what.c_str(), cudaGetErrorName(err));
    return;
  }
  if (pixels == 0) {
    pass();
    return;
  }
  std::vector<std::uint8_t> result(static_cast<std::size_t>(pixels));
  CHECK_CUDA(cudaMemcpy(result.data(), out_ptr, result.size(), cudaMemcpyDeviceToHost));
  std::int64_t bad = 0;
  for (std::int64_t px = 0; px < pixels; ++px) {
    const std::uint32_t c0 = in.host[in.storage_index(3 * px)];
    const std::uint32_t c1 = in.host[in.storage_index(3 * px + 1)];
    const std::uint32_t c2 = in.host[in.storage_index(3 * px + 2)];
    const std::uint8_t expect = reference_gray(c0, c1, c2, bgr);
    if (result[px] != expect && bad++ < 3) {
      std::fprintf(stderr, "  %s: pixel %lld (%u,%u,%u): expected %u got %u\n", what.c_str(),
                   static_cast<long long>(px), c0, c1, c2, expect, result[px]);
    }
  }
  record(bad == 0, "%s: %lld mismatches", what.c_str(), static_cast<long long>(bad));
}

void test_rgb_to_gray() {
  Rng rng(2);
  // The kernels divide by 1000 with a multiply-high; it must agree with integer division on
  // every numerator the formula can produce.
  bool div_ok = true;
  for (std::uint32_t num = 0; num <= 255500; ++num) {
    const std::uint32_t fast =
        static_cast<std::uint32_t>((static_cast<std::uint64_t>(num) * 4294968u) >> 32);
    div_ok = div_ok && fast == num / 1000;
  }
  record(div_ok, "multiply-high division by 1000 is not exact on [0, 255500]");

  for (bool bgr : {false, true}) {
    for (std::int64_t px = 0; px <= 37; ++px) {
      check_rgb_case({px, 3}, Placement::kAligned, bgr, false, rng);
      check_rgb_case({px, 3}, Placement::kOffset1, bgr, false, rng);
      check_rgb_case({px, 3}, Placement::kAligned, bgr, true, rng);
    }
    for (std::int64_t px : {100, 1000 + 7, 16 * 1024 + 15, (1 << 20) + 9}) {
      check_rgb_case({px, 3}, Placement::kAligned, bgr, false, rng);
      check_rgb_case({px, 3}, Placement::kOffset1, bgr, false, rng);
    }
    const std::vector<Shape> images = {
        {1, 1, 3}, {4, 5, 3}, {17, 33, 3}, {2, 31, 47, 3}, {480, 640, 3}};
    for (const Shape& s : images) {
      check_rgb_case(s, Placement::kAligned, bgr, false, rng);
      check_rgb_case(s, Placement::kContigLayout, bgr, false, rng);
      check_rgb_case(s, Placement::kSliced, bgr, false, rng);
      check_rgb_case(s, Placement::kBroadcast, bgr, false, rng);
      // Spatial transpose: [H, W, 3] read from [W, H, 3] storage.
      const std::int64_t h = s[s.size() - 3], w = s[s.size() - 2];
      StridedLayout tr;
      tr.ndim = 3;
      tr.sizes[0] = h, tr.sizes[1] = w, tr.sizes[2] = 3;
      tr.strides[0] = 3, tr.strides[1] = 3 * h, tr.strides[2] = 1;
      check_rgb_case({h, w, 3}, Placement::kAligned, bgr, false, rng, nullptr, &tr, h * w * 3);
      // Crop of a wider image, as [H, W, 3] and coalesced to [H, 3W].
      StridedLayout crop = tr;
      crop.strides[0] = 3 * (w + 5), crop.strides[1] = 3;
      check_rgb_case({h, w, 3}, Placement::kAligned, bgr, false, rng, nullptr, &crop,
                     h * (w + 5) * 3);
      StridedLayout crop2;
      crop2.ndim = 2;
      crop2.sizes[0] = h, crop2.sizes[1] = 3 * w;
      crop2.strides[0] = 3 * (w + 5), crop2.strides[1] = 1;
      check_rgb_case({h, w, 3}, Placement::kAligned, bgr, false, rng, nullptr, &crop2,
                     h * (w + 5) * 3);
      // An innermost dimension that is not a multiple of 3 (pixels straddle its rows).
      StridedLayout odd;
      odd.ndim = 2;
      odd.sizes[0] = 3, odd.sizes[1] = h * w;
      odd.strides[0] = 1, odd.strides[1] = 4;
      check_rgb_case({h, w, 3}, Placement::kAligned, bgr, false, rng, nullptr, &odd, 4 * h * w + 3);
    }
    // Every colour once, through the vector path and the scalar path.
    std::vector<std::uint8_t> all(3u << 24);
    for (std::uint32_t c = 0; c < (1u << 24); ++c) {
      all[3 * c] = static_cast<std::uint8_t>(c);
      all[3 * c + 1] = static_cast<std::uint8_t>(c >> 8);
      all[3 * c + 2] = static_cast<std::uint8_t>(c >> 16);
    }
    check_rgb_case({1 << 24, 3}, Placement::kAligned, bgr, false, rng, &all);
    check_rgb_case({1 << 24, 3}, Placement::kOffset1, bgr, false, rng, &all);
  }
}

// ---- normalize_volume -------------------------------------------------------------------------

void check_normalize_case(ScalarType t, const Shape& shape, Placement p, float max_val, Rng& rng,
                          bool all_values = false) {
  const std::int64_t numel = shape_numel(shape);
  Input in(t, make_view(shape, p), rng);
  if (all_values) {
    // Logical element i holds i (mod the type's range): every representable value once.
    for (std::int64_t i = 0; i < numel; ++i) {
      const std::int64_t s = in.storage_index(i);
      if (t == ScalarType::kUInt8) {
        in.host[s] = static_cast<std::uint8_t>(i);
      } else {
        const std::uint16_t v = static_cast<std::uint16_t>(i);
        std::memcpy(in.host.data() + 2 * s, &v, 2);
      }
    }
    upload(in.dev.ptr, in.host.data(), in.host.size());
  }
  DeviceBuffer out(static_cast<std::size_t>(numel) * 4);
  const cudaError_t err = gemmt::normalize_volume_run(
      t, numel, in.device_ptr(), in.layout(), max_val, static_cast<float*>(out.ptr), g_stream);
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  char what[256];
  std::snprintf(what, sizeof(what), "normalize_volume %s %s %s max_val=%.9g",
                gemmt::scalar_type_name(t), shape_str(shape).c_str(), placement_name(p), max_val);
  if (err != cudaSuccess) {
    record(false, "%s: launcher returned %s", what, cudaGetErrorName(err));
    return;
  }
  if (numel == 0) {
    pass();
    return;
  }
  std::vector<float> result(static_cast<std::size_t>(numel));
  CHECK_CUDA(cudaMemcpy(result.data(), out.ptr, result.size() * 4, cudaMemcpyDeviceToHost));
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < numel; ++i) {
    const volatile float v = in.value(i);
    const volatile float expect = v / max_val;  // IEEE division on the host
    const std::uint32_t e = float_bits(expect), g = float_bits(result[i]);
    const bool ok = e == g || (std::isnan(expect) && std::isnan(result[i]));
    if (!ok && bad++ < 3) {
      std::fprintf(stderr, "  %s: element %lld (%g): expected %.9g got %.9g\n", what,
                   static_cast<long long>(i), static_cast<float>(v), static_cast<float>(expect),
                   result[i]);
    }
  }
  record(bad == 0, "%s: %lld mismatches", what, static_cast<long long>(bad));
}

void test_normalize_volume() {
  Rng rng(3);
  // The first 12 take the reciprocal-based division, from 0x1.8p59f on they straddle the edges
  // of its range, the rest take the IEEE division instruction.
  const float divisors[] = {255.0f,    65535.0f,   4095.0f,         1023.0f,    3.0f,     7.0f,
                            0.3f,      1e-5f,      -3.0f,           12345.678f, 0x1p-60f, 0x1p60f,
                            0x1.8p59f, 0x1.8p-60f, 0x1.fffffep-61f, 0x1p61f,    1e30f,    0.0f,
                            -0.0f,     1e-40f,     INFINITY,        NAN};
  for (ScalarType t : {ScalarType::kUInt8, ScalarType::kUInt16}) {
    const std::int64_t range = t == ScalarType::kUInt8 ? 256 : 65536;
    for (float d : divisors) {
      check_normalize_case(t, {range}, Placement::kAligned, d, rng, true);
      check_normalize_case(t, {range}, Placement::kOffset1, d, rng, true);
    }
    int di = 0;
    for (std::int64_t n = 0; n <= 37; ++n) {
      const float d = divisors[di++ % 8];
      check_normalize_case(t, {n}, Placement::kAligned, d, rng);
      check_normalize_case(t, {n}, Placement::kOffset1, d, rng);
    }
    for (std::int64_t n : {1000 + 3, (1 << 20) + 7}) {
      check_normalize_case(t, {n}, Placement::kAligned, 4095.0f, rng);
      check_normalize_case(t, {n}, Placement::kOffset1, 4095.0f, rng);
    }
    const std::vector<Shape> vols = {{2, 3, 5}, {16, 17, 18}, {64, 65, 67}, {3, 1, 5, 7}};
    for (const Shape& s : vols) {
      for (Placement p : {Placement::kContigLayout, Placement::kTransposed, Placement::kSliced,
                          Placement::kBroadcast}) {
        check_normalize_case(t, s, p, divisors[di++ % 12], rng);
      }
    }
  }
}

// ---- Argument handling -----------------------------------------------------------------------

void test_arguments() {
  // numel == 0 must not touch the (null) pointers nor launch anything.
  record(gemmt::add_run(ScalarType::kFloat32, 0, nullptr, nullptr, nullptr, nullptr, nullptr,
                        g_stream) == cudaSuccess,
         "add_run with numel 0 did not return cudaSuccess");
  record(gemmt::rgb_to_gray_run(0, nullptr, nullptr, false, nullptr, g_stream) == cudaSuccess,
         "rgb_to_gray_run with 0 pixels did not return cudaSuccess");
  record(gemmt::normalize_volume_run(ScalarType::kUInt16, 0, nullptr, nullptr, 1.0f, nullptr,
                                     g_stream) == cudaSuccess,
         "normalize_volume_run with numel 0 did not return cudaSuccess");
  DeviceBuffer buf(1024);
  record(gemmt::square_run(ScalarType::kUInt8, 4, buf.ptr, nullptr, buf.ptr, g_stream) ==
             cudaErrorInvalidValue,
         "square_run accepted uint8");
  record(
      gemmt::normalize_volume_run(ScalarType::kFloat32, 4, buf.ptr, nullptr, 1.0f,
                                  static_cast<float*>(buf.ptr), g_stream) == cudaErrorInvalidValue,
      "normalize_volume_run accepted float32");
  StridedLayout too_deep;
  too_deep.ndim = gemmt::kMaxDims + 1;
  record(gemmt::scale_run(ScalarType::kFloat32, 4, buf.ptr, &too_deep, 2.0f, buf.ptr, g_stream) ==
             cudaErrorInvalidValue,
         "scale_run accepted ndim > kMaxDims");
  record(gemmt::square_run(ScalarType::kFloat32, -1, buf.ptr, nullptr, buf.ptr, g_stream) ==
             cudaErrorInvalidValue,
         "square_run accepted a negative numel");
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  record(cudaGetLastError() == cudaSuccess, "a refused call left a CUDA error behind");
}

// ---- Past 2^31 elements / bytes -------------------------------------------------------------

__host__ __device__ inline std::uint32_t hash32(std::uint64_t i) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
  return static_cast<std::uint32_t>(z >> 32);
}

template <typename T>
__global__ void fill_hash_kernel(T* p, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = static_cast<T>(hash32(static_cast<std::uint64_t>(i)));
  }
}

template <typename T>
void fill_hash(T* p, std::int64_t n) {
  fill_hash_kernel<<<4096, 256, 0, g_stream>>>(p, n);
  CHECK_CUDA(cudaGetLastError());
}

// Windows of the output worth reading back: the start, around 2^31 and 2^32 (elements and
// bytes), and the end.
std::vector<std::int64_t> window_starts(std::int64_t n, std::int64_t elem_bytes) {
  std::vector<std::int64_t> starts = {0, n - 4096};
  for (std::int64_t edge : {std::int64_t{1} << 31, std::int64_t{1} << 32}) {
    for (std::int64_t scale : {std::int64_t{1}, elem_bytes}) {
      const std::int64_t e = edge / scale;
      if (e < n) starts.push_back(std::max<std::int64_t>(0, e - 2048));
    }
  }
  for (std::int64_t& s : starts) s = std::max<std::int64_t>(0, std::min(s, n - 4096));
  return starts;
}

bool enough_memory(std::size_t bytes) {
  std::size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return free_b > bytes + (std::size_t{1} << 30);
}

void test_large() {
  // square, float16, 2^31 + 13 elements: element indices past int32.
  {
    const std::int64_t n = (std::int64_t{1} << 31) + 13;
    if (!enough_memory(static_cast<std::size_t>(n) * 4)) {
      std::printf("skip: large float16 square (not enough device memory)\n");
    } else {
      DeviceBuffer x(static_cast<std::size_t>(n) * 2), out(static_cast<std::size_t>(n) * 2);
      fill_hash(static_cast<std::uint16_t*>(x.ptr), n);
      const cudaError_t err =
          gemmt::square_run(ScalarType::kFloat16, n, x.ptr, nullptr, out.ptr, g_stream);
      CHECK_CUDA(cudaStreamSynchronize(g_stream));
      record(err == cudaSuccess, "large square: launcher returned %s", cudaGetErrorName(err));
      std::int64_t bad = 0;
      for (std::int64_t s : window_starts(n, 2)) {
        std::vector<std::uint16_t> got(4096);
        CHECK_CUDA(
            cudaMemcpy(got.data(), out.bytes_ptr() + 2 * s, 4096 * 2, cudaMemcpyDeviceToHost));
        for (std::int64_t i = 0; i < 4096; ++i) {
          const float v = half_to_float(static_cast<std::uint16_t>(hash32(s + i)));
          const std::uint32_t expect = float_to_half(v * v);
          if (got[i] != expect && !(is_nan_bits(ScalarType::kFloat16, got[i]) &&
                                    is_nan_bits(ScalarType::kFloat16, expect))) {
            ++bad;
          }
        }
      }
      record(bad == 0, "large float16 square: %lld mismatches", static_cast<long long>(bad));
    }
  }
  // rgb_to_gray with > 2^31 input bytes and a tail.
  {
    const std::int64_t pixels = (std::int64_t{1} << 31) / 3 * 2 + 11;  // ~4.3 GB of input
    if (!enough_memory(static_cast<std::size_t>(pixels) * 4)) {
      std::printf("skip: large rgb_to_gray (not enough device memory)\n");
    } else {
      DeviceBuffer in(static_cast<std::size_t>(pixels) * 3), out(static_cast<std::size_t>(pixels));
      fill_hash(in.bytes_ptr(), pixels * 3);
      const cudaError_t err =
          gemmt::rgb_to_gray_run(pixels, in.bytes_ptr(), nullptr, false, out.bytes_ptr(), g_stream);
      CHECK_CUDA(cudaStreamSynchronize(g_stream));
      record(err == cudaSuccess, "large rgb_to_gray: launcher returned %s", cudaGetErrorName(err));
      std::int64_t bad = 0;
      for (std::int64_t s : window_starts(pixels, 3)) {
        std::vector<std::uint8_t> got(4096);
        CHECK_CUDA(cudaMemcpy(got.data(), out.bytes_ptr() + s, 4096, cudaMemcpyDeviceToHost));
        for (std::int64_t i = 0; i < 4096; ++i) {
          const std::int64_t p = s + i;
          const std::uint8_t expect =
              reference_gray(static_cast<std::uint8_t>(hash32(3 * p)),
                             static_cast<std::uint8_t>(hash32(3 * p + 1)),
                             static_cast<std::uint8_t>(hash32(3 * p + 2)), false);
          if (got[i] != expect) ++bad;
        }
      }
      record(bad == 0, "large rgb_to_gray: %lld mismatches", static_cast<long long>(bad));
    }
  }
  // normalize_volume, uint8, 2^31 + 5 elements, strided (every other byte) so that the
  // scalar path's offsets pass 2^32.
  {
    const std::int64_t n = (std::int64_t{1} << 31) + 5;
    if (!enough_memory(static_cast<std::size_t>(n) * 6)) {
      std::printf("skip: large normalize_volume (not enough device memory)\n");
    } else {
      DeviceBuffer in(static_cast<std::size_t>(n) * 2), out(static_cast<std::size_t>(n) * 4);
      fill_hash(in.bytes_ptr(), n * 2);
      StridedLayout every_other;
      every_other.ndim = 1;
      every_other.sizes[0] = n;
      every_other.strides[0] = 2;
      for (const StridedLayout* layout : {static_cast<const StridedLayout*>(nullptr),
                                          static_cast<const StridedLayout*>(&every_other)}) {
        const cudaError_t err = gemmt::normalize_volume_run(
            ScalarType::kUInt8, n, in.ptr, layout, 255.0f, static_cast<float*>(out.ptr), g_stream);
        CHECK_CUDA(cudaStreamSynchronize(g_stream));
        record(err == cudaSuccess, "large normalize_volume: launcher returned %s",
               cudaGetErrorName(err));
        const std::int64_t step = layout ? 2 : 1;
        std::int64_t bad = 0;
        for (std::int64_t s : window_starts(n, 4)) {
          std::vector<float> got(4096);
          CHECK_CUDA(cudaMemcpy(got.data(), static_cast<float*>(out.ptr) + s, 4096 * 4,
                                cudaMemcpyDeviceToHost));
          for (std::int64_t i = 0; i < 4096; ++i) {
            const volatile float v =
                static_cast<float>(static_cast<std::uint8_t>(hash32((s + i) * step)));
            const volatile float expect = v / 255.0f;
            if (float_bits(got[i]) != float_bits(expect)) ++bad;
          }
        }
        record(bad == 0, "large normalize_volume (%s): %lld mismatches",
               layout ? "strided" : "contiguous", static_cast<long long>(bad));
      }
    }
  }
}

// ---- Bandwidth ---------------------------------------------------------------------------------

double median_ms(const std::function<cudaError_t()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) CHECK_CUDA(fn());
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  CHECK_CUDA(cudaEventRecord(ev[0], g_stream));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(fn());
    CHECK_CUDA(cudaEventRecord(ev[i + 1], g_stream));
  }
  CHECK_CUDA(cudaEventSynchronize(ev[iters]));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

void bench() {
  const std::int64_t n = std::int64_t{256} << 20;
  const std::size_t big = static_cast<std::size_t>(n) * 4;  // 1 GiB: the largest operand
  if (!enough_memory(6 * big + 256)) {
    std::printf("skip: benchmarks (not enough device memory)\n");
    return;
  }
  DeviceBuffer a(big + 64), b(big + 64), out(big + 64), copy_src(big * 3 / 2),
      copy_dst(big * 3 / 2);
  // Finite, ordinary values: nothing data-dependent in the timing.
  fill_hash(static_cast<std::uint8_t*>(a.ptr), static_cast<std::int64_t>(big));
  fill_hash(static_cast<std::uint8_t*>(b.ptr), static_cast<std::int64_t>(big));
  CHECK_CUDA(cudaMemsetAsync(copy_src.ptr, 1, copy_src.bytes, g_stream));
  CHECK_CUDA(cudaStreamSynchronize(g_stream));

  std::printf("\n%-34s %9s %10s %10s %7s\n", "op (256M elements)", "ms", "GB/s", "copy GB/s",
              "ratio");
  const int iters = 20;
  auto row = [&](const std::string& name, double bytes, const std::function<cudaError_t()>& fn) {
    const double ms = median_ms(fn, iters);
    const std::size_t copy_bytes = static_cast<std::size_t>(bytes / 2);
    const double copy_ms = median_ms(
        [&] {
          return cudaMemcpyAsync(copy_dst.ptr, copy_src.ptr, copy_bytes, cudaMemcpyDeviceToDevice,
                                 g_stream);
        },
        iters);
    const double gbs = bytes / ms * 1e-6, copy_gbs = bytes / copy_ms * 1e-6;
    std::printf("%-34s %9.3f %10.1f %10.1f %6.1f%%\n", name.c_str(), ms, gbs, copy_gbs,
                100.0 * gbs / copy_gbs);
  };

  const ScalarType dtypes[] = {ScalarType::kFloat32, ScalarType::kFloat16, ScalarType::kBFloat16};
  for (ScalarType t : dtypes) {
    const double es = static_cast<double>(gemmt::element_size(t));
    const std::string tn = gemmt::scalar_type_name(t);
    row("add " + tn, 3 * es * n,
        [&] { return gemmt::add_run(t, n, a.ptr, nullptr, b.ptr, nullptr, out.ptr, g_stream); });
    row("square " + tn, 2 * es * n,
        [&] { return gemmt::square_run(t, n, a.ptr, nullptr, out.ptr, g_stream); });
    row("scale " + tn, 2 * es * n,
        [&] { return gemmt::scale_run(t, n, a.ptr, nullptr, 0.5f, out.ptr, g_stream); });
    row("square_backward " + tn, 3 * es * n, [&] {
      return gemmt::square_backward_run(t, n, a.ptr, nullptr, b.ptr, nullptr, out.ptr, g_stream);
    });
  }
  // The scalar fallback, for reference.
  row("add float32 (offset 1, scalar)", 3 * 4.0 * n, [&] {
    return gemmt::add_run(ScalarType::kFloat32, n, static_cast<float*>(a.ptr) + 1, nullptr,
                          static_cast<float*>(b.ptr) + 1, nullptr, out.ptr, g_stream);
  });
  row("rgb_to_gray", 4.0 * n, [&] {
    return gemmt::rgb_to_gray_run(n, a.bytes_ptr(), nullptr, false, out.bytes_ptr(), g_stream);
  });
  row("normalize_volume uint8", 5.0 * n, [&] {
    return gemmt::normalize_volume_run(ScalarType::kUInt8, n, a.ptr, nullptr, 255.0f,
                                       static_cast<float*>(out.ptr), g_stream);
  });
  row("normalize_volume uint16", 6.0 * n, [&] {
    return gemmt::normalize_volume_run(ScalarType::kUInt16, n, a.ptr, nullptr, 4095.0f,
                                       static_cast<float*>(out.ptr), g_stream);
  });
}

}  // namespace

int main(int argc, char** argv) {
  bool run_tests = true, run_bench = true, run_large = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-bench") {
      run_bench = false;
    } else if (arg == "--no-large") {
      run_large = false;
    } else if (arg == "--bench-only") {
      run_tests = false;
      run_large = false;
    } else {
      std::fprintf(stderr, "usage: %s [--no-bench] [--no-large] [--bench-only]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  // A non-blocking stream: work launched on the legacy default stream by mistake would not
  // be ordered with it, and tends to show up as wrong results.
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

  if (run_tests) {
    test_arguments();
    test_float_ops();
    test_rgb_to_gray();
    test_normalize_volume();
  }
  if (run_large) test_large();
  CHECK_CUDA(cudaDeviceSynchronize());
  if (run_tests || run_large) {
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    std::printf(g_failed == 0 ? "PASS\n" : "FAIL\n");
  }
  if (run_bench) bench();
  CHECK_CUDA(cudaStreamDestroy(g_stream));
  return g_failed == 0 ? 0 : 1;
}
