// Launch interface of the Linear layer's backward epilogue (kernels/linear_backward.cu).
// The products themselves go through gemm_run with a GemmEpilogue (gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/activation.h"
#include "gemmt/types.h"

namespace gemmt {

// For a rows x cols gradient `grad` of act(z) and the pre-activation `preact` (z; for ReLU
// the layer's output serves as well, it is positive exactly where z is), in one pass:
//   grad_preact = grad * act'(z), rounded to the dtype   (skipped when grad_preact == nullptr;
//                                                          activation kNone reads no preact)
//   bias_grad[j] = sum over rows of grad_preact[:, j]     (skipped when bias_grad == nullptr)
// The column sums are float32 (double for float64), in a fixed order (deterministic), over
// the rounded grad_preact values that the weight and input gradients also use. All tensors
// contiguous, one dtype (float32, float16, bfloat16, float64). `workspace` holds
// linear_backward_workspace_bytes(...) bytes (partial sums), 16-byte aligned.
std::size_t linear_backward_workspace_bytes(ScalarType dtype, int64_t rows, int64_t cols,
                                            int sm_count);
cudaError_t linear_backward_run(ScalarType dtype, int64_t rows, int64_t cols, const void* grad,
                                const void* preact, Activation activation, void* grad_preact,
                                void* bias_grad, void* workspace, int sm_count,
                                cudaStream_t stream);

}  // namespace gemmt
