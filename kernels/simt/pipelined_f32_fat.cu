// Instances of the pipelined SIMT kernel: float32, PipeTile::kFat.
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_fat(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kFat, false>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
