// The module's definitions of the functions of each group this build compiles on first use
// (deferred_functions.h): each asks the loader for the group's function once and forwards.
// Empty in a build that compiles every group (GEMMT_DEFER_<GROUP> unset).
#include <atomic>

#include "deferred/deferred_functions.h"
#include "gemmt/deferred.h"

#define GEMMT_FORWARD(group, ret, fail, fn, name, params, args)                               \
  ret fn params {                                                                             \
    using Target = ret(*) params;                                                             \
    static std::atomic<Target> target{nullptr};                                               \
    Target f = target.load(std::memory_order_acquire);                                        \
    if (f == nullptr) {                                                                       \
      f = reinterpret_cast<Target>(gemmt::deferred::symbol(#group, "gemmt_deferred_" #name)); \
      if (f == nullptr) return fail;                                                          \
      target.store(f, std::memory_order_release);                                             \
    }                                                                                         \
    return f args;                                                                            \
  }

GEMMT_DEFERRED_SELECTED(GEMMT_FORWARD)
