// Instances of the pipelined SIMT kernel: float32, PipeTile::kSmall, vector loaders (the
// element-wise ones: pipelined_f32_small_scalar.cu).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_small(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kSmall, false, LoaderSet::kVector>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
