// The tuner's timing side: candidate schedules of a problem, their verification against the
// default plan, CUDA-event timing, and the dispatch of cached winners (see gemm_tuner.h).
#ifdef GEMMT_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "gemm_tuner.h"
#include "gemmt/gemm.h"
#include "gemmt/gemm_tc_hooks.h"

namespace gemmt::wrapper::tuning {
namespace {

// At most this many schedules are timed for one problem (the default included), which keeps
// tuning a shape well under a second.
constexpr std::size_t kMaxCandidates = 24;
// A candidate replaces the default plan only when at least this much faster: within timing
// noise the default, the planner's tested choice, stays.
constexpr double kWinMargin = 0.99;

bool is_tensor_core(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat16 || a.dtype == ScalarType::kBFloat16 ||
         (a.dtype == ScalarType::kFloat32 && a.allow_tf32);
}

int64_t elt_bytes(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat32 ? 4 : 2;
}

at::ScalarType torch_dtype(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat16    ? at::kHalf
         : a.dtype == ScalarType::kBFloat16 ? at::kBFloat16
                                            : at::kFloat;
}

detail::Sm90Orientation orientation(const Plan& p) {
  return static_cast<detail::Sm90Orientation>(p.orient);
}

bool plan_supported(const GemmArgs& args, const Plan& p) {
  if (p.variant == GemmVariant::kWgmma && p.forced()) {
    return gemm_supports(args, GemmVariant::kWgmma) &&
           detail::gemm_sm90_forced_supports(args, p.bn, orientation(p));
  }
  return gemm_supports(args, p.variant);
}

std::size_t plan_workspace(const GemmArgs& args, const Plan& p) {
  if (p.variant == GemmVariant::kWgmma && p.forced()) {
    return detail::gemm_sm90_split_workspace_bytes(args, p.splits, p.bn, orientation(p));
  }
  return gemm_workspace_bytes(args, p.variant);
}

cudaError_t launch_plan(const GemmArgs& args, const Plan& p, void* ws, cudaStream_t stream) {
  if (p.variant == GemmVariant::kWgmma && p.forced()) {
    return detail::gemm_sm90_run_splits(args, p.splits, p.bn, ws, stream, orientation(p));
  }
  return gemm_run(args, p.variant, ws, stream);
}

// Runs a plan on the caller's buffers, with a workspace from the caching allocator.
cudaError_t run_plan(const GemmArgs& args, const Plan& p, const at::Tensor& c,
                     cudaStream_t stream) {
  const std::size_t bytes = plan_workspace(args, p);
  at::Tensor ws;
  if (bytes > 0) ws = at::empty({static_cast<int64_t>(bytes)}, c.options().dtype(at::kByte));
  return launch_plan(args, p, bytes ? ws.data_ptr() : nullptr, stream);
}

// The schedules worth timing: the default plan first, the other families that take the
// problem, then on Hopper the tile widths x orientations (the planner's orientation first),
// with split counts for products too small to fill the GPU and stream-k for the others.
std::vector<Plan> candidates(const GemmArgs& args, const Plan& def) {
  std::vector<Plan> out{def};
  auto add = [&](const Plan& p) {
    if (out.size() >= kMaxCandidates) return;
    if (std::find(out.begin(), out.end(), p) != out.end()) return;
    if (plan_supported(args, p)) out.push_back(p);
  };
  const bool tc = is_tensor_core(args);
  if (tc) {
    add(Plan{GemmVariant::kWgmma});
    add(Plan{GemmVariant::kMmaSync});
    add(Plan{GemmVariant::kDecode});
  } else {
    add(Plan{GemmVariant::kPipelined});
    add(Plan{GemmVariant::kSplitK});
  }
  if (args.m == 1 || args.n == 1) add(Plan{GemmVariant::kGemv});
  if (!tc || !gemm_supports(args, GemmVariant::kWgmma)) return out;

  const int planner_orient = detail::gemm_sm90_auto_swaps(args) ? 2 : 1;
  // The forced form of the default Hopper plan would time the same schedule twice.
  const int planner_bn = detail::gemm_sm90_auto_tile_n(args);
  const bool def_is_wgmma = def.variant == GemmVariant::kWgmma && !def.forced();
  const int orients[2] = {planner_orient, 3 - planner_orient};
  const bool sixteen_bit = args.dtype != ScalarType::kFloat32;
  std::vector<int> widths = {256, 128, 64};
  if (sixteen_bit) widths.insert(widths.begin() + 1, 192);
  const int64_t k_blocks = (args.k * elt_bytes(args) + 127) / 128;
  const int sms = std::max(args.sm_count, 1);
  std::vector<Plan> extra;
  for (int orient : orients) {
    for (int bn : widths) {
      if (!(def_is_wgmma && bn == planner_bn && orient == planner_orient)) {
        add(Plan{GemmVariant::kWgmma, bn, 0, orient});
      }
      const int64_t rows = orient == 2 ? args.n : args.m, cols = orient == 2 ? args.m : args.n;
      const int64_t tiles = ((rows + 127) / 128) * ((cols + bn - 1) / bn);
      if (tiles * 2 <= sms) {
        extra.push_back(Plan{GemmVariant::kWgmma, bn, 1, orient});
        const int64_t fill = std::min<int64_t>(sms / std::max<int64_t>(tiles, 1), k_blocks);
        if (fill >= 2)
          extra.push_back(Plan{GemmVariant::kWgmma, bn, static_cast<int>(fill), orient});
      } else if (bn == 256) {
        extra.push_back(Plan{GemmVariant::kWgmma, bn, -1, orient});
        extra.push_back(Plan{GemmVariant::kWgmma, bn, -4, orient});
      }
    }
  }
  for (const Plan& p : extra) add(p);
  return out;
}

// The device a file entry is measured on: name, SM count, compute capability, driver.
const std::string& device_identity(int device) {
  static std::mutex mu;
  static std::array<std::string, 64> ids;
  std::lock_guard<std::mutex> lk(mu);
  std::string& id = ids.at(static_cast<std::size_t>(device));
  if (id.empty()) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    std::string name = prop->name;
    for (char& ch : name) {
      if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';
    }
    id = name + " sms=" + std::to_string(prop->multiProcessorCount) +
         " cc=" + std::to_string(prop->major) + "." + std::to_string(prop->minor) +
         " driver=" + std::to_string(driver);
  }
  return id;
}

std::mutex& device_timing_mutex(int device) {
  static std::array<std::mutex, 64> mus;
  return mus.at(static_cast<std::size_t>(device));
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // An error here is treated as a capture: never time when unsure.
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
         status != cudaStreamCaptureStatusNone;
}

void warn_once(const std::string& what) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!seen.insert(what).second) return;
  }
  TORCH_WARN(what);
}

