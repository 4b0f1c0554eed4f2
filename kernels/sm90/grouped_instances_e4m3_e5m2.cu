// The grouped GEMM's float8 e4m3 x e5m2 (e4m3 times an e5m2 gradient) instances
// (grouped_launch.cuh), in a translation unit of their own.
#include "sm90/grouped_launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t grouped_launch_e4m3_e5m2(const GroupedLaunch& l, cudaStream_t stream) {
  return launch_grouped_fp8_kind<kE4M3E5M2>(l, stream);
}

}  // namespace sm90
}  // namespace gemmt
