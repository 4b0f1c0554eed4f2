// Python bindings of the GEMM tuner (tuning_bindings.cpp; gemmt.tuning is the public API).
#pragma once

#include <pybind11/pybind11.h>

namespace gemmt {
void bind_tuning(pybind11::module_& m);
}  // namespace gemmt