// Everything one problem's tuning needs: scratch outputs laid out like the caller's (same
// row strides, same address modulo 16, so every schedule sees the alignment the real call
// has), the saved C when beta reads it, events, and a buffer that evicts the operands from
// L2 between timed runs (a model's weights do not stay in L2 from one use to the next).
class Bench {
 public:
  Bench(const GemmArgs& args, const at::Tensor& c, cudaStream_t stream)
      : args_(args), opts_(c.options()), stream_(stream) {
    elt_ = elt_bytes(args);
    c_span_ = ((args.m - 1) * args.ldc + args.n) * elt_;
    ref_ = args;
    cand_ = args;
    ref_.c = scratch_like(args.c, c_span_);
    cand_.c = scratch_like(args.c, c_span_);
    if (args.beta != 0.f) {
      c0_ = scratch_like(args.c, c_span_);
      copy(c0_, args.c, c_span_);
    }
    if (args.epilogue.preact != nullptr) {
      p_span_ = ((args.m - 1) * args.epilogue.ld_preact + args.n) * elt_;
      ref_.epilogue.preact = scratch_like(args.epilogue.preact, p_span_);
      cand_.epilogue.preact = scratch_like(args.epilogue.preact, p_span_);
    }
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(c.get_device());
    flush_bytes_ = 2 * static_cast<int64_t>(std::max(prop->l2CacheSize, 1 << 20));
    flush_ = keep(at::empty({flush_bytes_}, opts_.dtype(at::kByte)));
    check(cudaEventCreate(&start_));
    check(cudaEventCreate(&end_));
  }
  ~Bench() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (end_ != nullptr) cudaEventDestroy(end_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  // Runs the default plan into the reference output and sets the tolerances from it.
  cudaError_t reference(const Plan& def) {
    void* ws = workspace(ref_, def);
    restore(ref_);
    const cudaError_t st = launch_plan(ref_, def, ws, stream_);
    if (st != cudaSuccess) return st;
    set_tolerances();
    return cudaSuccess;
  }

  // Runs `p` once into the candidate output; false when it does not launch.
  bool run_once(const Plan& p) {
    void* ws = workspace(cand_, p);
    restore(cand_);
    if (launch_plan(cand_, p, ws, stream_) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused launch is not the caller's error
      return false;
    }
    return true;
  }

  // Whether the candidate output (and pre-activation) is within rounding of the reference:
  // elementwise |x - d| <= tol, or equal (infinities), or both NaN.
  bool matches() const {
    if (!close(cand_.c, ref_.c, args_.ldc, tol_c_)) return false;
    return p_span_ == 0 ||
           close(cand_.epilogue.preact, ref_.epilogue.preact, args_.epilogue.ld_preact, tol_p_);
  }

  // Median time of `p` in microseconds (infinity when a run fails): two warm-up runs, then
  // single runs between events, each after C is restored and L2 flushed; 9 samples for
  // short products, fewer for long ones.
  double time_us(const Plan& p) {
    void* ws = workspace(cand_, p);
    for (int i = 0; i < 2; ++i) {
      restore(cand_);
      if (launch_plan(cand_, p, ws, stream_) != cudaSuccess) return fail();
    }
    std::vector<double> us;
    int samples = 9;
    for (int i = 0; i < samples; ++i) {
      restore(cand_);
      check(cudaMemsetAsync(flush_, i & 0xff, static_cast<std::size_t>(flush_bytes_), stream_));
      check(cudaEventRecord(start_, stream_));
      if (launch_plan(cand_, p, ws, stream_) != cudaSuccess) return fail();
      check(cudaEventRecord(end_, stream_));
      check(cudaEventSynchronize(end_));
      float ms = 0.f;
      check(cudaEventElapsedTime(&ms, start_, end_));
      us.push_back(1e3 * static_cast<double>(ms));
      if (i == 0) samples = us[0] > 20000.0 ? 3 : (us[0] > 1000.0 ? 5 : 9);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

 private:
  static double fail() {
    (void)cudaGetLastError();
    return std::numeric_limits<double>::infinity();
  }
  static void check(cudaError_t st) {
    TORCH_CHECK(st == cudaSuccess, "gemmt tuner: ", launch_status_text(st));
  }
  void* keep(at::Tensor t) {
    held_.push_back(std::move(t));
    return held_.back().data_ptr();
  }
  void* scratch_like(const void* like, int64_t span) {
    const auto off = static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(like) % 16);
    return static_cast<char*>(keep(at::empty({span + 16}, opts_.dtype(at::kByte)))) + off;
  }
  void copy(void* dst, const void* src, int64_t bytes) {
    check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice,
                          stream_));
  }
  void restore(const GemmArgs& g) {
    if (c0_ != nullptr) copy(g.c, c0_, c_span_);
  }
  void* workspace(const GemmArgs& g, const Plan& p) {
    const std::size_t bytes = plan_workspace(g, p);
    return bytes ? keep(at::empty({static_cast<int64_t>(bytes)}, opts_.dtype(at::kByte))) : nullptr;
  }
  at::Tensor view(const void* p, int64_t ld) const {
    return at::from_blob(const_cast<void*>(p), {args_.m, args_.n}, {ld, 1},
                         opts_.dtype(torch_dtype(args_)));
  }

