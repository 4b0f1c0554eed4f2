// The Python extension module. Each function calls the op through the dispatcher (not the
// backend kernel), so autograd, device dispatch and torch.compile behave as with torch.ops.
#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <string>

#include "ops.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _gemmt
#endif

namespace py = pybind11;

namespace {

template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

void gemm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha, double beta,
          const std::string& variant) {
  static auto op = handle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                               double, std::string_view)>("gemmt::gemm");
  op.call(c, a, b, alpha, beta, variant);
}

at::Tensor binary(const char* name, const at::Tensor& a, const at::Tensor& b) {
  return handle<at::Tensor(const at::Tensor&, const at::Tensor&)>(name).call(a, b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gemmt: hand-written CUDA kernels registered as torch.ops.gemmt";
  m.def("gemm", &gemm, "c = alpha * a @ b + beta * c, in place", py::arg("c"), py::arg("a"),
        py::arg("b"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0, py::kw_only(),
        py::arg("variant") = "auto");
  m.def(
      "mm", [](const at::Tensor& a, const at::Tensor& b) { return binary("gemmt::mm", a, b); },
      "a @ b (differentiable)", py::arg("a"), py::arg("b"));
  m.def(
      "add", [](const at::Tensor& a, const at::Tensor& b) { return binary("gemmt::add", a, b); },
      "a + b (differentiable)", py::arg("a"), py::arg("b"));
  m.def(
      "square",
      [](const at::Tensor& x) {
        return handle<at::Tensor(const at::Tensor&)>("gemmt::square").call(x);
      },
      "x * x (differentiable)", py::arg("x"));
  m.def(
      "scale",
      [](const at::Tensor& x, double factor) {
        return handle<at::Tensor(const at::Tensor&, double)>("gemmt::scale").call(x, factor);
      },
      "x * factor (differentiable)", py::arg("x"), py::arg("factor") = 2.0);
  m.def(
      "rgb_to_gray",
      [](const at::Tensor& img, bool bgr) {
        return handle<at::Tensor(const at::Tensor&, bool)>("gemmt::rgb_to_gray").call(img, bgr);
      },
      "uint8 [..., H, W, 3] -> uint8 [..., H, W] luma", py::arg("img"), py::arg("bgr") = false);
  m.def(
      "normalize_volume",
      [](const at::Tensor& vol, double max_val) {
        return handle<at::Tensor(const at::Tensor&, double)>("gemmt::normalize_volume")
            .call(vol, max_val);
      },
      "uint8/uint16 volume -> float32 vol / max_val", py::arg("vol"), py::arg("max_val"));
  m.def("build_info_json", &gemmt::wrapper::build_info_json,
        "JSON string: versions, architectures and compiler this module was built with");
  m.def(
      "build_info",
      [] { return py::module_::import("json").attr("loads")(gemmt::wrapper::build_info_json()); },
      "dict: torch and CUDA versions, CUDA architectures and compiler this module was built with");
}
