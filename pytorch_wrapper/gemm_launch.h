// What the GEMM-family wrappers (gemm_ops.cpp, linear_ops.cpp) share: running a checked
// product with an optional epilogue on CPU or CUDA.
#pragma once

#include <ATen/ATen.h>

#include "gemmt/activation.h"
#include "gemmt/gemm_variant.h"

namespace gemmt::wrapper {

// The wrapper-level GemmEpilogue: z = alpha * a @ b + beta * c + bias, c = act(z), and z
// written to `preact` when defined (same shape and strides as c). Undefined tensors: none.
struct EpilogueTensors {
  at::Tensor bias;  // [n], dtype of c
  Activation activation = Activation::kNone;
  at::Tensor preact;
  bool empty() const {
    return !bias.defined() && activation == Activation::kNone && !preact.defined();
  }
};

// c = alpha * a @ b + beta * c on CPU tensors whose shapes, dtypes and devices the caller
// has checked (2-D a, b, c; c does not overlap a or b), through ATen's CPU GEMM. beta == 0
// never reads c.
void gemm_cpu_run(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                  double beta);

// c = act(alpha * a @ b + beta * c + bias) with gemmt's own cache-blocked loops: the
// reference the CPU kernels are tested against (same preconditions as gemm_cpu_run).
void gemm_cpu_reference_run(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                            double alpha, double beta, const EpilogueTensors& epilogue);

#ifdef GEMMT_WITH_CUDA
// The same on CUDA with the kernel `variant` (kAuto: the planner's choice). `op` names the
// calling op in error messages. With an epilogue, c and preact must be row-major or
// column-major (every wrapper that passes one allocates them contiguous).
void gemm_cuda_run(const char* op, const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                   double alpha, double beta, GemmVariant variant, const EpilogueTensors& epilogue);
#endif

}  // namespace gemmt::wrapper
