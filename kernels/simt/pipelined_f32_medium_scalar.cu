// Instances of the pipelined SIMT kernel: float32, PipeTile::kMedium, those with an element-wise
// loader (launchers.h: LoaderSet).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_medium_scalar(LoadMode a, LoadMode b) {
  return pipe_kernel_of<float, PipeTile::kMedium, false, LoaderSet::kScalar>(a, b, false);
}

}  // namespace simt
}  // namespace gemmt
