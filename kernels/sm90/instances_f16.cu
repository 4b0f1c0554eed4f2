// The Hopper GEMM kernel's instances for float16 operands: every operand layout, all four tile
// widths and both cluster shapes.
#include "sm90/launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t launch_f16(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                       cudaStream_t stream) {
  return launch_kind<kF16>(pr, plan, maps, l, stream);
}

}  // namespace sm90
}  // namespace gemmt
