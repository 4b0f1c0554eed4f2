// Picks a float32 instance of the pipelined SIMT kernel with an element-wise loader
// (launchers.h: pipe_kernel_f32_scalar), in its own translation unit so that a build may
// compile these instances on first use (include/gemmt/deferred.h, group simt32_scalar): they
// serve only operands whose rows or start are not 16-byte aligned.
#include "simt/launchers.h"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_f32_scalar(PipeTile tile, LoadMode a, LoadMode b) {
  switch (tile) {
    case PipeTile::kSmall:
      return pipe_kernel_f32_small_scalar(a, b);
    case PipeTile::kMedium:
      return pipe_kernel_f32_medium_scalar(a, b);
    case PipeTile::kLarge:
      return pipe_kernel_f32_large_scalar(a, b);
    case PipeTile::kFat:
      return pipe_kernel_f32_fat_scalar(a, b);
    case PipeTile::kNarrow:
      return pipe_kernel_f32_narrow_scalar(a, b);
    default:  // kSkinny runs vector loaders only (pipe_instance_built)
      return PipeKernel{};
  }
}

}  // namespace simt
}  // namespace gemmt
