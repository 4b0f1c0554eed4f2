// Picks a 16-bit instance of the pipelined SIMT kernel (launchers.h: pipe_kernel_16bit).
#include "simt/launchers.h"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_16bit(ScalarType t, PipeTile tile, LoadMode a, LoadMode b) {
  // pipe_instance_built admits only kLarge and kSmall for 16-bit types.
  switch (t) {
    case ScalarType::kFloat16:
      return tile == PipeTile::kLarge
                 ? by_a_mode<ScalarType::kFloat16, PipeTile::kLarge, false>(a, b, false)
                 : pipe_kernel_f16_small(a, b);
    case ScalarType::kBFloat16:
      return tile == PipeTile::kLarge
                 ? by_a_mode<ScalarType::kBFloat16, PipeTile::kLarge, false>(a, b, false)
                 : pipe_kernel_bf16_small(a, b);
    default:
      return PipeKernel{};
  }
}

}  // namespace simt
}  // namespace gemmt
