// The TF32 kind's dispatch over its instance files (instances_tf32_*.cu), apart from
// gemm_sm90.cu so that a build may compile the TF32 kernels on first use
// (include/gemmt/deferred.h, group tf32).
#include "sm90/launchers.h"

namespace gemmt {
namespace sm90 {

cudaError_t launch_tf32(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream) {
  return launch_kind<kTF32>(pr, plan, maps, l, stream);
}

}  // namespace sm90
}  // namespace gemmt
