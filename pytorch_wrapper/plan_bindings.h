// Python bindings of the planners in kernels/plan/ (plan_bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace gemmt {
void bind_plans(pybind11::module_& m);
}  // namespace gemmt
