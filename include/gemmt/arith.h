// Integer and address arithmetic shared by the kernels, their launchers and the planners:
// the one ceil_div, the one grid limit and the one alignment test. Free of CUDA headers (the
// planners in kernels/plan/ are plain C++); callable from device code when compiled by nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GEMMT_ARITH_HD __host__ __device__ __forceinline__
#else
#define GEMMT_ARITH_HD inline
#endif

namespace gemmt {

// gridDim.x limit on every architecture the project builds for (sm_30 onwards).
constexpr std::int64_t kMaxGridX = 2147483647;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// True when p is a multiple of `bytes`, a power of two.
GEMMT_ARITH_HD bool is_aligned(const void* p, std::size_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) == 0;
}

template <int kAlign>
GEMMT_ARITH_HD bool is_aligned(const void* p) {
  static_assert(kAlign > 0 && (kAlign & (kAlign - 1)) == 0, "alignment must be a power of two");
  return is_aligned(p, static_cast<std::size_t>(kAlign));
}

}  // namespace gemmt
