// The CUDA launches of gemmt::grouped_mm and gemmt::scaled_mm on the Hopper grouped / scaled
// GEMM (include/gemmt/grouped_gemm.h): operand views, scales and outputs from tensors whose
// arguments the ops' own checks have accepted.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "gemmt/activation.h"

namespace gemmt::wrapper {

#ifdef GEMMT_WITH_CUDA
// torch._grouped_mm's layouts, named by the ranks of a and b (moe_ops.cpp: Layout).
enum class GroupedLayout { k2d3d, k3d3d, k2d2d, k3d2d };

// C = grouped product, written into `out` (contiguous, the op's output shape and dtype).
void grouped_mm_cuda_into(const char* op, const at::Tensor& a, const at::Tensor& b,
                          const std::optional<at::Tensor>& offs,
                          const std::optional<at::Tensor>& bias, GroupedLayout layout,
                          Activation act, at::Tensor& out);

// scaled_grouped_mm on the same kernel, for every layout but k2d2d (whose split of K the
// float8 tensor cores cannot read: moe_ops.cpp widens it): row scales as
// torch._scaled_grouped_mm takes them, or 1x128 / 128x128 block scales (scale_a with as many
// dimensions as a; 2-D x 3-D and 3-D x 3-D), checked by the op.
void scaled_grouped_mm_cuda_into(const char* op, const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& scale_a, const at::Tensor& scale_b,
                                 const std::optional<at::Tensor>& offs,
                                 const std::optional<at::Tensor>& bias, GroupedLayout layout,
                                 Activation act, bool fast_accum, at::Tensor& out);

// scaled_mm's scalings (fp8_ops.cpp: Scaling), with the blockwise pairing.
struct Fp8Scaling {
  int kind = 0;  // 0 tensorwise, 1 rowwise, 2 blockwise
  bool a_square_blocks = false, b_square_blocks = false;
};

at::Tensor scaled_mm_cuda_run(const char* op, const at::Tensor& a, const at::Tensor& b,
                              const at::Tensor& scale_a, const at::Tensor& scale_b,
                              const std::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                              Activation act, const Fp8Scaling& scaling, bool fast_accum);
#endif

}  // namespace gemmt::wrapper
