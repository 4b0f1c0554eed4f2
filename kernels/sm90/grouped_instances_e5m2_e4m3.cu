// The grouped GEMM's float8 e5m2 x e4m3 (an e5m2 gradient times e4m3) instances
// (grouped_launch.cuh), in a translation unit of their own.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_e5m2_e4m3(const GroupedLaunch& l, cudaStream_t stream) {
  return launch_grouped_fp8_kind<kE5M2E4M3>(l, stream);
}

}  // namespace sm90
}  // namespace gemmt
