// Instances of the pipelined SIMT kernel: float32, PipeTile::kMedium, vector loaders (the
// element-wise ones: pipelined_f32_medium_scalar.cu).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_medium(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kMedium, false, LoaderSet::kVector>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
