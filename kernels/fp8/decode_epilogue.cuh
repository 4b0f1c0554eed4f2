// The FP8 decode kernels' epilogue pieces (kernels/fp8/scaled_decode_fp8.cu, mma.sync, and
// kernels/fp8/scaled_decode_fp8_sm90.cu, wgmma): the bias in its own dtype and the one
// rounding of a float32 result to C's dtype. One definition, so that both kernels give the
// same bits for the same float32 sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gemmt/numeric.cuh"
#include "gemmt/types.h"

namespace gemmt {
namespace fp8_decode {

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
