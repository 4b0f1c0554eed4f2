// Instances of the pipelined SIMT kernel: float32, PipeTile::kSkinny (vector loader modes).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_skinny(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kSkinny, false>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
