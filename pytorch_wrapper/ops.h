// Every op's backend kernels, as registered in registration.cpp.
// Naming: <op>_cpu, <op>_cuda, <op>_meta. Each wrapper file owns one op family.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <tuple>

namespace gemmt::wrapper {

// ---- GEMM family (gemm_ops.cpp) ----
void gemm_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
              double beta, std::string_view variant);
void gemm_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
               double beta, std::string_view variant);
void gemm_meta(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
               double beta, std::string_view variant);
at::Tensor mm_cpu(const at::Tensor& a, const at::Tensor& b);
at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b);
at::Tensor mm_meta(const at::Tensor& a, const at::Tensor& b);

// ---- Linear (linear_ops.cpp): act(x @ weight.T + bias) and its backward's pieces ----
at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, std::string_view activation);
at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, std::string_view activation);
at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, std::string_view activation);
std::tuple<at::Tensor, at::Tensor> linear_with_preact_cpu(const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          std::string_view activation);
std::tuple<at::Tensor, at::Tensor> linear_with_preact_cuda(const at::Tensor& x,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           std::string_view activation);
std::tuple<at::Tensor, at::Tensor> linear_with_preact_meta(const at::Tensor& x,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           std::string_view activation);
std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cpu(const at::Tensor& grad,
                                                                  const at::Tensor& preact,
                                                                  std::string_view activation,
                                                                  bool bias_grad);
std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cuda(const at::Tensor& grad,
                                                                   const at::Tensor& preact,
                                                                   std::string_view activation,
                                                                   bool bias_grad);
std::tuple<at::Tensor, at::Tensor> linear_activation_backward_meta(const at::Tensor& grad,
                                                                   const at::Tensor& preact,
                                                                   std::string_view activation,
                                                                   bool bias_grad);
at::Tensor linear_bias_backward_cpu(const at::Tensor& grad);
at::Tensor linear_bias_backward_cuda(const at::Tensor& grad);
at::Tensor linear_bias_backward_meta(const at::Tensor& grad);

// ---- Elementwise family (elementwise_ops.cpp) ----
at::Tensor add_cpu(const at::Tensor& a, const at::Tensor& b);
at::Tensor add_cuda(const at::Tensor& a, const at::Tensor& b);
at::Tensor add_meta(const at::Tensor& a, const at::Tensor& b);
at::Tensor square_cpu(const at::Tensor& x);
at::Tensor square_cuda(const at::Tensor& x);
at::Tensor square_meta(const at::Tensor& x);
at::Tensor square_backward_cpu(const at::Tensor& grad, const at::Tensor& x);
at::Tensor square_backward_cuda(const at::Tensor& grad, const at::Tensor& x);
at::Tensor square_backward_meta(const at::Tensor& grad, const at::Tensor& x);
at::Tensor scale_cpu(const at::Tensor& x, double factor);
at::Tensor scale_cuda(const at::Tensor& x, double factor);
at::Tensor scale_meta(const at::Tensor& x, double factor);

// ---- swiglu (swiglu_ops.cpp): silu(gate) * up and its backward (d_gate, d_up) ----
at::Tensor swiglu_cpu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor swiglu_cuda(const at::Tensor& gate, const at::Tensor& up);
at::Tensor swiglu_meta(const at::Tensor& gate, const at::Tensor& up);
std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu(const at::Tensor& grad,
                                                       const at::Tensor& gate,
                                                       const at::Tensor& up);
std::tuple<at::Tensor, at::Tensor> swiglu_backward_cuda(const at::Tensor& grad,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up);
std::tuple<at::Tensor, at::Tensor> swiglu_backward_meta(const at::Tensor& grad,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up);
// The backward written into d_gate and d_up, which may be row views of one wider tensor (the
// gradient of a fused gate/up product); the inputs may be row views too (CUDA only).
void swiglu_backward_cuda_into(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                               at::Tensor& d_gate, at::Tensor& d_up);

// ---- Image family (image_ops.cpp) ----
at::Tensor rgb_to_gray_cpu(const at::Tensor& img, bool bgr);
at::Tensor rgb_to_gray_cuda(const at::Tensor& img, bool bgr);
at::Tensor rgb_to_gray_meta(const at::Tensor& img, bool bgr);
at::Tensor normalize_volume_cpu(const at::Tensor& vol, double max_val);
at::Tensor normalize_volume_cuda(const at::Tensor& vol, double max_val);
at::Tensor normalize_volume_meta(const at::Tensor& vol, double max_val);

