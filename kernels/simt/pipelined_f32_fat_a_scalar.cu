// Instances of the pipelined SIMT kernel: float32, PipeTile::kFat, A read element by element
// (kScalar).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kFloat32, PipeTile::kFat, false, kScalar>(
    LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
