// Instances of the pipelined SIMT kernel: float32, PipeTile::kFat, whole-tiles (interior) form.
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_fat_interior(LoadMode a, LoadMode b, bool stream_k) {
  return pipe_kernel_of<float, PipeTile::kFat, true>(a, b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
