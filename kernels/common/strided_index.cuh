// Linear index -> element offset through a StridedLayout, with 64-bit arithmetic.
//
// Element `linear` of a tensor (row-major order over layout.sizes) lives at
// base[strided_offset(linear, layout)]. A layout with ndim == 0 stands for a contiguous
// tensor here, so that kernels can take one code path for "maybe strided" inputs.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/elementwise.h"

namespace gemmt {

// Divides by a runtime size. 64-bit integer division is a long software sequence on the
// GPU while 32-bit is a handful of instructions, and almost every index and size fits in
// 32 bits, so the narrow form is tried first.
__host__ __device__ __forceinline__ void divmod_index(std::int64_t value, std::int64_t divisor,
                                                      std::int64_t* quotient,
                                                      std::int64_t* remainder) {
  if (((static_cast<std::uint64_t>(value) | static_cast<std::uint64_t>(divisor)) >> 32) == 0) {
    const std::uint32_t v = static_cast<std::uint32_t>(value);
    const std::uint32_t d = static_cast<std::uint32_t>(divisor);
    const std::uint32_t q = v / d;
    *quotient = q;
    *remainder = v - q * d;
  } else {
    const std::int64_t q = value / divisor;
    *quotient = q;
    *remainder = value - q * divisor;
  }
}

__host__ __device__ __forceinline__ std::int64_t strided_offset(std::int64_t linear,
                                                                const StridedLayout& layout) {
  if (layout.ndim <= 0) return linear;
  std::int64_t offset = 0;
  std::int64_t rest = linear;
  // Unrolled over the fixed maximum so that every sizes[d] / strides[d] has a constant
  // index: a layout passed as a kernel parameter is then read straight from the parameter
  // bank instead of being copied to local memory for dynamic indexing.
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int d = kMaxDims - 1; d > 0; --d) {
    if (d < layout.ndim) {
      std::int64_t q, r;
      divmod_index(rest, layout.sizes[d], &q, &r);
      offset += r * layout.strides[d];
      rest = q;
    }
  }
  // The outermost dimension needs no division: what is left of the index is its coordinate.
  return offset + rest * layout.strides[0];
}

// Host-side checks on a layout handed to a launcher.
inline bool layout_is_valid(const StridedLayout* layout) {
  if (layout == nullptr) return true;
  if (layout->ndim < 0 || layout->ndim > kMaxDims) return false;
  for (int d = 0; d < layout->ndim; ++d) {
    if (layout->sizes[d] < 0) return false;
  }
  return true;
}

// True when the layout addresses its elements densely in row-major order, so the tensor can
// take the contiguous (vector) path. Size-1 dimensions carry any stride.
inline bool layout_is_contiguous(const StridedLayout* layout) {
  if (layout == nullptr || layout->ndim == 0) return true;
  std::int64_t expected = 1;
  for (int d = layout->ndim - 1; d >= 0; --d) {
    const std::int64_t size = layout->sizes[d];
    if (size == 0) return true;
    if (size != 1 && layout->strides[d] != expected) return false;
    expected *= size;
  }
  return true;
}

// Row view of a layout: true when its last dimension is dense (stride 1) and the outer
// dimensions collapse into one row index with a uniform row stride, as a slice of the
// columns of a row-major tensor (gate = h[:, :n]) does. *cols is the last size, *ld the row
// stride. nullptr stands for a contiguous tensor of `cols` columns.
inline bool layout_rows(const StridedLayout* layout, std::int64_t cols, std::int64_t* ld) {
  if (layout == nullptr || layout->ndim == 0) {
    *ld = cols;
    return true;
  }
  const int n = layout->ndim;
  if (layout->sizes[n - 1] != cols || (cols > 1 && layout->strides[n - 1] != 1)) return false;
  if (n == 1) {
    *ld = cols;
    return true;
  }
  std::int64_t row_stride = layout->sizes[n - 2] == 1 ? cols : layout->strides[n - 2];
  std::int64_t expected = row_stride * layout->sizes[n - 2];
  for (int d = n - 3; d >= 0; --d) {
    const std::int64_t size = layout->sizes[d];
    if (size == 0) break;
    if (size != 1 && layout->strides[d] != expected) return false;
    expected *= size;
  }
  *ld = row_stride;
  return true;
}

// A base pointer and its layout, passed by value to kernels. ndim == 0 means contiguous.
template <typename T>
struct StridedPtr {
  const T* ptr;
  StridedLayout layout;

  __device__ __forceinline__ T operator[](std::int64_t linear) const {
    return ptr[strided_offset(linear, layout)];
  }
};

// Builds the kernel argument: a contiguous layout (or none) collapses to ndim == 0 so that
// the kernel skips the index arithmetic.
template <typename T>
inline StridedPtr<T> make_strided_ptr(const void* ptr, const StridedLayout* layout) {
  StridedPtr<T> out{static_cast<const T*>(ptr), StridedLayout{}};
  if (!layout_is_contiguous(layout)) out.layout = *layout;
  return out;
}

}  // namespace gemmt
