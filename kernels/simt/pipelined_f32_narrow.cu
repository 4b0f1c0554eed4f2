// Instances of the pipelined SIMT kernel: float32, PipeTile::kNarrow, vector loaders (the
// element-wise ones: pipelined_f32_narrow_scalar.cu).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_narrow(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kNarrow, false, LoaderSet::kVector>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
