// The functions through which the rest of the library reaches each group of kernels that a
// build may compile on first use (include/gemmt/deferred.h): one list a group, each entry
//   X(group, return type, value when the group cannot be loaded, function, exported name,
//     (parameters), (arguments))
// GEMMT_DEFERRED_SELECTED(X) expands the lists of the groups deferred in this build
// (GEMMT_DEFER_<GROUP> defined): deferred_trampolines.cu defines each such function in the
// module, forwarding to the group's library; deferred_exports.cu defines the exported names in
// that library.
// A function a group adds for the rest of the library belongs here, or the module will not link.
#pragma once

#include <cuda_runtime.h>

#include "gemmt/fp8.h"
#include "gemmt/fp8_decode.h"
#include "gemmt/gemm.h"
#include "simt/launchers.h"
#include "sm90/grouped_launchers.h"
#include "sm90/launchers.h"

namespace gemmt {
namespace deferred {

// What a forwarding definition returns when its group cannot be loaded (failure() says why).
constexpr cudaError_t kUnavailable = cudaErrorSharedObjectInitFailed;
inline simt::PipeKernel unavailable_pipe_kernel() {
  simt::PipeKernel k;
  k.error = kUnavailable;
  return k;
}

}  // namespace deferred
}  // namespace gemmt

// An entry of namespace ns returning a launch status (kUnavailable when the group cannot be
// loaded), exported under its own name.
#define GEMMT_DEFERRED_STATUS(X, group, ns, name, params, args) \
  X(group, cudaError_t, gemmt::deferred::kUnavailable, ns::name, name, params, args)
// One kind's (or operand pair's) instances of the grouped GEMM (sm90/grouped_launchers.h).
#define GEMMT_DEFERRED_GROUPED(X, group, name)       \
  GEMMT_DEFERRED_STATUS(X, group, gemmt::sm90, name, \
                        (const gemmt::sm90::GroupedLaunch& l, cudaStream_t s), (l, s))

// FP8: quantisation, the decode kernels, the scaled grouped GEMM's instances.
#define GEMMT_DEFERRED_FP8(X)                                                                   \
  X(fp8, size_t, 0, gemmt::quantize_fp8_workspace_bytes, quantize_fp8_workspace_bytes,          \
    (gemmt::Fp8Granularity g, int64_t rows, int64_t cols, bool t), (g, rows, cols, t))          \
  GEMMT_DEFERRED_STATUS(X, fp8, gemmt, quantize_fp8_run,                                        \
                        (const gemmt::Fp8QuantizeArgs& a, cudaStream_t s), (a, s))              \
  X(fp8, bool, gemmt::deferred::refuse(why), gemmt::fp8_decode_supported, fp8_decode_supported, \
    (const gemmt::Fp8DecodeArgs& a, const char** why), (a, why))                                \
  GEMMT_DEFERRED_STATUS(X, fp8, gemmt, fp8_decode_run,                                          \
                        (const gemmt::Fp8DecodeArgs& a, cudaStream_t s), (a, s))                \
  X(fp8, bool, gemmt::deferred::refuse(why), gemmt::fp8_decode_wgmma_supported,                 \
    fp8_decode_wgmma_supported, (const gemmt::Fp8DecodeArgs& a, const char** why), (a, why))    \
  GEMMT_DEFERRED_STATUS(X, fp8, gemmt, fp8_decode_wgmma_run,                                    \
                        (const gemmt::Fp8DecodeArgs& a, cudaStream_t s), (a, s))                \
  GEMMT_DEFERRED_GROUPED(X, fp8, grouped_launch_e4m3)                                           \
  GEMMT_DEFERRED_GROUPED(X, fp8, grouped_launch_e5m2_e4m3)                                      \
  GEMMT_DEFERRED_GROUPED(X, fp8, grouped_launch_e4m3_e5m2)

// The 16-bit grouped GEMM's instances (the mixture-of-experts layers).
#define GEMMT_DEFERRED_GROUPED16(X)                             \
  GEMMT_DEFERRED_GROUPED(X, grouped16, grouped_launch_bf16_128) \
  GEMMT_DEFERRED_GROUPED(X, grouped16, grouped_launch_bf16_256) \
  GEMMT_DEFERRED_GROUPED(X, grouped16, grouped_launch_f16_128)  \
  GEMMT_DEFERRED_GROUPED(X, grouped16, grouped_launch_f16_256)

// The Hopper GEMM's TF32 instances.
#define GEMMT_DEFERRED_TF32(X)                                                       \
  GEMMT_DEFERRED_STATUS(                                                             \
      X, tf32, gemmt::sm90, launch_tf32,                                             \
      (const gemmt::sm90::Problem& pr, const gemmt::sm90::Plan& plan,                \
       const gemmt::sm90::Maps& maps, const gemmt::sm90::Launch& l, cudaStream_t s), \
      (pr, plan, maps, l, s))

