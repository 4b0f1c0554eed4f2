// The grouped GEMM's f16, 256-wide instances (grouped_launch.cuh), in a translation unit of their
// own.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_f16_256(const GroupedLaunch& l, cudaStream_t stream) {
  return launch_grouped_16bit<kF16, 256>(l, stream);
}

}  // namespace sm90
}  // namespace gemmt
