// The arguments of one GEMM, C = alpha * A @ B + beta * C, as the kernels and their planners
// see them (see gemm.h for the contract). Free of CUDA headers, so that the planners in
// kernels/plan/ compile, and are tested, without CUDA.
#pragma once

#include <cstdint>

#include "gemmt/activation.h"
#include "gemmt/device_info.h"
#include "gemmt/types.h"

namespace gemmt {

// What the epilogue applies to v = alpha * A @ B + beta * C, element by element, before C is
// written: z = v + bias, C = act(z), and optionally z itself to `preact` (what a Linear
// layer's backward needs for GELU and SiLU). All in float32 from the float32 accumulator
// (float64 from the float64 accumulator for float64 tensors), rounded once to the dtype. An empty
// epilogue is the plain product.
struct GemmEpilogue {
  const void* bias = nullptr;  // dtype of C; n values (one per column), or m with bias_per_row
  bool bias_per_row = false;   // set when the caller transposed the problem (C^T = B^T A^T)
  Activation activation = Activation::kNone;
  void* preact = nullptr;  // m x n, row-major with leading dimension ld_preact >= n
  int64_t ld_preact = 0;
  bool empty() const {
    return bias == nullptr && activation == Activation::kNone && preact == nullptr;
  }
};

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t a_stride_m = 0, a_stride_k = 0;
  const void* b = nullptr;
  int64_t b_stride_k = 0, b_stride_n = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  // Double so that float64 products scale exactly; the other kernels round them to float.
  double alpha = 1.0, beta = 0.0;
  GemmEpilogue epilogue;
  ScalarType dtype = ScalarType::kFloat32;
  // float32 only: the caller allows inputs rounded to TF32 on the tensor cores.
  bool allow_tf32 = false;
  // Caller asks for run-to-run bitwise reproducibility (torch.use_deterministic_algorithms).
  bool deterministic = false;
  // Properties of the device the pointers live on (the wrapper fills these from a cache).
  int sm_count = 1;
  int cc_major = 0, cc_minor = 0;
  // L2 size, DRAM bandwidth and SM clock (gemmt/device_info.h); unknown fields plan as on
  // the reference device.
  DeviceInfo device;
};

}  // namespace gemmt
