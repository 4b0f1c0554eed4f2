// The Hopper GEMM kernel's instances for float32 read as tf32 operands: every operand layout, all
// three tile widths and both cluster shapes.
#include "sm90/launch.cuh"

namespace gemmt {
namespace sm90 {

cudaError_t launch_tf32(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream) {
  return launch_kind<kTF32>(pr, plan, maps, l, stream);
}

}  // namespace sm90
}  // namespace gemmt
