// Launch interface of the mixture-of-experts routing kernels (kernels/moe/): the top-k
// router, the stable counting sort of the routed (token, slot) pairs by expert, the gather of
// token rows into expert order, the weighted combine back to token order and its backward.
//
// Nothing here synchronises with the host or reads device data on the host: every size comes
// from the arguments, so the launches can be captured in a CUDA graph. Scratch memory is the
// caller's (sized by the *_workspace_bytes functions). All launchers return the launch
// status; indexing is 64-bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/types.h"

namespace gemmt {

// The router keeps a token's E scores (and its group scores) in shared memory, one warp per
// token: at most 64 KiB for 4096 experts in float64 with as many groups, within the opt-in
// limit of every device from sm_80 on (99 KiB on sm_86 and sm_89).
constexpr std::int64_t kMoeRouteMaxExperts = 4096;

// What moe_route computes for each token (kernels/moe/moe_route.cu).
struct MoeRouteArgs {
  std::int64_t tokens = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  bool softmax = true;          // scores softmax(logits) (else sigmoid(logits))
  bool renormalize = true;      // weights divided by their sum (floored at FLT_MIN)
  std::int64_t n_group = 0;     // 0: no group-limited routing
  std::int64_t topk_group = 0;  // groups kept when n_group > 0
};

// logits (tokens, experts) of `logits_dtype` with element strides (row_stride, col_stride);
// scores in float32, or float64 when logits_dtype is kFloat64 (the "score type").
// correction_bias: nullptr or `experts` contiguous values of the score type, added to the
// scores for the choice only. Writes weights (tokens, top_k) of the score type and
// expert_ids (tokens, top_k) int64, both contiguous, best expert first; equal scores go to
// the lowest expert id and NaN ranks above every number, as a stable descending sort does.
cudaError_t moe_route_run(ScalarType logits_dtype, const void* logits, std::int64_t row_stride,
                          std::int64_t col_stride, const void* correction_bias,
                          const MoeRouteArgs& args, void* weights, std::int64_t* expert_ids,
                          cudaStream_t stream);

// Scratch bytes moe_permute_run needs for `slots` routed slots and `num_experts` experts.
std::size_t moe_permute_workspace_bytes(std::int64_t slots, std::int64_t num_experts);

// expert_ids: `slots` contiguous int32 (ids_int64 = false) or int64 values. Writes order
// (slots int64: the slot indices stably sorted by expert id, so one expert's slots keep
// their order) and offsets (num_experts int32: cumulative slot counts per expert).
// slots <= INT32_MAX. Ids outside [0, num_experts) are not refused here (that would need the
// host): their slots go after every expert's, past offsets[num_experts - 1].
cudaError_t moe_permute_run(const void* expert_ids, bool ids_int64, std::int64_t slots,
                            std::int64_t num_experts, void* workspace, std::int64_t* order,
                            std::int32_t* offsets, cudaStream_t stream);

// xs[p, :] = x[order[p] / top_k, :] for the `slots` rows of xs (contiguous, `cols` wide, of
// the element size of `dtype`); x is (tokens, cols) with element strides (row_stride,
// col_stride). Also writes inverse[order[p]] = p (slots int64), the position of each slot in
// expert order. An order entry outside [0, slots) gives a zero row and no inverse entry (the
// inverse starts at -1).
cudaError_t moe_gather_run(ScalarType dtype, const void* x, std::int64_t tokens, std::int64_t cols,
                           std::int64_t row_stride, std::int64_t col_stride,
                           const std::int64_t* order, std::int64_t slots, std::int64_t top_k,
                           void* xs, std::int64_t* inverse, cudaStream_t stream);

// out[t, :] = sum over k of weights[t, k] * y[inverse[t * top_k + k], :], accumulated in
// float32 (float64 for kFloat64) in k order and rounded once to `dtype`. y has `dtype`
// elements and row stride y_row_stride (columns contiguous); weights (tokens, top_k) are
// contiguous float32 (float64 for kFloat64), or nullptr for unit weights (a plain sum: the
// gather's backward); out (tokens, cols) contiguous. A slot whose inverse entry is outside
// [0, y_rows) adds nothing.
cudaError_t moe_combine_run(ScalarType dtype, const void* y, std::int64_t y_rows,
                            std::int64_t y_row_stride, std::int64_t cols, const void* weights,
                            const std::int64_t* inverse, std::int64_t tokens, std::int64_t top_k,
                            void* out, cudaStream_t stream);

// The backward of moe_combine_run over the expert layer's y of tokens * top_k rows. For each
// token t and k < top_k, with s = t * top_k + k and p = inverse[s] (skipped unless
// 0 <= p < tokens * top_k):
//   grad_y[p, :] = weights[s] * grad_out[t, :], computed in float32 (float64 for kFloat64)
//                  and rounded once to `dtype`;
//   grad_weights[s] = sum over c of grad_out[t, c] * y[p, c] in float32 (float64), in a fixed
//                  order (deterministic, no atomics); 0 for a skipped slot.
// grad_out and y have `dtype` elements, contiguous columns and the given row strides;
// weights and grad_weights are (tokens, top_k) contiguous in the accumulation type; grad_y is
// (tokens * top_k, cols) contiguous. order is the gather's (slots int64): rows of grad_y that
// no slot maps to (inverse[order[r]] != r, routing that is not a permutation) are zeroed, so
// every row is written. grad_y nullptr: not computed (weights and order may then be null);
// grad_weights nullptr: not computed (y is then not read and may be null).
cudaError_t moe_combine_backward_run(ScalarType dtype, const void* grad_out,
                                     std::int64_t grad_out_row_stride, const void* y,
                                     std::int64_t y_row_stride, std::int64_t cols,
                                     const void* weights, const std::int64_t* inverse,
                                     const std::int64_t* order, std::int64_t tokens,
                                     std::int64_t top_k, void* grad_y, void* grad_weights,
                                     cudaStream_t stream);

}  // namespace gemmt
