// Planner queries for tests and tools (gemmt._native.load().plan_simt): what the SIMT planner
// (kernels/plan/simt_plan.cpp) decides for a problem, on any machine, CUDA or not. The
// compiled kernels' occupancy comes from the caller, as the device would report it.
#include "plan_bindings.h"

#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "common/copy_layout.h"
#include "gemmt/gemm_args.h"
#include "gemmt/gemm_variant.h"
#include "plan/decode_plan.h"
#include "plan/fp64_plan.h"
#include "plan/fp8_decode_plan.h"
#include "plan/grouped_plan.h"
#include "plan/plan_rules.h"
#include "plan/simt_plan.h"
#include "plan/sm90_plan.h"

#ifdef GEMMT_WITH_CUDA
#include "common.h"
#endif

namespace py = pybind11;

namespace gemmt {
namespace {

// The occupancy table of the calling thread's current query (one per thread, so concurrent
// callers each plan against their own table).
struct FakeDevice {
  std::array<int, simt::kNumPipeTiles> blocks_per_sm{};
  std::array<bool, simt::kNumPipeTiles> absent{};  // not in the table: as if not compiled
  int refused_tile = -1;                           // this tile's instances report a device error
};
thread_local FakeDevice fake_device;

simt::PipeInstance query_fake(ScalarType t, simt::PipeTile tile, simt::LoadMode a, simt::LoadMode b,
                              bool interior, bool stream_k) {
  simt::PipeInstance inst;
  const int i = static_cast<int>(tile);
  inst.built =
      simt::pipe_instance_built(t, tile, a, b, interior, stream_k) && !fake_device.absent[i];
  if (!inst.built) return inst;
  inst.blocks_per_sm = fake_device.blocks_per_sm[i];
  // cudaErrorInvalidDeviceFunction (98): what a device without the instance's image says.
  if (i == fake_device.refused_tile) inst.error = 98;
  return inst;
}

ScalarType parse_dtype(const std::string& s) {
  if (s == "float32") return ScalarType::kFloat32;
  if (s == "float16") return ScalarType::kFloat16;
  if (s == "bfloat16") return ScalarType::kBFloat16;
  if (s == "uint8") return ScalarType::kUInt8;
  throw std::invalid_argument(
      "plan_simt: dtype must be float32, float16, bfloat16 or uint8, got '" + s + "'");
}

const char* load_mode_name(simt::LoadMode m) {
  return m == simt::kVecC ? "vec_c" : m == simt::kVecK ? "vec_k" : "scalar";
}

// A fake device address: 1 MiB (aligned to anything the planner checks) plus `offset` bytes.
const void* fake_ptr(int64_t offset) {
  return reinterpret_cast<const void*>(static_cast<std::uintptr_t>((1 << 20) + offset));
}

// A device description from Python: any of l2_bytes, memory_clock_khz, memory_bus_bits and
// sm_clock_khz (gemmt/device_info.h); a field left out is unknown, which the planners read
// as the reference device's (kReferenceDevice).
DeviceInfo parse_device_info(const char* fn, const std::map<std::string, int64_t>& d) {
  DeviceInfo info;
  for (const auto& [key, value] : d) {
    if (value < 0 || value > (int64_t{1} << 40)) {
      throw std::invalid_argument(std::string(fn) + ": device_info['" + key +
                                  "'] must be between 0 and 2^40, got " + std::to_string(value));
    }
    if (key == "l2_bytes") {
      info.l2_bytes = value;
    } else if (key == "memory_clock_khz" || key == "memory_bus_bits" || key == "sm_clock_khz") {
      if (value > INT32_MAX) {
        throw std::invalid_argument(std::string(fn) + ": device_info['" + key +
                                    "'] must fit in 32 bits, got " + std::to_string(value));
      }
      int& field = key == "memory_clock_khz"  ? info.memory_clock_khz
                   : key == "memory_bus_bits" ? info.memory_bus_bits
                                              : info.sm_clock_khz;
      field = static_cast<int>(value);
    } else {
      throw std::invalid_argument(std::string(fn) + ": device_info has an unknown key '" + key +
                                  "' (expected l2_bytes, memory_clock_khz, memory_bus_bits, "
                                  "sm_clock_khz)");
    }
  }
  return info;
}

// The problem the planners see: shapes, strides and pointer alignments (fake addresses at
// the given byte offsets, never dereferenced).
GemmArgs problem_args(const std::string& dtype, int64_t m, int64_t n, int64_t k,
                      std::array<int64_t, 2> a_strides, std::array<int64_t, 2> b_strides,
                      int64_t ldc, std::array<int64_t, 3> offsets, int sm_count) {
  GemmArgs a;
  a.dtype = parse_dtype(dtype);
  a.m = m;
  a.n = n;
  a.k = k;
  a.a = fake_ptr(offsets[0]);
  a.a_stride_m = a_strides[0];
  a.a_stride_k = a_strides[1];
  a.b = fake_ptr(offsets[1]);
  a.b_stride_k = b_strides[0];
  a.b_stride_n = b_strides[1];
  a.c = const_cast<void*>(fake_ptr(offsets[2]));
  a.ldc = ldc;
  a.sm_count = sm_count;
  return a;
}

py::dict plan_simt(const std::string& variant, const std::string& dtype, int64_t m, int64_t n,
                   int64_t k, std::array<int64_t, 2> a_strides, std::array<int64_t, 2> b_strides,
                   int64_t ldc, std::array<int64_t, 3> offsets, int sm_count,
                   const std::map<std::string, int>& blocks_per_sm, const std::string& refuse,
                   int device, int cc_major, const std::map<std::string, int64_t>& device_info) {
  GemmVariant v;
  if (!gemm_variant_from_name(variant, &v)) {
    throw std::invalid_argument("plan_simt: unknown variant '" + variant + "'");
  }
  GemmArgs a = problem_args(dtype, m, n, k, a_strides, b_strides, ldc, offsets, sm_count);
  a.cc_major = cc_major;
  a.device = parse_device_info("plan_simt", device_info);
  FakeDevice dev;
  for (int i = 0; i < simt::kNumPipeTiles; ++i) {
    const char* name = simt::pipe_tile_name(static_cast<simt::PipeTile>(i));
    const auto it = blocks_per_sm.find(name);
    if (it == blocks_per_sm.end()) {
      dev.absent[i] = true;
      continue;
    }
    dev.blocks_per_sm[i] = it->second;
    if (refuse == name) dev.refused_tile = i;
  }
  simt::PipeCatalog cat;
  cat.query = &query_fake;
  cat.device = device;
  simt::SimtFamilyPlan fp;
  bool wants_split = false;
  {
    py::gil_scoped_release release;  // plan concurrently with other Python threads
    fake_device = dev;
    fp = simt::plan_simt(a, v, cat);
    wants_split = simt::simt_wants_split_k(a, cat);
  }
  py::dict d;
  d["supported"] = fp.error != simt::kPlanNotSupported;
  d["error"] = fp.error;
  d["wants_split_k"] = wants_split;
  d["block_m"] = fp.summary.block_m;
  d["block_n"] = fp.summary.block_n;
  d["block_k"] = fp.summary.block_k;
  d["stages"] = fp.summary.stages;
  d["threads"] = fp.summary.threads;
  d["splits"] = fp.summary.splits;
  d["interior"] = fp.summary.interior;
  d["stream_k_blocks"] = fp.summary.stream_k_blocks;
  d["stream_k_tiles"] = fp.summary.stream_k_tiles;
  d["workspace_bytes"] = fp.summary.workspace_bytes;
  d["staged_b"] = fp.staged_b;
  d["swapped"] = fp.swapped;
  if (v == GemmVariant::kPipelined || v == GemmVariant::kSplitK) {
    const simt::PipePlan& p = fp.pipe;
    d["tile"] = simt::pipe_tile_name(p.choice.tile);
    d["a_mode"] = load_mode_name(p.choice.a_mode);
    d["b_mode"] = load_mode_name(p.choice.b_mode);
    d["smem_bytes"] = p.choice.smem;
    d["k_per_split"] = p.k_per_split;
    d["tiles_m"] = p.tiles_m;
    d["tiles_n"] = p.tiles_n;
    d["stream_k_iters"] = p.streamk_iters;
    d["stream_k_extra"] = p.streamk_extra;
    d["instance_built"] = fp.error == simt::kPlanOk &&
                          simt::pipe_instance_built(a.dtype, p.choice.tile, p.choice.a_mode,
                                                    p.choice.b_mode, p.choice.interior, false) &&
                          (p.streamk_blocks == 0 ||
                           simt::pipe_instance_built(a.dtype, p.choice.tile, p.choice.a_mode,
                                                     p.choice.b_mode, p.choice.interior, true));
  }
  if (v == GemmVariant::kGemv) {
    d["colsweep"] = fp.gemv.colsweep;
    d["vec16"] = fp.gemv.vec16;
    d["rows_per_block"] = fp.gemv.rows_per_block;
    d["p_per_split"] = fp.gemv.p_per_split;
    d["prefetch_blocks"] = fp.gemv.prefetch_blocks;
  }
  return d;
}

py::dict plan_decode(const std::string& dtype, int64_t m, int64_t n, int64_t k,
                     std::array<int64_t, 2> a_strides, std::array<int64_t, 2> b_strides,
                     int64_t ldc, std::array<int64_t, 3> offsets, int sm_count, int cc_major,
                     const std::map<std::string, int64_t>& device_info) {
  GemmArgs a = problem_args(dtype, m, n, k, a_strides, b_strides, ldc, offsets, sm_count);
  a.cc_major = cc_major;
  a.device = parse_device_info("plan_decode", device_info);
  py::dict d;
  d["supported"] = decode::decode_supports(a);
  if (!d["supported"].cast<bool>()) return d;
  const decode::DecodePlan pl = decode::plan_decode(a);
  d["tiles"] = pl.tiles;
  d["row_warps"] = pl.row_warps;
  d["cluster"] = pl.cluster;
  d["slices_per_cta"] = pl.slices_per_cta;
  d["ctas"] = pl.ctas;
  d["slice_k"] = decode::kSliceK;
  return d;
}

py::dict plan_sm90(const std::string& dtype, int64_t m, int64_t n, int64_t k,
                   std::array<int64_t, 2> a_strides, std::array<int64_t, 2> b_strides, int64_t ldc,
                   std::array<int64_t, 3> offsets, int sm_count, bool allow_tf32, float beta,
                   int cc_major, bool kernels_built, bool bias, int tile_n, int splits, int orient,
                   const std::map<std::string, int64_t>& device_info) {
  if (orient < 0 || orient > 2) {
    throw std::invalid_argument(
        "plan_sm90: argument 'orient' expected 0 (the planner's), 1 (as "
        "given) or 2 (swapped), got " +
        std::to_string(orient));
  }
  if (splits < -4) {
    throw std::invalid_argument(
        "plan_sm90: argument 'splits' expected a slice count, 0 (the "
        "model's) or -1 to -4 (stream-k), got " +
        std::to_string(splits));
  }
  const auto orientation = static_cast<sm90::Orientation>(orient);
  GemmArgs a = problem_args(dtype, m, n, k, a_strides, b_strides, ldc, offsets, sm_count);
  a.device = parse_device_info("plan_sm90", device_info);
  if (bias) a.epilogue.bias = fake_ptr(0);
  a.beta = beta;
  a.allow_tf32 = allow_tf32;
  a.cc_major = cc_major;
  a.cc_minor = 0;
  py::dict d;
  sm90::Problem pr;
  sm90::Staging st;
  sm90::SplitPlan sp;
  sm90::Plan plan;
  bool supported = false, planned = false;
  std::size_t ws = 0;
  int last_row = std::numeric_limits<int>::max();
  {
    py::gil_scoped_release release;
    pr = sm90::problem_with(a, tile_n, orientation);
    supported = sm90::problem_supported(pr, kernels_built);
    if (supported) {
      st = sm90::staging_for(pr.args);
      sp = sm90::split_plan_or_auto(pr, splits);
      ws = sm90::workspace_bytes_with(a, splits, tile_n, orientation, kernels_built);
      sm90::Problem staged = pr;
      staged.args = sm90::staged_args(pr.args, st, planning_workspace());
      planned = sm90::make_plan(staged, &plan, kernels_built);
      if (planned) last_row = sm90::last_tile_row(staged, plan);
    }
  }
  d["supported"] = supported;
  if (!supported) return d;
  d["streams_single_row"] = sm90::streams_single_row(a);
  d["tile_n"] = pr.bn;
  d["c_trans"] = pr.c_trans;
  d["splits"] = sp.splits;
  d["kb_per_split"] = sp.kb_per_split;
  d["stream_k"] = sp.stream_k;
  d["stream_k_tail"] = sp.stream_k_tail();
  d["k_blocks"] = sm90::k_blocks(pr.args);
  d["a_staged"] = st.a;
  d["b_staged"] = st.b;
  d["workspace_bytes"] = ws;
  d["planned"] = planned;
  d["a_mn_major"] = plan.a_mn;
  d["b_mn_major"] = plan.b_mn;
  if (planned) {
    d["a_box_rows"] = plan.a.box[1];
    d["b_box_rows"] = plan.b.box[1];
    d["stage_tx_bytes"] = sm90::stage_tx_bytes(plan);
    d["last_tile_row"] = last_row == std::numeric_limits<int>::max() ? -1 : last_row;
    d["cluster"] = sm90::cluster_ctas(pr, sp.splits > 1);
  }
  return d;
}

py::list plan_rule_table() {
  std::size_t count = 0;
  const PlanRule* rules = gemmt::plan_rules(&count);
  py::list out;
  for (std::size_t i = 0; i < count; ++i) {
    const PlanRule& r = rules[i];
    py::dict d;
    d["name"] = r.name;
    d["planner"] = r.planner;
    d["applied_in"] = r.applied_in;
    d["shape_class"] = r.shape_class;
    d["decision"] = r.decision;
    d["reason"] = r.reason;
    d["gain"] = r.gain;
    d["results"] = r.results;
    d["device"] = r.device;
    d["measured"] = r.measured;
    d["tuner"] = r.tuner;
    out.append(d);
  }
  return out;
}

bool plan_rule_applies(const std::string& name, const std::string& dtype, int64_t m, int64_t n,
                       int64_t k, std::array<int64_t, 2> a_strides,
                       std::array<int64_t, 2> b_strides, int64_t ldc,
                       std::array<int64_t, 3> offsets, int sm_count, bool allow_tf32, bool bias,
                       int cc_major, const std::map<std::string, int64_t>& device_info) {
  const PlanRule* rule = find_plan_rule(name.c_str());
  if (rule == nullptr) {
    throw std::invalid_argument("plan_rule_applies: no planner rule named '" + name + "'");
  }
  GemmArgs a = problem_args(dtype, m, n, k, a_strides, b_strides, ldc, offsets, sm_count);
  if (bias) a.epilogue.bias = fake_ptr(0);
  a.allow_tf32 = allow_tf32;
  a.cc_major = cc_major;
  a.device = parse_device_info("plan_rule_applies", device_info);
  py::gil_scoped_release release;
  return rule->in_class(a);
}

py::dict device_info_dict(const DeviceInfo& info) {
  py::dict d;
  d["l2_bytes"] = info.l2_bytes;
  d["memory_clock_khz"] = info.memory_clock_khz;
  d["memory_bus_bits"] = info.memory_bus_bits;
  d["sm_clock_khz"] = info.sm_clock_khz;
  return d;
}

}  // namespace

void bind_plans(py::module_& m) {
  m.def(
      "reference_device_info", [] { return device_info_dict(kReferenceDevice); },
      "The description of the device the planners' constants were measured on (an H100 SXM), "
      "which they read for any field a device leaves unknown.");
#ifdef GEMMT_WITH_CUDA
  m.def(
      "device_info",
      [](int device) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
          throw std::invalid_argument(
              "device_info: argument 'device' must be a CUDA device "
              "index in [0, " +
              std::to_string(count) + "), got " + std::to_string(device));
        }
        return device_info_dict(wrapper::device_info(device));
      },
      "The properties the planners read for CUDA device `device`, as the wrapper fills "
      "GemmArgs::device (0: not reported by the runtime).",
      py::arg("device"));
