// The tuner's state, cache and statistics for Python (gemmt/tuning.py wraps them). The
// functions keep the GIL and run under torch's warning handler, so the tuner's warnings (a
// corrupt cache file, one from another version) reach Python's warnings module.
#include "tuning_bindings.h"

#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

#include <string>
#include <tuple>
#include <vector>

#include "gemm_tuner.h"

namespace py = pybind11;

namespace gemmt {
namespace {

namespace tn = wrapper::tuning;

tn::Mode mode_from_name(const std::string& name) {
  if (name == "off") return tn::Mode::kOff;
  if (name == "cached") return tn::Mode::kCached;
  if (name == "tune") return tn::Mode::kTune;
  throw py::value_error("gemmt.tune: mode expected 'off', 'cached' or 'tune', got '" + name + "'");
}

// Runs f with C++ warnings turned into Python warnings when the handler goes out of scope.
template <typename F>
auto with_warnings(F&& f) {
  torch::PyWarningHandler handler;
  try {
    return f();
  } catch (...) {
    handler.set_in_exception();
    throw;
  }
}

py::dict plan_stats(const tn::ProblemStats& p) {
  py::dict d;
  d["device"] = p.device;
  d["problem"] = p.problem;
  d["seconds"] = p.seconds;
  d["candidates"] = p.candidates;
  d["rejected"] = p.rejected;
  d["failed"] = p.failed;
  d["winner"] = p.winner.str();
  d["tuned_us"] = p.tuned_us;
  d["default_us"] = p.default_us;
  py::list timed;
  for (const auto& [plan, us] : p.timed) timed.append(py::make_tuple(plan.str(), us));
  d["timed"] = timed;
  return d;
}

}  // namespace

void bind_tuning(py::module_& m) {
  m.def(
      "tuning_configure",
      [](const std::string& mode, const std::string& path) {
        const tn::Mode md = mode_from_name(mode);
        with_warnings([&] {
          tn::configure(md, path);
          return 0;
        });
      },
      "Sets the tuner's mode ('off', 'cached', 'tune') and cache file ('' for none)",
      py::arg("mode"), py::arg("path"));
  m.def(
      "tuning_state",
      [] {
        return with_warnings([] {
          return std::make_tuple(std::string(tn::mode_name(tn::mode())), tn::cache_path());
        });
      },
      "(mode, cache file) of the tuner");
  m.def(
      "tuning_load",
      [](const std::string& path) { return with_warnings([&] { return tn::load(path); }); },
      "Merges a cache file into memory (entries in memory win); False with a warning when "
      "the file cannot be used",
      py::arg("path"));
  m.def(
      "tuning_save",
      [](const std::string& path) { return with_warnings([&] { return tn::save(path); }); },
      "Merges memory into a cache file (locked, written to a temporary file and renamed); "
      "False with a warning when it cannot be written",
      py::arg("path"));
  m.def(
      "tuning_entries",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string, double, double>> out;
        for (const auto& [key, e] : with_warnings([] { return tn::entries(); })) {
          out.emplace_back(key.first, key.second, e.plan.str(), e.tuned_us, e.default_us);
        }
        return out;
      },
      "[(device, problem, plan, tuned_us, default_us)] of the cache in memory");
  m.def(
      "tuning_insert",
      [](const std::string& device, const std::string& problem, const std::string& plan,
         double tuned_us, double default_us) {
        tn::Entry e;
        if (!tn::Plan::parse(plan, &e.plan)) {
          throw py::value_error(
              "gemmt.tuning: argument 'plan' expected a plan such as 'wgmma' "
              "or 'wgmma:bn=128:splits=2:orient=swapped', got '" +
              plan + "'");
        }
        e.tuned_us = tuned_us;
        e.default_us = default_us;
        with_warnings([&] {
          tn::insert(device, problem, e);
          return 0;
        });
      },
      "Adds an entry to the cache in memory (for tools and tests)", py::arg("device"),
      py::arg("problem"), py::arg("plan"), py::arg("tuned_us"), py::arg("default_us"));
  m.def(
      "tuning_clear",
      [] {
        with_warnings([] {
          tn::clear();
          return 0;
        });
      },
      "Empties the cache in memory (files are untouched)");
  m.def(
      "tuning_stats",
      [] {
        const tn::Stats s = with_warnings([] { return tn::stats(); });
        py::dict d;
        py::list problems;
        double total = 0.0;
        for (const auto& p : s.problems) {
          problems.append(plan_stats(p));
          total += p.seconds;
        }
        d["problems"] = problems;
        d["seconds"] = total;
        d["cache_hits"] = s.cache_hits;
        d["capture_skips"] = s.capture_skips;
        d["untuned_cached"] = s.untuned_cached;
        d["tuning_skipped"] = s.tuning_skipped;
        return d;
      },
      "What tuning cost and found since the last reset");
  m.def(
      "tuning_reset_stats",
      [] {
        with_warnings([] {
          tn::reset_stats();
          return 0;
        });
      },
      "Zeroes the tuner's statistics");
  m.def(
      "tuning_library_version", [] { return tn::library_version(); },
      "The version cache files are keyed by");
}

}  // namespace gemmt