  // tol = 2 ulp(|d|) for the two roundings to the dtype, plus the float32 accumulation's
  // difference between orders of summation, bounded by 8 sqrt(k) unit roundoffs of the sum
  // of magnitudes |alpha| |A||B| + |beta C| + |bias| (with tf32, the inputs' rounding,
  // 2^-9 of it, on top), times the activation's largest slope; plus the dtype's smallest
  // subnormal. A schedule that drops or repeats a k-block or a tile lands far outside it.
  void set_tolerances() {
    const auto f32 = opts_.dtype(at::kFloat);
    at::Tensor a =
        at::from_blob(const_cast<void*>(args_.a), {args_.m, args_.k},
                      {args_.a_stride_m, args_.a_stride_k}, opts_.dtype(torch_dtype(args_)));
    at::Tensor b =
        at::from_blob(const_cast<void*>(args_.b), {args_.k, args_.n},
                      {args_.b_stride_k, args_.b_stride_n}, opts_.dtype(torch_dtype(args_)));
    at::Tensor mag = at::mm(a.abs().to(f32), b.abs().to(f32)).mul_(std::fabs(args_.alpha));
    if (c0_ != nullptr) mag.add_(view(c0_, args_.ldc).abs().to(f32), std::fabs(args_.beta));
    const GemmEpilogue& e = args_.epilogue;
    if (e.bias != nullptr) {
      const int64_t len = e.bias_per_row ? args_.m : args_.n;
      at::Tensor bias =
          at::from_blob(const_cast<void*>(e.bias), {len}, opts_.dtype(torch_dtype(args_)))
              .abs()
              .to(f32);
      mag.add_(e.bias_per_row ? bias.view({args_.m, 1}) : bias.view({1, args_.n}));
    }
    const bool tf32 = args_.dtype == ScalarType::kFloat32 && args_.allow_tf32;
    const double unit = std::ldexp(1.0, -24);
    const double accum =
        8.0 * std::sqrt(static_cast<double>(std::max<int64_t>(args_.k, 1))) * unit +
        (tf32 ? std::ldexp(1.0, -9) : 0.0);
    const double ulp = args_.dtype == ScalarType::kBFloat16  ? std::ldexp(1.0, -7)
                       : args_.dtype == ScalarType::kFloat16 ? std::ldexp(1.0, -10)
                                                             : std::ldexp(1.0, -23);
    const double tiny = args_.dtype == ScalarType::kBFloat16  ? std::ldexp(1.0, -133)
                        : args_.dtype == ScalarType::kFloat16 ? std::ldexp(1.0, -24)
                                                              : std::ldexp(1.0, -149);
    const double slope = e.activation == Activation::kNone ? 1.0 : 1.25;
    tol_c_ =
        view(ref_.c, args_.ldc).to(f32).abs().mul_(2.0 * ulp).add_(mag, slope * accum).add_(tiny);
    if (p_span_ > 0) {
      tol_p_ = view(ref_.epilogue.preact, e.ld_preact)
                   .to(f32)
                   .abs()
                   .mul_(2.0 * ulp)
                   .add_(mag, accum)
                   .add_(tiny);
    }
  }

