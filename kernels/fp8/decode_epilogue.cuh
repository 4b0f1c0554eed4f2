// What the FP8 decode kernels (kernels/fp8/scaled_decode_fp8.cu, mma.sync, and
// kernels/fp8/scaled_decode_fp8_sm90.cu, wgmma) share: the argument checks both make, the
// float8 -> fp16 widening, the bias in its own dtype and the one rounding of a float32 result
// to C's dtype. One definition, so that the kernels give the same bits for the same sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gemmt/fp8_decode.h"
#include "gemmt/numeric.cuh"
#include "gemmt/types.h"

namespace gemmt {
namespace fp8_decode {

// Sets *why (when given) and returns false: the form of every refusal of the *_supported
// functions.
inline bool refuse(const char** why, const char* what) {
  if (why != nullptr) *why = what;
  return false;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline bool out_or_bias_dtype(ScalarType t) {
  return t == ScalarType::kBFloat16 || t == ScalarType::kFloat16 || t == ScalarType::kFloat32;
}

// The checks both kernels make: sizes (1..max_tokens tokens), formats, dtypes, 16-byte aligned
// operands, C's row stride and the scales. Each kernel adds its own (row strides, scalings,
// the device).
inline bool common_args_supported(const Fp8DecodeArgs& x, int64_t max_tokens, const char** why) {
  if (x.m < 1 || x.m > max_tokens) return refuse(why, "m outside the kernel's 1..32 or 1..64");
  if (x.n < 1 || x.n > (int64_t{1} << 30)) return refuse(why, "n outside 1..2^30");
  if (x.k < 16 || x.k > (int64_t{1} << 30) || x.k % 16 != 0) {
    return refuse(why, "k not a multiple of 16 in 16..2^30");
  }
  if (x.a_e5m2 && x.b_e5m2) return refuse(why, "both operands e5m2");
  if (!out_or_bias_dtype(x.out))
    return refuse(why, "output dtype not bfloat16, float16 or float32");
  if (x.bias != nullptr && !out_or_bias_dtype(x.bias_dtype)) {
    return refuse(why, "bias dtype not bfloat16, float16 or float32");
  }
  if (!aligned16(x.a) || !aligned16(x.w)) return refuse(why, "operands not 16-byte aligned");
  if (x.m > 1 && x.ldc < x.n) return refuse(why, "ldc < n");
  if (x.sa == nullptr || x.sb == nullptr) return refuse(why, "missing scales");
  return true;
}

// Four float8 values (one 32-bit word) as two fp16 pairs: bytes 0-1 in lo, 2-3 in hi, the
// lower byte in the lower half. Exact: every e4m3fn and e5m2 value (NaN and inf included) is
// an fp16 value; e5m2 is the high byte of an fp16.
template <bool kE5>
__device__ __forceinline__ void widen(uint32_t v, uint32_t& lo, uint32_t& hi) {
  if constexpr (kE5) {
    lo = __byte_perm(v, 0u, 0x1404);
    hi = __byte_perm(v, 0u, 0x3424);
  } else {
#if __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(v));
#else
    // Never launched: the host side refuses code built below compute capability 8.9.
    (void)v;
    lo = hi = 0;
    __trap();
#endif
  }
}

// bias[row * stride] as a float (bfloat16, float16 or float32).
__device__ __forceinline__ float load_bias(const void* bias, ScalarType dtype, int64_t stride,
                                           int row) {
  const int64_t i = static_cast<int64_t>(row) * stride;
  switch (dtype) {
    case ScalarType::kBFloat16:
      return to_float(static_cast<const __nv_bfloat16*>(bias)[i]);
    case ScalarType::kFloat16:
      return to_float(static_cast<const __half*>(bias)[i]);
    default:
      return static_cast<const float*>(bias)[i];
  }
}

// C[token][row] = v, rounded once to C's dtype (bfloat16, float16 or float32).
__device__ __forceinline__ void store_out(void* c, ScalarType out, int64_t ldc, int token, int row,
                                          float v) {
  const int64_t i = static_cast<int64_t>(token) * ldc + row;
  switch (out) {
    case ScalarType::kBFloat16:
      static_cast<__nv_bfloat16*>(c)[i] = from_float<__nv_bfloat16>(v);
      break;
    case ScalarType::kFloat16:
      static_cast<__half*>(c)[i] = from_float<__half>(v);
      break;
    default:
      static_cast<float*>(c)[i] = v;
      break;
  }
}

}  // namespace fp8_decode
}  // namespace gemmt
