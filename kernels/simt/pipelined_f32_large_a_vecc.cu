// Instances of the pipelined SIMT kernel: float32, PipeTile::kLarge, A read in 16-byte vectors
// along M (kVecC).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kFloat32, PipeTile::kLarge, false, kVecC,
                                  LoaderSet::kVector>(LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