// The float64 GEMM.
#define GEMMT_DEFERRED_FP64(X)                                                         \
  GEMMT_DEFERRED_STATUS(X, fp64, gemmt, gemm_fp64_run,                                 \
                        (const gemmt::GemmArgs& a, bool tensor_cores, cudaStream_t s), \
                        (a, tensor_cores, s))

// The pipelined SIMT kernel's 16-bit instances.
#define GEMMT_DEFERRED_SIMT16(X)                                                 \
  X(simt16, gemmt::simt::PipeKernel, gemmt::deferred::unavailable_pipe_kernel(), \
    gemmt::simt::pipe_kernel_16bit, pipe_kernel_16bit,                           \
    (gemmt::ScalarType t, gemmt::simt::PipeTile tile, gemmt::simt::LoadMode a,   \
     gemmt::simt::LoadMode b),                                                   \
    (t, tile, a, b))

// The pipelined SIMT kernel's float32 instances with an element-wise loader.
#define GEMMT_DEFERRED_SIMT32_SCALAR(X)                                                 \
  X(simt32_scalar, gemmt::simt::PipeKernel, gemmt::deferred::unavailable_pipe_kernel(), \
    gemmt::simt::pipe_kernel_f32_scalar, pipe_kernel_f32_scalar,                        \
    (gemmt::simt::PipeTile tile, gemmt::simt::LoadMode a, gemmt::simt::LoadMode b), (tile, a, b))

// The decode kernel (reached only when named, or by a tuner's candidates).
#define GEMMT_DEFERRED_DECODE(X)                           \
  GEMMT_DEFERRED_STATUS(X, decode, gemmt, gemm_decode_run, \
                        (const gemmt::GemmArgs& a, cudaStream_t s), (a, s))

// The SIMT ladder's first four steps (the teaching kernels, reached only when named).
#define GEMMT_DEFERRED_LADDER_STEP(X, name)                                                       \
  GEMMT_DEFERRED_STATUS(X, ladder, gemmt::simt, name, (const gemmt::GemmArgs& a, cudaStream_t s), \
                        (a, s))
#define GEMMT_DEFERRED_LADDER(X)                      \
  GEMMT_DEFERRED_LADDER_STEP(X, run_naive)            \
  GEMMT_DEFERRED_LADDER_STEP(X, run_smem_tiled)       \
  GEMMT_DEFERRED_LADDER_STEP(X, run_register_blocked) \
  GEMMT_DEFERRED_LADDER_STEP(X, run_warp_tiled)

#ifdef GEMMT_DEFER_FP8
#define GEMMT_IF_DEFERRED_FP8(X) GEMMT_DEFERRED_FP8(X)
#else
#define GEMMT_IF_DEFERRED_FP8(X)
#endif
#ifdef GEMMT_DEFER_GROUPED16
#define GEMMT_IF_DEFERRED_GROUPED16(X) GEMMT_DEFERRED_GROUPED16(X)
#else
#define GEMMT_IF_DEFERRED_GROUPED16(X)
#endif
#ifdef GEMMT_DEFER_TF32
#define GEMMT_IF_DEFERRED_TF32(X) GEMMT_DEFERRED_TF32(X)
#else
#define GEMMT_IF_DEFERRED_TF32(X)
#endif
#ifdef GEMMT_DEFER_FP64
#define GEMMT_IF_DEFERRED_FP64(X) GEMMT_DEFERRED_FP64(X)
#else
#define GEMMT_IF_DEFERRED_FP64(X)
#endif
#ifdef GEMMT_DEFER_SIMT16
#define GEMMT_IF_DEFERRED_SIMT16(X) GEMMT_DEFERRED_SIMT16(X)
#else
#define GEMMT_IF_DEFERRED_SIMT16(X)
#endif
#ifdef GEMMT_DEFER_SIMT32_SCALAR
#define GEMMT_IF_DEFERRED_SIMT32_SCALAR(X) GEMMT_DEFERRED_SIMT32_SCALAR(X)
#else
#define GEMMT_IF_DEFERRED_SIMT32_SCALAR(X)
#endif
#ifdef GEMMT_DEFER_DECODE
#define GEMMT_IF_DEFERRED_DECODE(X) GEMMT_DEFERRED_DECODE(X)
#else
#define GEMMT_IF_DEFERRED_DECODE(X)
#endif
#ifdef GEMMT_DEFER_LADDER
#define GEMMT_IF_DEFERRED_LADDER(X) GEMMT_DEFERRED_LADDER(X)
#else
#define GEMMT_IF_DEFERRED_LADDER(X)
#endif

#define GEMMT_DEFERRED_SELECTED(X)   \
  GEMMT_IF_DEFERRED_FP8(X)           \
  GEMMT_IF_DEFERRED_GROUPED16(X)     \
  GEMMT_IF_DEFERRED_TF32(X)          \
  GEMMT_IF_DEFERRED_FP64(X)          \
  GEMMT_IF_DEFERRED_SIMT16(X)        \
  GEMMT_IF_DEFERRED_SIMT32_SCALAR(X) \
  GEMMT_IF_DEFERRED_DECODE(X) GEMMT_IF_DEFERRED_LADDER(X)
