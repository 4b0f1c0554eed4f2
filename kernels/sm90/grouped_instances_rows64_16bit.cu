// The grouped GEMM's 16-bit instances on 64-row tiles (grouped_launch.cuh), lone or in clusters
// of two or four: one dense product of few rows (a batched decode) runs on them, so they are
// part of every build that has the Hopper kernels.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_rows64_16bit(int kind, const GroupedLaunch& l, cudaStream_t stream) {
  if (l.promote != 0 || l.block || l.per_sm != 1) return cudaErrorInvalidValue;
  switch (kind) {
    case kBF16:
      return launch_grouped_rows64<kBF16, 0>(l, stream);
    case kF16:
      return launch_grouped_rows64<kF16, 0>(l, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sm90
}  // namespace gemmt