#endif
  m.def("plan_rules", &plan_rule_table,
        "The planners' rule table (kernels/plan/plan_rules.cpp): name, planner, applied_in, "
        "shape_class, decision, reason, gain, results, device, measured.");
  m.def("plan_rule_applies", &plan_rule_applies,
        "Whether the product is in the class of the named planner rule; arguments as "
        "plan_sm90's.",
        py::arg("name"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("a_strides"), py::arg("b_strides"), py::arg("ldc"), py::arg("offsets"),
        py::arg("sm_count"), py::arg("allow_tf32") = false, py::arg("bias") = false,
        py::arg("cc_major") = 9, py::arg("device_info") = std::map<std::string, int64_t>{});
  m.def("plan_sm90", &plan_sm90,
        "The Hopper GEMM's plan (kernels/plan/sm90_plan.cpp) for one problem on a device of "
        "compute capability cc_major.0 with sm_count SMs; offsets in bytes from a 1 MiB "
        "address; kernels_built: whether the build holds the sm_90a kernels; bias: the "
        "product carries an epilogue (a bias); tile_n: a tile width to force (0: the model's); "
        "splits and orient: a split count (0: the model's; -1 to -4: stream-k) and an "
        "orientation (0: the planner's, 1: as given, 2: swapped) to force, as the tuner's "
        "candidates do (gemmt/gemm_tc_hooks.h); "
        "device_info: the device's l2_bytes, memory_clock_khz, memory_bus_bits and sm_clock_khz "
        "(any left out: the reference H100's). last_tile_row: the first row of the last 128-row "
        "tile when it is moved up to end at row m (-1: tiles in place); cluster: CTAs a cluster "
        "(sm90::cluster_ctas).",
        py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a_strides"),
        py::arg("b_strides"), py::arg("ldc"), py::arg("offsets"), py::arg("sm_count"),
        py::arg("allow_tf32") = false, py::arg("beta") = 0.0f, py::arg("cc_major") = 9,
        py::arg("kernels_built") = true, py::arg("bias") = false, py::arg("tile_n") = 0,
        py::arg("splits") = 0, py::arg("orient") = 0,
        py::arg("device_info") = std::map<std::string, int64_t>{});
  m.def("plan_decode", &plan_decode,
        "The decode GEMM's plan (kernels/plan/decode_plan.cpp) for one problem; offsets in "
        "bytes from a 1 MiB address.",
        py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a_strides"),
        py::arg("b_strides"), py::arg("ldc"), py::arg("offsets"), py::arg("sm_count"),
        py::arg("cc_major"), py::arg("device_info") = std::map<std::string, int64_t>{});
  m.def(
      "plan_grouped",
      [](int64_t m, int64_t n, int64_t k, int groups, int split, int sm_count, bool c_stageable) {
        grouped_plan::Shape s{m, n, k, groups, split};
        const bool staged = c_stageable && grouped_plan::staged_c(s);
        const int per_sm = grouped_plan::ctas_per_sm(s, staged);
        const int bn = per_sm == 2 ? 128 : grouped_plan::tile_width(s, sm_count);
        py::dict d;
        d["ctas_per_sm"] = per_sm;
        d["tile_n"] = bn;
        d["staged_c"] = staged;
        d["max_tiles"] = grouped_plan::max_tiles(s, bn);
        d["fp8_cluster"] = grouped_plan::fp8_cluster(s);
        d["fp8_row_tile"] = grouped_plan::fp8_row_tile(s, sm_count);
        d["fp8_row_tile_cluster"] = grouped_plan::fp8_row_tile_cluster(s);
        d["fp8_promoted_tile_n"] = grouped_plan::promoted_tile_width(s, sm_count);
        d["fp8_promoted_tile_n_block"] = grouped_plan::promoted_tile_width(s, sm_count, true);
        d["fp8_group_tile_n"] = grouped_plan::promoted_group_tile_width(s, sm_count);
        d["fp8_group_tile_n_block"] = grouped_plan::promoted_group_tile_width(s, sm_count, true);
        d["fp8_k_slices"] = grouped_plan::fp8_k_slices(s, sm_count);
        return d;
      },
      "The grouped / scaled Hopper GEMM's plan (kernels/plan/grouped_plan.cpp) for 16-bit "
      "operands with a K-major A: CTAs an SM, tile width, whether C is staged through shared "
      "memory (where it can be: c_stageable, false for a bias, an activation or a fused "
      "epilogue), and the bound on its tiles; split: 0 none, 1 rows, 2 columns, "
      "3 the contraction dimension (its extent the total of the groups'). fp8_cluster: CTAs a "
      "cluster of an FP8 product (1 or 2) of 128-row tiles; fp8_row_tile: the rows of its tiles "
      "(64: clusters of 64-row tiles over more than 64 rows, fp8_row_tile_cluster CTAs each); "
      "fp8_promoted_tile_n: the promoted FP8 tile's width for one product of this shape (row / "
      "column or tensor scales; fp8_promoted_tile_n_block: with 128x128 block scales); "
      "fp8_group_tile_n(_block): the same for groups on lone CTAs; "
      "fp8_k_slices: the slices of K a few-row FP8 product with "
      "row / column or tensor scales runs as (1: none).",
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("groups"), py::arg("split"),
      py::arg("sm_count"), py::arg("c_stageable") = true);
  m.def("plan_fp8_tail_slices", &grouped_plan::fp8_tail_slices,
        "The slices of K of one FP8 product's last round (kernels/plan/grouped_plan.cpp): units "
        "(tiles, or tile pairs on CTA pairs) dealt over slots CTAs (pairs), k_blocks 128-deep "
        "k-blocks; 1: no split.",
        py::arg("units"), py::arg("slots"), py::arg("k_blocks"));
  m.def("plan_fp8_decode_split", &fp8_decode_plan::k_split,
        "The Hopper FP8 decode kernel's CTAs along K (kernels/plan/fp8_decode_plan.cpp) for an "
        "n x k weight on sm_count SMs, for its widened or its float8 form.",
        py::arg("n"), py::arg("k"), py::arg("sm_count"), py::arg("float8_form") = false);
  m.def(
      "plan_fp64",
      [](int64_t m, int64_t n, bool swap, int sm_count, int narrow_per_sm) {
        py::dict d;
        d["cta_width"] = fp64_plan::dmma_cta_width(m, n, swap, sm_count, narrow_per_sm);
        return d;
      },
      "The float64 tensor-core kernel's plan (kernels/plan/fp64_plan.cpp): cta_width, the CTA's "
      "extent along the MMA's B role (64: two CTAs an SM; 128: one); swap: A K-major and B "
      "MN-major, which the kernel runs as C^T; narrow_per_sm: 128 x 64 CTAs an SM holds.",
      py::arg("m"), py::arg("n"), py::arg("swap"), py::arg("sm_count"),
      py::arg("narrow_per_sm") = 2);
  m.def("plan_simt", &plan_simt,
        "The SIMT planner's plan for one problem on a device with the given occupancy per tile "
        "shape (blocks_per_sm: {'large': .., 'medium': .., 'small': .., 'fat': .., 'narrow': "
        "..,  'skinny': ..}; a tile left out is planned as not compiled); refuse names a tile "
        "whose instances the device refuses; device >= 0 uses the calling thread's plan cache. "
        "Operand addresses are 1 MiB plus offsets (bytes); "
        "cc_major: the device's compute capability (0: unknown).",
        py::arg("variant"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("a_strides"), py::arg("b_strides"), py::arg("ldc"), py::arg("offsets"),
        py::arg("sm_count"), py::arg("blocks_per_sm"), py::arg("refuse") = "",
        py::arg("device") = -1, py::arg("cc_major") = 0,
        py::arg("device_info") = std::map<std::string, int64_t>{});
}

}  // namespace gemmt
