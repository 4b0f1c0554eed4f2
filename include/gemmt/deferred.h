// Kernel groups compiled on first use.
//
// A build may leave rarely used kernel groups out of the module (CMake: GEMMT_DEFERRED_GROUPS;
// sources.txt lists each group's files as `deferred_<group>`). The module then holds, for each
// function the rest of the library calls in such a group, a forwarding definition
// (kernels/deferred/deferred_functions.h) that on its first call compiles the group's sources
// with the build's own nvcc command into a shared library, caches it, loads it and forwards.
// The cache is keyed by the sources' contents and the compile command, so a changed tree or
// toolchain never loads a stale library; concurrent processes build a group once (file lock,
// then an atomic rename).
//
// Environment: GEMMT_CACHE_DIR (default $XDG_CACHE_HOME/gemmt or ~/.cache/gemmt), GEMMT_NVCC
// (the compiler, default the build's), GEMMT_SOURCE_DIR (the sources, default the ones
// installed beside the module, then the build's source tree).
#pragma once

namespace gemmt {
namespace deferred {

// The groups this build compiles on first use, comma-separated; "" when none.
const char* groups();

// Builds (unless cached) and loads `group`. False, with failure() saying why, when it cannot;
// true at once for a group the module holds.
bool load(const char* group);

// The address of the group's exported function `name` (loading the group first), or nullptr
// with failure() saying why.
void* symbol(const char* group, const char* name);

// Why the last load or symbol call of this thread failed ("" when none has).
const char* failure();

// A forwarding definition's answer when its group cannot be loaded: sets *why to failure()
// (when why is not null) and returns false.
bool refuse(const char** why);

}  // namespace deferred
}  // namespace gemmt
