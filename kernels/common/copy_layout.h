// The layout of an operand copied by copy_2d (gemmt/strided_copy.cuh): what the planners need
// to size and place it in a workspace. Free of CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gemmt {

constexpr int kCopyTile = 64;
// Largest `len` copy_2d accepts: its grid has at most 65535 tiles along it.
constexpr int64_t kCopyMaxLen = int64_t{65535} * kCopyTile;

// Row pitch of a copy, in elements: `len` rounded up to 16 bytes, so that every row of the
// copy starts 16-byte aligned (vector loads, TMA row strides).
inline int64_t copy_pitch(int64_t len, int64_t elt_bytes) {
  const int64_t per16 = 16 / elt_bytes;
  return (len + per16 - 1) / per16 * per16;
}

// Workspace bytes of a `rows` x copy_pitch(len) copy, rounded up to 256 so that whatever
// follows it in the workspace stays aligned.
inline std::size_t copy_bytes(int64_t rows, int64_t len, int64_t elt_bytes) {
  const std::size_t b = static_cast<std::size_t>(rows) *
                        static_cast<std::size_t>(copy_pitch(len, elt_bytes)) *
                        static_cast<std::size_t>(elt_bytes);
  return (b + 255) / 256 * 256;
}

// A 256-byte-aligned stand-in for the workspace while a copy is only being planned (the
// kernels' plans look at alignment, never at the memory); never dereferenced.
inline char* planning_workspace() {
  return reinterpret_cast<char*>(uintptr_t{256});
}

}  // namespace gemmt
