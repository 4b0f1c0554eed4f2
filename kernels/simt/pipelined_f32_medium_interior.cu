// Instances of the pipelined SIMT kernel: float32, PipeTile::kMedium, whole-tiles (interior) form.
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_medium_interior(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kMedium, true>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
