// The grouped GEMM's float8 e4m3 x e4m3 instances (grouped_launch.cuh), in a translation unit of
// their own.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_e4m3(const GroupedLaunch& l, cudaStream_t stream) {
  return launch_grouped_fp8_kind<kE4M3>(l, stream);
}

}  // namespace sm90
}  // namespace gemmt
