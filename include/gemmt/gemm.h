// The GEMM family's launch interface: C = alpha * A @ B + beta * C.
//
// Contract between pytorch_wrapper/ (validation, layout canonicalisation) and kernels/:
//   * A is m x k with element (i, p) at a[i * a_stride_m + p * a_stride_k] (any strides,
//     so transposed views arrive without a copy);
//   * B is k x n with element (p, j) at b[p * b_stride_k + j * b_stride_n];
//   * C is m x n, row-major with unit stride along n: c[i * ldc + j], ldc >= n.
//     The wrapper guarantees this (it solves C^T = B^T A^T for a column-major C).
//   * A, B and C share one dtype; accumulation is float32 for every dtype but float64,
//     which accumulates in double (and only the float64 family, below, takes it).
//   * m, n >= 1 when a kernel is launched; k may be 0 (then C = beta * C).
//   * Pointers do not alias C (the wrapper refuses overlap).
#pragma once

#include <cuda_runtime.h>

#include "gemmt/gemm_args.h"
#include "gemmt/gemm_variant.h"

namespace gemmt {

// What kAuto resolves to for these arguments (never kAuto).
GemmVariant gemm_pick(const GemmArgs& args);

// True when `v` can run these arguments on this device (dtype, layout, alignment, arch).
bool gemm_supports(const GemmArgs& args, GemmVariant v);

// Scratch bytes the variant needs for these arguments (0 for most). The caller passes a
// device buffer of at least this size, 256-byte aligned, to gemm_run.
std::size_t gemm_workspace_bytes(const GemmArgs& args, GemmVariant v);

// Enqueues the product on `stream`. Returns cudaErrorNotSupported when the variant
// cannot run these arguments, otherwise the launch status. Launches nothing when
// m == 0 or n == 0.
cudaError_t gemm_run(const GemmArgs& args, GemmVariant v, void* workspace, cudaStream_t stream);

// ---- Per-family entry points, used by gemm_dispatch.cu ---------------------------------
// SIMT family (kernels/simt/, planned by kernels/plan/simt_plan.cpp): kNaive .. kGemv,
// float32 / float16 / bfloat16, any strides.
bool gemm_simt_supports(const GemmArgs& args, GemmVariant v);
// The one split-k policy (simt_wants_split_k in kernels/plan/simt_plan.h).
bool gemm_simt_wants_split_k(const GemmArgs& args);
// float32 products of 2-4 rows that `auto` runs on gemv (gemv_picks_few_rows, same header).
bool gemm_simt_gemv_picks_few_rows(const GemmArgs& args);
std::size_t gemm_simt_workspace_bytes(const GemmArgs& args, GemmVariant v);
cudaError_t gemm_simt_run(const GemmArgs& args, GemmVariant v, void* workspace,
                          cudaStream_t stream);
// Scales C by beta (the k == 0 case, and the epilogue-free paths).
cudaError_t gemm_scale_c(const GemmArgs& args, cudaStream_t stream);
// C = alpha * (sum of the float32 k-slices) + beta * C, the slices added in order (so the
// result is deterministic). Slice s holds element (i, j) at slices[(s * m + i) * n + j].
// Shared by every split-k path.
cudaError_t gemm_reduce_k_slices(const GemmArgs& args, const float* slices, int splits,
                                 cudaStream_t stream);

// mma.sync family (kernels/gemm_sm80_mma.cu): bf16, fp16, tf32 (float32 with allow_tf32).
bool gemm_sm80_supports(const GemmArgs& args);
cudaError_t gemm_sm80_run(const GemmArgs& args, cudaStream_t stream);

// float64 family (kernels/fp64/gemm_fp64.cu): double accumulation, any strides, applies the
// epilogue, k == 0 included; no workspace. dmma: the FP64 tensor cores (sm_80+); simt: double
// FMAs (any GPU).
bool gemm_fp64_dmma_supports(const GemmArgs& args);
bool gemm_fp64_simt_supports(const GemmArgs& args);
cudaError_t gemm_fp64_run(const GemmArgs& args, bool tensor_cores, cudaStream_t stream);

// Decode family (kernels/gemm_decode.cu; gemm_decode_supports in gemm_dispatch.cu): bf16 /
// fp16, m <= 64, A and B K-major with 16-byte aligned rows, k % 8 == 0; applies the epilogue.
// No workspace. Reached only when named (variant "decode", or a tuner's candidate).
bool gemm_decode_supports(const GemmArgs& args);
cudaError_t gemm_decode_run(const GemmArgs& args, cudaStream_t stream);

// Hopper family (kernels/sm90/, planned by kernels/plan/sm90_plan.cpp): compiled to real code only
// for sm_90a. Operands TMA cannot read in place (tf32 not K-major, unaligned base or row stride)
// are copied K-major into the workspace first, and outputs with too few tiles for the GPU split k
// with float32 partials in the workspace; gemm_sm90_workspace_bytes says how much.
bool gemm_sm90_supports(const GemmArgs& args);
std::size_t gemm_sm90_workspace_bytes(const GemmArgs& args);
cudaError_t gemm_sm90_run(const GemmArgs& args, void* workspace, cudaStream_t stream);
// One-token products (m == 1) whose weight the Hopper GEMM streams faster than gemv does
// (kernels/plan/sm90_plan.h, streams_single_row); gemm_pick asks.
bool gemm_sm90_streams_single_row(const GemmArgs& args);

}  // namespace gemmt
