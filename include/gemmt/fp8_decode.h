// The FP8 decode product (kernels/fp8/scaled_decode_fp8.cu), the path gemmt::scaled_mm takes
// for a few tokens against a K-major weight:
//   C (m x n) = act(dequant(a) @ dequant(b) + bias),  b = W^T with W (n x k) row-major,
// a (m x k) the tokens, both float8 (e4m3fn or e5m2, not both e5m2), m <= 64. Raw pointers,
// sizes and strides only.
//
// Scales are dequantisation scales (float32), read through two strides each:
//   kRowCol  C[r][c] = (sum_k a[r][k] b[k][c]) * sa[r * sa_s0] * sb[c * sb_s1]
//            (tensorwise: both strides 0; rowwise: scale_a (m, 1), scale_b (1, n));
//   kBlock   each 128-deep slice kb of the sum scaled by sa[(r >> a_shift) * sa_s0 + kb * sa_s1]
//            * sb[kb * sb_s0 + (c >> b_shift) * sb_s1] before it joins the float32 total
//            (a_shift 0: 1x128 blocks of a, 7: 128x128; b_shift 7: 128x128 blocks of b, 0:
//            128x1).
// Products of float8 values are exact; they are summed in float32 (each 64-deep slice of K
// summed on the tensor cores from zero, then added to the float32 total), so the result is
// that of a float32 dot product of the dequantised inputs, independent of K's length.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemmt/activation.h"
#include "gemmt/types.h"

namespace gemmt {

enum class Fp8DecodeScale : int { kRowCol = 0, kBlock = 1 };

struct Fp8DecodeArgs {
  bool a_e5m2 = false;  // tokens' format (else e4m3fn)
  bool b_e5m2 = false;  // weight's format
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // m rows of k bytes, row stride lda (bytes)
  int64_t lda = 0;
  const void* w = nullptr;  // n rows of k bytes (b^T), row stride ldw (bytes)
  int64_t ldw = 0;
  void* c = nullptr;  // m x n, row stride ldc (elements), of type out
  int64_t ldc = 0;
  ScalarType out = ScalarType::kBFloat16;  // kBFloat16, kFloat16 or kFloat32
  Fp8DecodeScale scale = Fp8DecodeScale::kRowCol;
  const float* sa = nullptr;
  int64_t sa_s0 = 0, sa_s1 = 0;
  int a_shift = 0;
  const float* sb = nullptr;
  int64_t sb_s0 = 0, sb_s1 = 0;
  int b_shift = 0;
  const void* bias = nullptr;  // n values of type bias_dtype at bias[c * bias_stride]
  ScalarType bias_dtype = ScalarType::kFloat32;
  int64_t bias_stride = 1;
  Activation act = Activation::kNone;
  int sm_count = 1;  // SMs of the device the pointers live on
  // The Hopper variant's CTAs along K (a cluster each, 1-8); 0 leaves it to its planner.
  int k_split = 0;
  int cc_major = 0;  // its compute capability (clusters along K from 9)
  // use_fast_accum: the Hopper variant may sum with the tensor cores' float8 accumulation
  // (each 128-deep slice summed on the tensor cores from zero, then added to the float32
  // total, as the Hopper scaled GEMM does without fast accumulation); false keeps
  // float32-grade sums.
  bool fast_accum = false;
};

// Whether the kernel takes these arguments on the current device: its shapes (1 <= m <= 64,
// k a multiple of 16, of 128 for kBlock), 16-byte aligned operands with K contiguous, and
// kernels compiled for compute capability 8.9 or later (the float8 conversions). When not,
// *why (when given) says what failed.
bool fp8_decode_supported(const Fp8DecodeArgs& args, const char** why = nullptr);

// Runs the product on `stream`; cudaErrorNotSupported where fp8_decode_supported fails.
cudaError_t fp8_decode_run(const Fp8DecodeArgs& args, cudaStream_t stream);

// The Hopper variant (kernels/fp8/scaled_decode_fp8_sm90.cu): W streamed by TMA, W and the
// tokens widened to fp16 (exact) and multiplied by fp16 wgmma with float32 sums, as the
// mma.sync kernel's; with fast_accum, float8 wgmma on the stage as it landed. It takes kRowCol
// scales only, on compute capability 9.0 (cc_major) in a build with the sm_90a kernels,
// 1 <= m <= 32 (16 with fast_accum), k a multiple of 16, 16-byte aligned operands whose rows
// do not overlap (lda >= k, ldw >= k). When not, *why (when given) says what failed.
bool fp8_decode_wgmma_supported(const Fp8DecodeArgs& args, const char** why = nullptr);

// Runs the Hopper variant on `stream`; cudaErrorNotSupported where
// fp8_decode_wgmma_supported fails.
cudaError_t fp8_decode_wgmma_run(const Fp8DecodeArgs& args, cudaStream_t stream);

}  // namespace gemmt
