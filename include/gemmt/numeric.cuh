// Element types on the device: ScalarType -> C++ type, and "opmath" conversions.
//
// Reduced-precision values are widened to float32 for arithmetic and rounded back once,
// to nearest even, matching PyTorch's CUDA kernels bit for bit. float64 computes in double
// (opmath_t<double> is double), as PyTorch does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "gemmt/types.h"

namespace gemmt {

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// IEEE single-precision operations, round to nearest even, never fused with a neighbour
// and never flushing subnormals. __fadd_rn and friends become the .ftz forms of these
// instructions when a file is compiled with -ftz=true or --use_fast_math; PyTorch keeps
// subnormals, and bit-equality with it includes them.
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Double counterparts of the pinned operations above, for the float64 paths.
__device__ __forceinline__ double add_rn(double a, double b) {
  double r;
  asm("add.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));
  return r;
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  double r;
  asm("mul.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));
  return r;
}
__device__ __forceinline__ double fma_rn(double a, double b, double c) {
  double r;
  asm("fma.rn.f64 %0, %1, %2, %3;" : "=d"(r) : "d"(a), "d"(b), "d"(c));
  return r;
}
__device__ __forceinline__ double div_rn(double a, double b) {
  double r;
  asm("div.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));
  return r;
}

// The arithmetic type of storage type T: float for float32 and the 16-bit types, double for
// float64. to_opmath / from_opmath widen and round once; for float64 they are the identity.
template <typename T>
struct OpMathOf {
  using type = float;
};
template <>
struct OpMathOf<double> {
  using type = double;
};
template <typename T>
using opmath_t = typename OpMathOf<T>::type;

template <typename T>
__device__ __forceinline__ opmath_t<T> to_opmath(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return to_float(v);
  }
}

template <typename T>
__device__ __forceinline__ T from_opmath(opmath_t<T> v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return from_float<T>(v);
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) for the C++ type of a floating-point dtype; returns
// cudaErrorInvalidValue for any other dtype. fn must return cudaError_t.
template <typename Fn>
cudaError_t dispatch_float_dtype(ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case ScalarType::kFloat32:
      return fn(TypeTag<float>{});
    case ScalarType::kFloat16:
      return fn(TypeTag<__half>{});
    case ScalarType::kBFloat16:
      return fn(TypeTag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// dispatch_float_dtype with float64 as well (as double), for the kernels that compute in
// opmath_t<T> and so have a float64 form.
template <typename Fn>
cudaError_t dispatch_float_or_double_dtype(ScalarType dtype, Fn&& fn) {
  if (dtype == ScalarType::kFloat64) return fn(TypeTag<double>{});
  return dispatch_float_dtype(dtype, fn);
}

}  // namespace gemmt
