// Instances of the pipelined SIMT kernel: float16, PipeTile::kSmall (16-bit inputs usually go to
// the tensor-core families, so their SIMT build keeps two shapes, Large and Small).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f16_small(LoadMode a, LoadMode b) {
  return pipe_kernel_of<__half, PipeTile::kSmall, false>(a, b, false);
}

}  // namespace simt
}  // namespace gemmt
