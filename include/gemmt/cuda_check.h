// Error handling shared by every launcher in kernels/.
// Launchers return cudaError_t instead of throwing so that kernels/ stays free of
// torch; the wrapper turns a non-success code into a TORCH_CHECK with the op's name.
#pragma once

#include <cuda_runtime.h>

// Return early from a launcher when a CUDA runtime call fails.
#define GEMMT_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    cudaError_t gemmt_err_ = (expr);                  \
    if (gemmt_err_ != cudaSuccess) return gemmt_err_; \
  } while (0)

// After a <<<...>>> launch: configuration errors surface here, not at the next sync.
#define GEMMT_RETURN_LAUNCH_ERROR() return cudaGetLastError()
