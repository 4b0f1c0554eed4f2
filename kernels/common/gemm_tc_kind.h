// What the tensor-core GEMM families (kernels/gemm_sm80_mma.cu, kernels/sm90/) share on the
// host: the operand kind a dtype maps to. Free of CUDA headers (the planners use it).
#pragma once

#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {

// The FP8 kinds name A's and B's element types (wgmma takes the two apart, K-major only);
// only the Hopper grouped/scaled GEMM (kernels/sm90/grouped_kernel.cuh) has them.
enum TcKind : int { kBF16 = 0, kF16 = 1, kTF32 = 2, kE4M3 = 3, kE5M2E4M3 = 4, kE4M3E5M2 = 5 };

constexpr bool is_fp8_kind(int kind) {
  return kind >= kE4M3;
}

// The tensor-core operand kind of the arguments' dtype; -1 when there is none (float32
// without TF32, or a dtype the tensor cores do not take).
inline int tc_kind_of(const GemmArgs& args) {
  switch (args.dtype) {
    case ScalarType::kBFloat16:
      return kBF16;
    case ScalarType::kFloat16:
      return kF16;
    case ScalarType::kFloat32:
      return args.allow_tf32 ? kTF32 : -1;
    default:
      return -1;
  }
}

}  // namespace gemmt
