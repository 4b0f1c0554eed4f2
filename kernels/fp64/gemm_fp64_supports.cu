// Which float64 products the kernels of gemm_fp64.cu take, apart from them so that asking does
// not need the kernels: a build may compile those on first use (include/gemmt/deferred.h,
// group fp64).
#include "gemmt/gemm.h"
#include "plan/fp64_plan.h"

#include <cstdint>

namespace gemmt {

bool gemm_fp64_simt_supports(const GemmArgs& args) {
  if (args.dtype != ScalarType::kFloat64) return false;
  if (args.m < 1 || args.n < 1 || args.k < 0) return false;
  // With k == 0, A and B are empty tensors, whose data pointers may be null: C = beta * C.
  if (args.c == nullptr || (args.k > 0 && (args.a == nullptr || args.b == nullptr))) return false;
  if (args.ldc < args.n && args.m > 1) return false;
  // The tile counts of the smaller (64-wide) CTA bound both.
  const int64_t tiles_m = (args.m + 63) / 64;
  const int64_t tiles_n = (args.n + 63) / 64;
  // The raster works in 32-bit tile indices, grouped along either direction.
  return tiles_m * tiles_n <=
         INT32_MAX - fp64_plan::kGroupM * (tiles_m > tiles_n ? tiles_m : tiles_n);
}

bool gemm_fp64_dmma_supports(const GemmArgs& args) {
  return args.cc_major >= 8 && gemm_fp64_simt_supports(args);
}

}  // namespace gemmt
