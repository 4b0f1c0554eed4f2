// The exported names of a group's library (deferred_functions.h), compiled only into that
// library, which the loader builds with GEMMT_DEFERRED_GROUP_LIB and GEMMT_DEFER_<GROUP>
// defined. Everything else in the library is hidden (-fvisibility=hidden), so its copies of
// the group's functions never stand in for the module's.
#ifdef GEMMT_DEFERRED_GROUP_LIB
#include "deferred/deferred_functions.h"

#define GEMMT_EXPORT(group, ret, fail, fn, name, params, args)                         \
  extern "C" __attribute__((visibility("default"))) ret gemmt_deferred_##name params { \
    return fn args;                                                                    \
  }

GEMMT_DEFERRED_SELECTED(GEMMT_EXPORT)
#endif  // GEMMT_DEFERRED_GROUP_LIB