// ---- Reference CPU loops ----
// gemmt's plain multi-threaded loops, one per CPU kernel above. The registered CPU kernels
// run ATen's vectorised kernels instead; these stay as the reference the tests compare them
// with (module.cpp binds them as _gemmt.reference). Same checks and results as the ops,
// CPU tensors only; linear_cpu_reference returns (out, preact).
void gemm_cpu_reference(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                        double beta);
at::Tensor mm_cpu_reference(const at::Tensor& a, const at::Tensor& b);
std::tuple<at::Tensor, at::Tensor> linear_cpu_reference(const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias,
                                                        std::string_view activation);
std::tuple<at::Tensor, at::Tensor> linear_activation_backward_cpu_reference(
    const at::Tensor& grad, const at::Tensor& preact, std::string_view activation, bool bias_grad);
at::Tensor linear_bias_backward_cpu_reference(const at::Tensor& grad);
at::Tensor add_cpu_reference(const at::Tensor& a, const at::Tensor& b);
at::Tensor square_cpu_reference(const at::Tensor& x);
at::Tensor square_backward_cpu_reference(const at::Tensor& grad, const at::Tensor& x);
at::Tensor scale_cpu_reference(const at::Tensor& x, double factor);
at::Tensor swiglu_cpu_reference(const at::Tensor& gate, const at::Tensor& up);
std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu_reference(const at::Tensor& grad,
                                                                 const at::Tensor& gate,
                                                                 const at::Tensor& up);
at::Tensor rgb_to_gray_cpu_reference(const at::Tensor& img, bool bgr);
at::Tensor normalize_volume_cpu_reference(const at::Tensor& vol, double max_val);

// ---- Library information (build_info.cpp) ----
std::string build_info_json();

// ---- FP8 (fp8_ops.cpp): scaled_mm and quantize_fp8. CPU: the reference; CUDA: the
// quantisation kernels, scaled_mm's decode kernel (m <= 64) and Hopper kernel; Autograd:
// refuses inputs that require grad. ----
at::Tensor scaled_mm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                         const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, std::string_view activation,
                         bool use_fast_accum);
at::Tensor scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype, std::string_view activation,
                          bool use_fast_accum);
at::Tensor scaled_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype, std::string_view activation,
                          bool use_fast_accum);
