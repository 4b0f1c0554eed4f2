// Instances of the pipelined SIMT kernel: float32, PipeTile::kNarrow, those with an element-wise
// loader (launchers.h: LoaderSet).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_narrow_scalar(LoadMode a, LoadMode b) {
  return pipe_kernel_of<float, PipeTile::kNarrow, false, LoaderSet::kScalar>(a, b, false);
}

}  // namespace simt
}  // namespace gemmt