  bool close(const void* x_ptr, const void* d_ptr, int64_t ld, const at::Tensor& tol) const {
    at::Tensor x = view(x_ptr, ld).to(at::kFloat), d = view(d_ptr, ld).to(at::kFloat);
    at::Tensor ok =
        (x - d).abs_().le(tol).logical_or_(x.eq(d)).logical_or_(x.isnan().logical_and_(d.isnan()));
    return ok.all().item<bool>();
  }

  GemmArgs args_, ref_, cand_;
  at::TensorOptions opts_;
  cudaStream_t stream_;
  int64_t elt_ = 2, c_span_ = 0, p_span_ = 0, flush_bytes_ = 0;
  void* c0_ = nullptr;
  void* flush_ = nullptr;
  std::vector<at::Tensor> held_;
  at::Tensor tol_c_, tol_p_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

// Times the candidates, records the winner and what it cost; returns the winner. The
// caller's buffers are not touched (everything runs into scratch outputs).
Plan tune_problem(const GemmArgs& args, const at::Tensor& c, cudaStream_t stream,
                  const std::string& device, const std::string& problem, const Plan& def) {
  const auto t0 = std::chrono::steady_clock::now();
  // The verification's ATen ops compute in float32 on plain tensors, whatever autocast or
  // Python dispatch mode the caller runs under.
  const c10::impl::ExcludeDispatchKeyGuard plain(
      c10::autocast_dispatch_keyset |
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  ProblemStats ps;
  ps.device = device;
  ps.problem = problem;
  ps.winner = def;
  Bench bench(args, c, stream);
  if (bench.reference(def) != cudaSuccess) {
    (void)cudaGetLastError();
    count(&Stats::tuning_skipped);
    return def;
  }
  Entry best;
  best.plan = def;
  best.default_us = bench.time_us(def);
  best.tuned_us = best.default_us;
  ps.candidates = 1;
  ps.timed.emplace_back(def, best.default_us);
  for (const Plan& p : candidates(args, def)) {
    if (p == def) continue;
    if (!bench.run_once(p)) {
      ++ps.failed;
      continue;
    }
    if (!bench.matches()) {
      ++ps.rejected;
      continue;
    }
    ++ps.candidates;
    const double us = bench.time_us(p);
    ps.timed.emplace_back(p, us);
    if (us < best.tuned_us) {
      best.tuned_us = us;
      best.plan = p;
    }
  }
  if (!std::isfinite(best.default_us)) {
    count(&Stats::tuning_skipped);
    return def;
  }
  if (!(best.tuned_us < best.default_us * kWinMargin)) {
    best.plan = def;
    best.tuned_us = best.default_us;
  }
  ps.winner = best.plan;
  ps.tuned_us = best.tuned_us;
  ps.default_us = best.default_us;
  ps.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  record(device, problem, best, ps);
  return best.plan;
}

}  // namespace

cudaError_t run_auto(const char* op, const GemmArgs& args, const at::Tensor& c,
                     cudaStream_t stream) {
  const Plan def{gemm_pick(args)};
  const Mode m = mode();
  if (m == Mode::kOff || args.k == 0) return run_plan(args, def, c, stream);
  const int dev = c.get_device();
  const std::string& device = device_identity(dev);
  const std::string problem = problem_key(args);
  if (!knows_device(device)) {
    warn_once("gemmt: the tuning cache holds no entries measured on this GPU (" + device +
              "); its products run the default plans until tuned here");
  }
  auto cached = [&](cudaError_t* status) {
    std::optional<Entry> e = lookup(device, problem);
    if (!e) return false;
    if (!plan_supported(args, e->plan)) {
      warn_once("gemmt: the tuning cache's plan '" + e->plan.str() + "' for " + problem +
                " cannot run here; using the default plan");
      return false;
    }
    count(&Stats::cache_hits);
    *status = run_plan(args, e->plan, c, stream);
    return true;
  };
  cudaError_t status = cudaSuccess;
  if (cached(&status)) return status;
  if (m == Mode::kTune && !capturing(stream)) {
    std::lock_guard<std::mutex> one_at_a_time(device_timing_mutex(dev));
    if (cached(&status)) return status;  // another thread tuned it meanwhile
    Plan winner = def;
    try {
      winner = tune_problem(args, c, stream, device, problem, def);
    } catch (const c10::Error& err) {
      (void)cudaGetLastError();
      count(&Stats::tuning_skipped);
      warn_once(std::string(op) + ": tuning " + problem + " failed (" +
                err.what_without_backtrace() + "); using the default plan");
    }
    return run_plan(args, winner, c, stream);
  }
  count(m == Mode::kTune ? &Stats::capture_skips : &Stats::untuned_cached);
  return run_plan(args, def, c, stream);
}

}  // namespace gemmt::wrapper::tuning

#endif  // GEMMT_WITH_CUDA
