// The Python extension module. Each function calls the op through the dispatcher (not the
// backend kernel), so autograd, device dispatch and torch.compile behave as with torch.ops.
#include <pybind11/pybind11.h>
// torch/python.h (the Tensor type casters) rather than torch/extension.h, which adds the
// whole C++ frontend (torch/all.h) that nothing here uses: 8 s less to compile.
#include <torch/python.h>

#include <optional>
#include <string>

#include "gemmt/deferred.h"
#include "gemmt/gemm_variant.h"
#include "ops.h"
#include "plan_bindings.h"
#include "tuning_bindings.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _gemmt
#endif

namespace py = pybind11;

namespace {

using Tensor = at::Tensor;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// Each binding looks its operator up once (a static local of its own lambda); a call then
// costs one dispatch. The GIL is released for the call, as torch.ops does, so other Python
// threads run meanwhile.
#define GEMMT_OP(Sig, name)                        \
  ([]() -> const c10::TypedOperatorHandle<Sig>& {  \
    static const auto gemmt_op_ = find<Sig>(name); \
    return gemmt_op_;                              \
  }())

using Release = py::call_guard<py::gil_scoped_release>;

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gemmt: hand-written CUDA kernels registered as torch.ops.gemmt";
  gemmt::bind_plans(m);
  gemmt::bind_tuning(m);
  m.def(
      "gemm",
      [](const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta,
         const std::string& variant) {
        GEMMT_OP(
            void(const Tensor&, const Tensor&, const Tensor&, double, double, std::string_view),
            "gemmt::gemm")
            .call(c, a, b, alpha, beta, variant);
      },
      "c = alpha * a @ b + beta * c, in place", py::arg("c"), py::arg("a"), py::arg("b"),
      py::arg("alpha") = 1.0, py::arg("beta") = 0.0, py::kw_only(), py::arg("variant") = "auto",
      Release());
  m.def(
      "mm",
      [](const Tensor& a, const Tensor& b) {
        return GEMMT_OP(Tensor(const Tensor&, const Tensor&), "gemmt::mm").call(a, b);
      },
      "a @ b (differentiable)", py::arg("a"), py::arg("b"), Release());
  m.def(
      "add",
      [](const Tensor& a, const Tensor& b) {
        return GEMMT_OP(Tensor(const Tensor&, const Tensor&), "gemmt::add").call(a, b);
      },
      "a + b (differentiable)", py::arg("a"), py::arg("b"), Release());
  m.def(
      "square",
      [](const Tensor& x) { return GEMMT_OP(Tensor(const Tensor&), "gemmt::square").call(x); },
      "x * x (differentiable)", py::arg("x"), Release());
  m.def(
      "scale",
      [](const Tensor& x, double factor) {
        return GEMMT_OP(Tensor(const Tensor&, double), "gemmt::scale").call(x, factor);
      },
      "x * factor (differentiable)", py::arg("x"), py::arg("factor") = 2.0, Release());
  m.def(
      "rgb_to_gray",
      [](const Tensor& img, bool bgr) {
        return GEMMT_OP(Tensor(const Tensor&, bool), "gemmt::rgb_to_gray").call(img, bgr);
      },
      "uint8 [..., H, W, 3] -> uint8 [..., H, W] luma", py::arg("img"), py::arg("bgr") = false,
      Release());
  m.def(
      "normalize_volume",
      [](const Tensor& vol, double max_val) {
        return GEMMT_OP(Tensor(const Tensor&, double), "gemmt::normalize_volume")
            .call(vol, max_val);
      },
      "uint8/uint16 volume -> float32 vol / max_val", py::arg("vol"), py::arg("max_val"),
      Release());
  m.def(
      "linear",
      [](const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
         const std::string& activation) {
        return GEMMT_OP(Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                               std::string_view),
                        "gemmt::linear")
            .call(x, weight, bias, activation);
      },
      "act(x @ weight.T + bias) (differentiable)", py::arg("x"), py::arg("weight"),
      py::arg("bias") = py::none(), py::arg("activation") = "none", Release());
  m.def(
      "gemm_variants",
      [] {
        py::tuple names(static_cast<std::size_t>(gemmt::GemmVariant::kCount));
        for (std::size_t i = 0; i < names.size(); ++i) names[i] = gemmt::kGemmVariantNames[i];
        return names;
      },
      "The names gemm(..., variant=...) accepts, in GemmVariant order ('auto' first)");
  // gemmt's own CPU loops, which the tests hold the registered CPU kernels (ATen's
  // vectorised kernels) to. Direct calls, no dispatcher: CPU tensors only, no autograd.
  namespace w = gemmt::wrapper;
  py::module_ ref = m.def_submodule(
      "reference", "gemmt's plain CPU loops: the reference the CPU kernels are tested against");
  ref.def("gemm", &w::gemm_cpu_reference, py::arg("c"), py::arg("a"), py::arg("b"),
          py::arg("alpha") = 1.0, py::arg("beta") = 0.0, Release());
  ref.def("mm", &w::mm_cpu_reference, py::arg("a"), py::arg("b"), Release());
  ref.def(
      "linear",
      [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b, const std::string& act) {
        return w::linear_cpu_reference(x, w, b, act);
      },
      "(act(x @ w.T + b), x @ w.T + b)", py::arg("x"), py::arg("weight"),
      py::arg("bias") = py::none(), py::arg("activation") = "none", Release());
  ref.def(
      "linear_activation_backward",
      [](const Tensor& g, const Tensor& z, const std::string& act, bool bias_grad) {
        return w::linear_activation_backward_cpu_reference(g, z, act, bias_grad);
      },
      py::arg("grad"), py::arg("preact"), py::arg("activation"), py::arg("bias_grad"), Release());
  ref.def("linear_bias_backward", &w::linear_bias_backward_cpu_reference, py::arg("grad"),
          Release());
  ref.def("add", &w::add_cpu_reference, py::arg("a"), py::arg("b"), Release());
  ref.def("square", &w::square_cpu_reference, py::arg("x"), Release());
  ref.def("square_backward", &w::square_backward_cpu_reference, py::arg("grad"), py::arg("x"),
          Release());
  ref.def("scale", &w::scale_cpu_reference, py::arg("x"), py::arg("factor") = 2.0, Release());
  ref.def("swiglu", &w::swiglu_cpu_reference, py::arg("gate"), py::arg("up"), Release());
  ref.def("swiglu_backward", &w::swiglu_backward_cpu_reference, py::arg("grad"), py::arg("gate"),
          py::arg("up"), Release());
  ref.def("rgb_to_gray", &w::rgb_to_gray_cpu_reference, py::arg("img"), py::arg("bgr") = false,
          Release());
  ref.def("normalize_volume", &w::normalize_volume_cpu_reference, py::arg("vol"),
          py::arg("max_val"), Release());
  m.def("build_info_json", &gemmt::wrapper::build_info_json,
        "JSON string: versions, architectures and compiler this module was built with");
#ifdef GEMMT_WITH_CUDA
  m.def(
      "load_kernel_group",
      [](const std::string& group) -> std::optional<std::string> {
        if (gemmt::deferred::load(group.c_str())) return std::nullopt;
        return std::string(gemmt::deferred::failure());
      },
      "Compiles (unless cached) and loads a kernel group of build_info()['deferred_groups']; "
      "None, or why it could not",
      py::arg("group"), Release());
#endif
  m.def(
      "build_info",
      [] { return py::module_::import("json").attr("loads")(gemmt::wrapper::build_info_json()); },
      "dict: torch and CUDA versions, CUDA architectures and compiler this module was built with");
}