at::Tensor scaled_mm_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                              at::ScalarType out_dtype, std::string_view activation,
                              bool use_fast_accum);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_cpu(const at::Tensor& x,
                                                    std::string_view granularity,
                                                    at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_cuda(const at::Tensor& x,
                                                     std::string_view granularity,
                                                     at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_meta(const at::Tensor& x,
                                                     std::string_view granularity,
                                                     at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_autograd(const at::Tensor& x,
                                                         std::string_view granularity,
                                                         at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_cpu(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_cuda(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_meta(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_with_transpose_autograd(
    const at::Tensor& x, std::string_view granularity, at::ScalarType dtype);

// ---- Mixture of experts (moe_ops.cpp): grouped_mm, scaled_grouped_mm, routing, the expert layer
// ---- The *_cuda functions: the routing kernels (kernels/moe/) and the Hopper grouped GEMM. The
// *_autograd functions are the ops' Autograd kernels.
at::Tensor grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b,
                          const std::optional<at::Tensor>& offs,
                          const std::optional<at::Tensor>& bias,
                          std::optional<at::ScalarType> out_dtype, std::string_view activation);
at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b,
                           const std::optional<at::Tensor>& offs,
                           const std::optional<at::Tensor>& bias,
                           std::optional<at::ScalarType> out_dtype, std::string_view activation);
at::Tensor grouped_mm_meta(const at::Tensor& a, const at::Tensor& b,
                           const std::optional<at::Tensor>& offs,
                           const std::optional<at::Tensor>& bias,
                           std::optional<at::ScalarType> out_dtype, std::string_view activation);
at::Tensor grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b,
                               const std::optional<at::Tensor>& offs,
                               const std::optional<at::Tensor>& bias,
                               std::optional<at::ScalarType> out_dtype,
                               std::string_view activation);
at::Tensor scaled_grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& scale_a, const at::Tensor& scale_b,
                                 const std::optional<at::Tensor>& offs,
                                 const std::optional<at::Tensor>& bias,
                                 std::optional<at::ScalarType> out_dtype,
                                 std::string_view activation, bool use_fast_accum);
at::Tensor scaled_grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& scale_a, const at::Tensor& scale_b,
                                  const std::optional<at::Tensor>& offs,
                                  const std::optional<at::Tensor>& bias,
                                  std::optional<at::ScalarType> out_dtype,
                                  std::string_view activation, bool use_fast_accum);
at::Tensor scaled_grouped_mm_meta(const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& scale_a, const at::Tensor& scale_b,
                                  const std::optional<at::Tensor>& offs,
                                  const std::optional<at::Tensor>& bias,
                                  std::optional<at::ScalarType> out_dtype,
                                  std::string_view activation, bool use_fast_accum);
at::Tensor scaled_grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& scale_a, const at::Tensor& scale_b,
                                      const std::optional<at::Tensor>& offs,
                                      const std::optional<at::Tensor>& bias,
                                      std::optional<at::ScalarType> out_dtype,
                                      std::string_view activation, bool use_fast_accum);
std::tuple<at::Tensor, at::Tensor> moe_permute_cpu(const at::Tensor& expert_ids,
                                                   int64_t num_experts);
std::tuple<at::Tensor, at::Tensor> moe_permute_cuda(const at::Tensor& expert_ids,
                                                    int64_t num_experts);
std::tuple<at::Tensor, at::Tensor> moe_permute_meta(const at::Tensor& expert_ids,
                                                    int64_t num_experts);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_cpu(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const std::optional<at::Tensor>& correction_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_cuda(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const std::optional<at::Tensor>& correction_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_meta(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const std::optional<at::Tensor>& correction_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route_autograd(
    const at::Tensor& logits, int64_t top_k, std::string_view score, bool renormalize,
    int64_t n_group, int64_t topk_group, const std::optional<at::Tensor>& correction_bias);
at::Tensor moe_experts_cpu(const at::Tensor& x, const at::Tensor& w_gate_up,
                           const at::Tensor& w_down, const at::Tensor& weights,
                           const at::Tensor& expert_ids, const at::Tensor& token_order,
                           const at::Tensor& offsets);
at::Tensor moe_experts_cuda(const at::Tensor& x, const at::Tensor& w_gate_up,
                            const at::Tensor& w_down, const at::Tensor& weights,
                            const at::Tensor& expert_ids, const at::Tensor& token_order,
                            const at::Tensor& offsets);
at::Tensor moe_experts_meta(const at::Tensor& x, const at::Tensor& w_gate_up,
                            const at::Tensor& w_down, const at::Tensor& weights,
                            const at::Tensor& expert_ids, const at::Tensor& token_order,
                            const at::Tensor& offsets);
at::Tensor moe_experts_autograd(const at::Tensor& x, const at::Tensor& w_gate_up,
                                const at::Tensor& w_down, const at::Tensor& weights,
                                const at::Tensor& expert_ids, const at::Tensor& token_order,
                                const at::Tensor& offsets);
// moe_experts_float8, one declaration a dispatch key (cpu, cuda, meta, autograd).
#define GEMMT_DECLARE_MOE_EXPERTS_FLOAT8(suffix)                                           \
  at::Tensor moe_experts_float8_##suffix(                                                  \
      const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_gate_up_scale, \
      const at::Tensor& w_down, const at::Tensor& w_down_scale, const at::Tensor& weights, \
      const at::Tensor& expert_ids, const at::Tensor& token_order, const at::Tensor& offsets);
GEMMT_DECLARE_MOE_EXPERTS_FLOAT8(cpu)
GEMMT_DECLARE_MOE_EXPERTS_FLOAT8(cuda)
GEMMT_DECLARE_MOE_EXPERTS_FLOAT8(meta)
GEMMT_DECLARE_MOE_EXPERTS_FLOAT8(autograd)
#undef GEMMT_DECLARE_MOE_EXPERTS_FLOAT8

}  // namespace gemmt::wrapper
