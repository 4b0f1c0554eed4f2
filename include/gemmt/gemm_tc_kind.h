// What the tensor-core GEMM families (kernels/gemm_sm80_mma.cu, kernels/sm90/) share on the
// host: the operand kind a dtype maps to. Free of CUDA headers (the planners use it).
#pragma once

#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {

enum TcKind : int { kBF16 = 0, kF16 = 1, kTF32 = 2 };

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
