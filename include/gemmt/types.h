// Plain data types shared by the CUDA kernels and the PyTorch glue.
// Nothing here includes torch: kernels/ sees only raw pointers, sizes and strides.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gemmt {

// Element types the kernels understand. The wrapper maps at::ScalarType onto these.
enum class ScalarType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kUInt8 = 3,
  kUInt16 = 4,
  kFloat64 = 5,
};

constexpr int kMaxDims = 8;

// Sizes and element strides of a non-contiguous input, outermost dimension first.
// The wrapper coalesces dimensions and refuses more than kMaxDims after coalescing.
struct StridedLayout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

inline std::size_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat64:
      return 8;
    case ScalarType::kFloat32:
      return 4;
    case ScalarType::kFloat16:
    case ScalarType::kBFloat16:
    case ScalarType::kUInt16:
      return 2;
    case ScalarType::kUInt8:
      return 1;
  }
  return 0;
}

inline const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32:
      return "float32";
    case ScalarType::kFloat16:
      return "float16";
    case ScalarType::kBFloat16:
      return "bfloat16";
    case ScalarType::kUInt8:
      return "uint8";
    case ScalarType::kUInt16:
      return "uint16";
    case ScalarType::kFloat64:
      return "float64";
  }
  return "unknown";
}

}  // namespace gemmt
