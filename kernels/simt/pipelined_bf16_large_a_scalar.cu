// Instances of the pipelined SIMT kernel: bfloat16, PipeTile::kLarge, A read element by element
// (kScalar).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kBFloat16, PipeTile::kLarge, false, kScalar>(
    LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
