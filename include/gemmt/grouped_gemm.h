// The Hopper grouped and scaled GEMM (kernels/sm90/grouped_kernel.cuh) as the wrappers see it:
// a list of products C_g = epilogue(scale * A_g B_g) whose extents may come from int32 offsets
// that stay on the device, and whose operands may be float8 with dequantisation scales.
// It serves gemmt::grouped_mm (bf16 / fp16, every layout of torch._grouped_mm) and
// gemmt::scaled_mm and gemmt::scaled_grouped_mm (float8: one product, or groups of K-major
// operands with row / column or 1x128 / 128x128 block scales, unsplit or split along the rows). Raw
// pointers, sizes and strides only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemmt/activation.h"

namespace gemmt {

// Which extent the offsets split; each group's range is [offs[g - 1], offs[g]) (offs[-1] = 0).
enum class GroupSplit : int {
  kNone = 0,  // groups of equal shape (a batch; a dense product is one group)
  kRows = 1,  // rows of A and C (torch._grouped_mm's 2-D x 3-D)
  kCols = 2,  // columns of B and C (3-D x 2-D)
  kDepth = 3  // the contraction dimension; C has one matrix a group (2-D x 2-D)
};

// Dequantisation scales (float32). kRowCol: z = acc * sa[row] * sb[col], a tensorwise scale
// being the same with zero strides. kBlock: a's 1x128 blocks and b's 128x128 blocks, applied
// to each 128-deep partial product before it joins the float32 sum.
enum class ScaleKind : int { kNone = 0, kRowCol = 1, kBlock = 2 };

// Element kinds of the operands and of C (kernels/common/gemm_tc_kind.h for the operand pair).
enum class OutKind : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

struct GroupedGemmArgs {
  int kind = 0;  // TcKind: kBF16, kF16, kE4M3, kE5M2E4M3, kE4M3E5M2
  OutKind out = OutKind::kBF16;
  GroupSplit split = GroupSplit::kNone;
  int groups = 1;
  const int* offs = nullptr;  // device, `groups` cumulative ends (split != kNone)
  // Extents; the split one is the total (the offsets' range).
  int64_t m = 0, n = 0, k = 0;
  // A_g element (r, p) at a[g * a_sg + r * a_sm + p * a_sk]; one of a_sm, a_sk is 1. Likewise
  // B_g element (p, c) at b[g * b_sg + p * b_sk + c * b_sn], C_g (r, c) at c[g * c_sg + r * ldc +
  // c]. A 2-D operand of a split product has no g stride (its groups are ranges of it).
  const void* a = nullptr;
  int64_t a_sg = 0, a_sm = 0, a_sk = 1;
  const void* b = nullptr;
  int64_t b_sg = 0, b_sk = 0, b_sn = 1;
  void* c = nullptr;
  int64_t c_sg = 0, ldc = 0;
  // kRowCol: sa[g * sa_sg + r * sa_s0], sb[g * sb_sg + c * sb_s1] (r, c: A's row and B's column
  // in the operand, a split range's included); kBlock: sa[g * sa_sg + r * sa_s0 + kb * sa_s1]
  // (1x128), sb[g * sb_sg + kb * sb_s0 + (c / 128) * sb_s1] (128x128), or, for one group only,
  // with b_block_cols sb[kb * sb_s0 + c] (128x1: one scale a column and k-block, sb_s1 == 1).
  ScaleKind scale = ScaleKind::kNone;
  bool b_block_cols = false;
  const float* sa = nullptr;
  int64_t sa_s0 = 0, sa_s1 = 0, sa_sg = 0;
  const float* sb = nullptr;
  int64_t sb_s0 = 0, sb_s1 = 0, sb_sg = 0;
  // One bias row of n per group (bias[g * bias_sg + c]), in C's type; then the activation.
  const void* bias = nullptr;
  int64_t bias_sg = 0;
  Activation act = Activation::kNone;
  // FP8: accumulate the whole K in the tensor cores' accumulator, without the float32 promotion
  // every 128 of K (faster, less accurate for long K; torch._scaled_mm's use_fast_accum).
  bool fast_accum = false;
  int sm_count = 0;  // SMs the persistent grid may fill (0: all of the current device's)
  // Scratch for float32 partial sums (grouped_gemm_sm90_workspace_bytes; 16-byte aligned).
  // Without it, or smaller than asked, the product runs without k-slices.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Bytes of scratch the product would use: few-row FP8 products cut K into slices whose float32
// partial sums a second pass adds (grouped_plan::fp8_k_slices); 0 for the others.
std::size_t grouped_gemm_sm90_workspace_bytes(const GroupedGemmArgs& args);

// Whether the kernel takes these arguments (sm_90a build, alignment for the tensor maps, an
// operand layout it has, at most kMaxGroups split groups); when not, *why says what failed.
bool grouped_gemm_sm90_supported(const GroupedGemmArgs& args, const char** why);

// Runs the product on `stream`. Call only where grouped_gemm_sm90_supported holds and the
// device is a Hopper GPU (compute capability 9.0).
// On failure, *failed_step (when given) names the step that failed: a tensor map, the
// instance choice or the launch itself.
cudaError_t grouped_gemm_sm90(const GroupedGemmArgs& args, cudaStream_t stream,
                              const char** failed_step = nullptr);

// The most groups a split product may have: the per-group tile table lives in shared memory.
constexpr int kGroupedMaxGroups = 1024;

}  // namespace gemmt
