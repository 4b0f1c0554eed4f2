// The grouped GEMM's float8 instances (grouped_launch.cuh): e4m3 x e4m3, and the two mixed
// pairs a backward with e5m2 gradients multiplies.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_fp8(int kind, const GroupedLaunch& l, cudaStream_t stream) {
  switch (kind) {
    case kE4M3:
      return launch_grouped_fp8_kind<kE4M3>(l, stream);
    case kE5M2E4M3:
      return launch_grouped_fp8_kind<kE5M2E4M3>(l, stream);
    case kE4M3E5M2:
      return launch_grouped_fp8_kind<kE4M3E5M2>(l, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sm90
}  // namespace gemmt
