// Launch interface of the memory-bound ops (kernels/elementwise.cu, kernels/image.cu,
// kernels/swiglu.cu).
//
// Every output is a fresh contiguous tensor. An input is either contiguous (layout ==
// nullptr) or described by a StridedLayout; the kernels take a 16-byte vector path only
// when every pointer involved is 16-byte aligned and contiguous, and a scalar path
// otherwise (storage offset 1, strided views) and for the tail. Indexing is 64-bit.
// numel == 0 launches nothing. All launchers return the launch status.
#pragma once

#include <cuda_runtime.h>

#include "gemmt/types.h"

namespace gemmt {

// StridedLayout (types.h) describes a non-contiguous input.

// out = a + b (same dtype: float32, float16, bfloat16, computed in float32 and rounded once;
// float64, computed in double).
cudaError_t add_run(ScalarType dtype, int64_t numel, const void* a, const StridedLayout* a_layout,
                    const void* b, const StridedLayout* b_layout, void* out, cudaStream_t stream);

// out = x * x
cudaError_t square_run(ScalarType dtype, int64_t numel, const void* x,
                       const StridedLayout* x_layout, void* out, cudaStream_t stream);

// out = x * factor (factor rounded to float32 first, as PyTorch does for a float32 tensor;
// kept in double for float64)
cudaError_t scale_run(ScalarType dtype, int64_t numel, const void* x, const StridedLayout* x_layout,
                      double factor, void* out, cudaStream_t stream);

// out = 2 * x * grad: the backward of square.
cudaError_t square_backward_run(ScalarType dtype, int64_t numel, const void* grad,
                                const StridedLayout* grad_layout, const void* x,
                                const StridedLayout* x_layout, void* out, cudaStream_t stream);

// out = silu(gate) * up = gate * sigmoid(gate) * up (kernels/swiglu.cu; float dtypes and
// float64).
cudaError_t swiglu_run(ScalarType dtype, int64_t numel, const void* gate,
                       const StridedLayout* gate_layout, const void* up,
                       const StridedLayout* up_layout, void* out, cudaStream_t stream);

// swiglu's backward: d_gate = grad * up * silu'(gate), d_up = grad * silu(gate), one dtype.
// Every tensor is a row view: rows x cols elements, each row dense, rows ld_* elements apart
// (ld = cols for a contiguous tensor), so the halves of a fused gate/up product and of its
// gradient are used in place.
struct SwigluBackwardRows {
  int64_t rows = 0, cols = 0;
  const void* grad = nullptr;
  int64_t ld_grad = 0;
  const void* gate = nullptr;
  int64_t ld_gate = 0;
  const void* up = nullptr;
  int64_t ld_up = 0;
  void* d_gate = nullptr;
  int64_t ld_d_gate = 0;
  void* d_up = nullptr;
  int64_t ld_d_up = 0;
};
cudaError_t swiglu_backward_run(ScalarType dtype, const SwigluBackwardRows& rows,
                                cudaStream_t stream);

// Luma of packed 8-bit pixels: in has `pixels` * 3 bytes (channel innermost), out `pixels`
// bytes. gray = floor((299 R + 587 G + 114 B + 500) / 1000): round(0.299R+0.587G+0.114B)
// with halves rounded up, exact in integers. bgr = true reads the channels as B, G, R.
// in_layout (over the full [..., H, W, 3] shape) is nullptr when the input is contiguous.
cudaError_t rgb_to_gray_run(int64_t pixels, const uint8_t* in, const StridedLayout* in_layout,
                            bool bgr, uint8_t* out, cudaStream_t stream);

// out = float(vol) / max_val, correctly rounded (IEEE division; PyTorch on CPU agrees bit for
// bit, its CUDA kernel multiplies by 1 / max_val and can be one ulp off).
// dtype is kUInt8 or kUInt16.
cudaError_t normalize_volume_run(ScalarType dtype, int64_t numel, const void* vol,
                                 const StridedLayout* vol_layout, float max_val, float* out,
                                 cudaStream_t stream);

}  // namespace gemmt
