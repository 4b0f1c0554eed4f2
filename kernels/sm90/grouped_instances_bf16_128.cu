// The grouped GEMM's bf16, 128-wide instances (grouped_launch.cuh), in a translation unit of their
// own.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_bf16_128(const GroupedLaunch& l, cudaStream_t stream) {
  return launch_grouped_16bit<kBF16, 128>(l, stream);
}

}  // namespace sm90
}  // namespace gemmt
