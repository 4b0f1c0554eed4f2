// gemmt::scaled_mm's decode path: a few float8 tokens against a K-major float8 weight
// (b = W.t()) on an FP8 decode kernel (include/gemmt/fp8_decode.h) instead of the Hopper
// grouped / scaled GEMM, whose 128-row tiles waste most of their work on m <= 64.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "gemmt/activation.h"
#include "grouped_gemm_cuda.h"

namespace gemmt::wrapper {

#ifdef GEMMT_WITH_CUDA
// The product into a new (m, n) tensor of out_dtype when a decode kernel takes it (the Hopper
// wgmma kernel with tensorwise / rowwise scales, 1-32 tokens; with fast_accum its float8 form
// for 1-16, none for 17-64; else the mma.sync kernel up to 16 tokens, 64 with block scales:
// GEMMT_FP8_DECODE picks,
// fp8_decode_cuda.cpp; b K-major with 16-byte aligned rows; a kernel built for the device);
// nullopt otherwise, for the caller's general path. Arguments as scaled_mm's checks accepted
// them, on the current device (the caller's guard).
std::optional<at::Tensor> scaled_mm_decode_cuda(const char* op, const at::Tensor& a,
                                                const at::Tensor& b, const at::Tensor& scale_a,
                                                const at::Tensor& scale_b,
                                                const std::optional<at::Tensor>& bias,
                                                at::ScalarType out_dtype, Activation act,
                                                const Fp8Scaling& scaling, bool fast_accum);
#endif

}  // namespace gemmt::wrapper
