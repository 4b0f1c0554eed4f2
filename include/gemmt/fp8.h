// Launch interface of the FP8 quantisation kernels (kernels/fp8/quantize_fp8.cu).
//
// Semantics, bit for bit those of the CPU reference (pytorch_wrapper/fp8_ops.cpp):
//   xf    = float(x)                       (round to nearest for float64)
//   amax  = max |xf| over the group's finite elements (0 when there are none)
//   mult  = float(fp8_max / max(double(amax), 1e-12))   (the division in double)
//   q     = fp8_rne(clamp(xf * mult, -fp8_max, fp8_max)) (the product in float; NaN stays
//           NaN with its sign: byte 0x7f | sign, as c10's conversion gives)
//   scale = 1.0f / mult                    (the dequantisation scale, correctly rounded)
// fp8_max is 448 (e4m3fn) or 57344 (e5m2).
//
// x is (rows, cols) with a unit column stride and a row stride `ld` >= cols (elements). q is
// contiguous (rows, cols); qt, for the transposed operand, contiguous (cols, rows). The
// scales are written in the layouts quantize_fp8 returns (KB = ceil(cols / 128),
// RB = ceil(rows / 128)):
//   tensor         scale[0];                  scale_t[0] (the same value)
//   row            scale[r], rows entries;     scale_t[c], cols entries
//   block (1x128)  scale[r + kb * rows];       scale_t[c + rb * cols] (column-major)
//   block_128x128  scale[rb * KB + kb];        scale_t[kb * RB + rb] (the transpose)
// Indexing is 64-bit throughout. Nothing synchronises with the host; every launch is on
// `stream` and checked. An empty x (rows or cols 0) still gets its scales (tensor: one;
// row: one per row of x and, with the transpose, one per column), from amax 0.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemmt/types.h"

namespace gemmt {

enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

enum class Fp8Granularity : int { kTensor = 0, kRow = 1, kBlock = 2, kBlock128x128 = 3 };

struct Fp8QuantizeArgs {
  ScalarType x_dtype = ScalarType::kFloat32;  // float32, float16, bfloat16 or float64
  const void* x = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // row stride of x in elements, >= cols (any value when rows <= 1)
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Granularity granularity = Fp8Granularity::kTensor;
  uint8_t* q = nullptr;
  float* scale = nullptr;
  uint8_t* qt = nullptr;      // nullptr: no transposed output
  float* scale_t = nullptr;   // with qt
  void* workspace = nullptr;  // quantize_fp8_workspace_bytes() bytes, any contents
  size_t workspace_bytes = 0;
};

// Scratch the launch needs (16-byte aligned; zeroed by the launch itself on the stream):
// the tensor amax, or the row and column amaxes of the transposed rowwise operand.
size_t quantize_fp8_workspace_bytes(Fp8Granularity granularity, int64_t rows, int64_t cols,
                                    bool with_transpose);

// Runs the quantisation. cudaErrorInvalidValue for arguments outside the contract above.
cudaError_t quantize_fp8_run(const Fp8QuantizeArgs& args, cudaStream_t stream);

}  // namespace gemmt
