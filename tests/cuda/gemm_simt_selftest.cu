// Standalone correctness check of the SIMT GEMM family (kernels/simt/).
//
// Runs every SIMT variant x dtype x operand layout x alpha/beta on awkward shapes against a
// double-precision CPU reference and prints one PASS / FAIL line per case; exits non-zero on
// any failure. C is poisoned with NaN when beta == 0 (the kernels must not read it), rows
// of C are padded (ldc > n) and the padding must come back untouched.
//
// Build (from the repository root):
//   nvcc -std=c++17 -O2 -Iinclude -gencode arch=compute_90,code=sm_90
//        tests/cuda/gemm_simt_selftest.cu build/<dir>/libgemmt_kernels.a
//        build/<dir>/libgemmt_plan.a -o gemm_simt_selftest
// Usage: gemm_simt_selftest [-q] [-bench] [-sweep] [-gemv-sweep] [-k-major-sweep]
//   -q      prints failures and the summary only
//   -bench  after the checks, times the pipelined / split-k / gemv kernels (float32)
//   -sweep  after the checks, times every tile configuration of the pipelined kernel
//   -gemv-sweep  after the checks, times the gemv kernel per warps-per-row on decode weights
//   -k-major-sweep  after the checks, times the ways of reading a K-major float32 B
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "gemmt/gemm.h"
#include "gemmt/gemm_simt.h"

using gemmt::GemmArgs;
using gemmt::GemmVariant;
using gemmt::ScalarType;

namespace {

using gemmt_bench::fill_random;
using gemmt_bench::median_ms;

#define CHECK_CUDA(expr)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                   __LINE__, cudaGetErrorString(e_));                                      \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// ---- host-side element encoding --------------------------------------------------------
uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_half_bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
float from_half_bits(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}

std::size_t esize(ScalarType t) {
  return t == ScalarType::kFloat32 ? 4 : 2;
}

// Rounds v to the dtype and returns the stored value as double.
double round_to(ScalarType t, double v) {
  const float f = static_cast<float>(v);
  switch (t) {
    case ScalarType::kFloat32:
      return f;
    case ScalarType::kFloat16:
      return from_half_bits(to_half_bits(f));
    default:
      return from_bf16_bits(to_bf16_bits(f));
  }
}

void put(ScalarType t, std::vector<unsigned char>& buf, int64_t idx, double v) {
  const float f = static_cast<float>(v);
  if (t == ScalarType::kFloat32) {
    std::memcpy(buf.data() + idx * 4, &f, 4);
  } else {
    const uint16_t b = t == ScalarType::kFloat16 ? to_half_bits(f) : to_bf16_bits(f);
    std::memcpy(buf.data() + idx * 2, &b, 2);
  }
}

double get(ScalarType t, const std::vector<unsigned char>& buf, int64_t idx) {
  if (t == ScalarType::kFloat32) {
    float f;
    std::memcpy(&f, buf.data() + idx * 4, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, buf.data() + idx * 2, 2);
  return t == ScalarType::kFloat16 ? from_half_bits(b) : from_bf16_bits(b);
}

void put_nan(ScalarType t, std::vector<unsigned char>& buf, int64_t idx) {
  if (t == ScalarType::kFloat32) {
    const uint32_t q = 0x7fc00000u;
    std::memcpy(buf.data() + idx * 4, &q, 4);
  } else {
    const uint16_t q = t == ScalarType::kFloat16 ? 0x7e00 : 0x7fc0;
    std::memcpy(buf.data() + idx * 2, &q, 2);
  }
}

const char* dtype_name(ScalarType t) {
  return t == ScalarType::kFloat32 ? "float32" : t == ScalarType::kFloat16 ? "float16" : "bfloat16";
}

const char* variant_name(GemmVariant v) {
  switch (v) {
    case GemmVariant::kNaive:
      return "naive";
    case GemmVariant::kSmemTiled:
      return "smem_tiled";
    case GemmVariant::kRegisterBlocked:
      return "register_blocked";
    case GemmVariant::kWarpTiled:
      return "warp_tiled";
    case GemmVariant::kPipelined:
      return "pipelined";
    case GemmVariant::kSplitK:
      return "split_k";
    case GemmVariant::kGemv:
      return "gemv";
    default:
      return "?";
  }
}

// ---- operand layouts ------------------------------------------------------------------
// A logical rows x cols matrix stored with strides (sr, sc) at element offset `off` of its
// buffer. Kinds: row-major, column-major, both strides non-unit, row-major shifted by one
// element (breaks 16-byte alignment), column-major shifted by one element.
enum class Layout { kRow, kCol, kStrided, kRowOff, kColOff };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kRow:
      return "row";
    case Layout::kCol:
      return "col";
    case Layout::kStrided:
      return "strided";
    case Layout::kRowOff:
      return "row+1";
    default:
      return "col+1";
  }
}

struct Stored {
  int64_t sr = 0, sc = 0, off = 0, elems = 0;
};

Stored make_layout(Layout l, int64_t rows, int64_t cols) {
  Stored s;
  switch (l) {
    case Layout::kRow:
      s.sr = cols;
      s.sc = 1;
      break;
    case Layout::kCol:
      s.sr = 1;
      s.sc = rows;
      break;
    case Layout::kStrided:
      s.sr = 2 * cols + 3;
      s.sc = 2;
      break;
    case Layout::kRowOff:
      s.sr = cols + 1;  // odd leading dimension as well
      s.sc = 1;
      s.off = 1;
      break;
    case Layout::kColOff:
      s.sr = 1;
      s.sc = rows + 1;
      s.off = 1;
      break;
  }
  s.elems = s.off + (rows - 1) * s.sr + (cols - 1) * s.sc + 1;
  return s;
}

struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 1)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

struct Shape {
  int64_t m, n, k;
};

struct Stats {
  int pass = 0, fail = 0;
};

bool g_quiet = false;
int g_sm_count = 1;
int g_cc_major = 0;
int g_interior_runs = 0;   // cases served by a whole-tiles (interior) pipelined instance
int g_streamk_runs = 0;    // cases whose last tiles ran as stream-k
int g_sweep_failures = 0;  // outputs of the timed sweeps that disagree with their reference

// One run of the pipelined kernel through the per-configuration hook: the tile shape, the
// stream-k policy and the SM count the planner sees (a small count makes stream-k runs span
// several tiles and leaves data-parallel tiles beside them).
struct HookRun {
  int cfg, stream_k, sm_count;
};

const char* const kKMajorWayNames[] = {"k-major-staged", "k-major-inplace", "k-major-swapped"};

// Reference C0 = A @ B in double (ab has m * n entries).
void reference(const std::vector<double>& A, const std::vector<double>& B, int64_t m, int64_t n,
               int64_t k, std::vector<double>& ab) {
  ab.assign(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double* row = ab.data() + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const double a = A[i * k + p];
      const double* brow = B.data() + p * n;
      for (int64_t j = 0; j < n; ++j) row[j] += a * brow[j];
    }
  }
}

void run_case(ScalarType dt, const Shape& s, const std::vector<double>& A,
              const std::vector<double>& B, const std::vector<double>& ab, Layout la, Layout lb,
              Stats& st) {
  const std::size_t es = esize(dt);
  const Stored sa = make_layout(la, s.m, s.k), sb = make_layout(lb, s.k, s.n);
  // Host images of A and B in their layouts (unused slots hold a large value so that a
  // kernel reading outside the logical matrix shows up as an error).
  std::vector<unsigned char> ha(static_cast<std::size_t>(std::max<int64_t>(sa.elems, 1)) * es);
  std::vector<unsigned char> hb(static_cast<std::size_t>(std::max<int64_t>(sb.elems, 1)) * es);
  for (int64_t i = 0; i < sa.elems; ++i) put(dt, ha, i, 1000.0);
  for (int64_t i = 0; i < sb.elems; ++i) put(dt, hb, i, 1000.0);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t p = 0; p < s.k; ++p) put(dt, ha, sa.off + i * sa.sr + p * sa.sc, A[i * s.k + p]);
  for (int64_t p = 0; p < s.k; ++p)
    for (int64_t j = 0; j < s.n; ++j) put(dt, hb, sb.off + p * sb.sr + j * sb.sc, B[p * s.n + j]);
  DeviceBuffer da(ha.size()), db(hb.size());
  CHECK_CUDA(cudaMemcpy(da.p, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, hb.data(), hb.size(), cudaMemcpyHostToDevice));

  // Padded rows, whose padding must survive. For even n a pitch of n + 4 lets the vector
  // stores run where n is a multiple of 4 too; odd n keeps the scalar stores covered.
  const int64_t ldc = s.n % 2 == 0 ? s.n + 4 : s.n + 3;
  const int64_t c_elems = (s.m - 1) * ldc + s.n + 3;
  std::vector<unsigned char> hc0(static_cast<std::size_t>(c_elems) * es), hc(hc0.size());
  std::vector<double> c0(static_cast<std::size_t>(s.m * s.n));
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  DeviceBuffer dc(hc0.size());

  const GemmVariant variants[] = {
      GemmVariant::kNaive,     GemmVariant::kSmemTiled, GemmVariant::kRegisterBlocked,
      GemmVariant::kWarpTiled, GemmVariant::kPipelined, GemmVariant::kSplitK,
      GemmVariant::kGemv};
  const float alphas[] = {1.0f, 0.75f};
  const float betas[] = {0.0f, -1.25f};
  for (int ab_i = 0; ab_i < 2; ++ab_i) {
    const float alpha = alphas[ab_i], beta = betas[ab_i];
    // C: NaN everywhere when beta == 0 (must not be read); random values otherwise. The
    // padding column(s) hold a sentinel in both cases.
    for (int64_t i = 0; i < c_elems; ++i) put(dt, hc0, i, 777.0);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        if (beta == 0.0f) {
          put_nan(dt, hc0, i * ldc + j);
          c0[i * s.n + j] = 0.0;
        } else {
          const double v = round_to(dt, uni(rng));
          put(dt, hc0, i * ldc + j, v);
          c0[i * s.n + j] = v;
        }
      }
    // Every variant, then (float32) every tile shape of the pipelined kernel on its own, so
    // that a shape the auto policy picks only for large problems is checked here too: as
    // planned, and with stream-k forced at the real SM count and at 3 SMs.
    const int num_variants = static_cast<int>(sizeof(variants) / sizeof(variants[0]));
    std::vector<HookRun> hook_runs;
    if (dt == ScalarType::kFloat32)
      for (int cfg = 0; cfg < gemmt::detail::gemm_simt_pipelined_config_count(); ++cfg)
        for (const HookRun r :
             {HookRun{cfg, -1, g_sm_count}, HookRun{cfg, 1, g_sm_count}, HookRun{cfg, 1, 3}})
          hook_runs.push_back(r);
    // Then (float32, K-major B) each way of reading B (gemm_simt_run_k_major_b: copied first,
    // in place, the product transposed), whatever the planner would pick.
    const int num_hooks = static_cast<int>(hook_runs.size());
    const int num_k_major = dt == ScalarType::kFloat32 ? 3 : 0;
    const int num_runs = num_variants + num_hooks + num_k_major;
    for (int run = 0; run < num_runs; ++run) {
      const GemmVariant v = run < num_variants ? variants[run] : GemmVariant::kPipelined;
      const int k_major_way = run >= num_variants + num_hooks ? run - num_variants - num_hooks : -1;
      const bool hook = run >= num_variants && k_major_way < 0;
      const HookRun hr = hook ? hook_runs[run - num_variants] : HookRun{-1, -1, g_sm_count};
      GemmArgs args;
      args.m = s.m;
      args.n = s.n;
      args.k = s.k;
      args.a = static_cast<unsigned char*>(da.p) + sa.off * es;
      args.a_stride_m = sa.sr;
      args.a_stride_k = sa.sc;
      args.b = static_cast<unsigned char*>(db.p) + sb.off * es;
      args.b_stride_k = sb.sr;
      args.b_stride_n = sb.sc;
      args.c = dc.p;
      args.ldc = ldc;
      args.alpha = alpha;
      args.beta = beta;
      args.dtype = dt;
      args.sm_count = hr.sm_count;
      args.cc_major = g_cc_major;
      if (!gemmt::gemm_simt_supports(args, v)) continue;
      if (hook && s.k == 0) continue;  // the shape hook takes k >= 1; k == 0 is covered above
      const gemmt::SimtPlan plan =
          k_major_way >= 0 ? gemmt::detail::gemm_simt_plan_k_major_b(args, k_major_way)
          : hook ? gemmt::detail::gemm_simt_plan_pipelined_config(args, hr.cfg, true, hr.stream_k)
                 : gemmt::gemm_simt_plan(args, v);
      if (k_major_way >= 0 && plan.block_m == 0) continue;  // B not K-major (or not copyable)
      // A forced run that cannot use stream-k repeats the planned run: skip it.
      if (hook && hr.stream_k > 0 && plan.stream_k_blocks == 0) continue;
      DeviceBuffer ws(plan.workspace_bytes);
      CHECK_CUDA(cudaMemcpy(dc.p, hc0.data(), hc0.size(), cudaMemcpyHostToDevice));
      cudaError_t launch;
      if (k_major_way >= 0) {
        launch = gemmt::detail::gemm_simt_run_k_major_b(args, k_major_way, ws.p, 0);
      } else if (hook) {
        launch =
            gemmt::detail::gemm_simt_run_pipelined_config(args, hr.cfg, ws.p, 0, true, hr.stream_k);
      } else {
        launch = gemmt::gemm_simt_run(args, v, ws.p, 0);
      }
      const cudaError_t sync = cudaDeviceSynchronize();
      char sk[48] = "";
      if (plan.stream_k_blocks > 0)
        std::snprintf(sk, sizeof(sk), " stream-k=%d/%d sms=%d", plan.stream_k_tiles,
                      plan.stream_k_blocks, hr.sm_count);
      char what[320];
      std::snprintf(what, sizeof(what),
                    "%-16s %-8s A=%-7s B=%-7s m=%-5lld n=%-5lld k=%-6lld alpha=%.2f beta=%.2f "
                    "tile=%dx%d%s splits=%d%s",
                    k_major_way >= 0 ? kKMajorWayNames[k_major_way]
                    : hook           ? "pipelined-shape"
                                     : variant_name(v),
                    dtype_name(dt), layout_name(la), layout_name(lb), static_cast<long long>(s.m),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), alpha, beta,
                    plan.block_m, plan.block_n, plan.interior ? " interior" : "", plan.splits, sk);
      if (plan.interior) ++g_interior_runs;
      if (plan.stream_k_blocks > 0) ++g_streamk_runs;
      if (launch != cudaSuccess || sync != cudaSuccess) {
        std::printf("FAIL %s: launch=%s sync=%s\n", what, cudaGetErrorName(launch),
                    cudaGetErrorName(sync));
        ++st.fail;
        if (sync != cudaSuccess) std::exit(3);  // the context is unusable after a fault
        continue;
      }
      CHECK_CUDA(cudaMemcpy(hc.data(), dc.p, hc.size(), cudaMemcpyDeviceToHost));
      double err2 = 0.0, ref2 = 0.0;
      bool pad_ok = true, finite = true;
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          const double ref = alpha * ab[i * s.n + j] + beta * c0[i * s.n + j];
          const double got = get(dt, hc, i * ldc + j);
          if (!std::isfinite(got)) finite = false;
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
        }
        if (i + 1 < s.m)
          for (int64_t j = s.n; j < ldc; ++j)
            if (get(dt, hc, i * ldc + j) != round_to(dt, 777.0)) pad_ok = false;
      }
      for (int64_t j = (s.m - 1) * ldc + s.n; j < c_elems; ++j)
        if (get(dt, hc, j) != round_to(dt, 777.0)) pad_ok = false;
      const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
      const double tol = dt == ScalarType::kFloat32 ? 1e-5 : 1e-2;
      const bool ok = finite && pad_ok && rel <= tol;
      if (ok) {
        ++st.pass;
        if (!g_quiet) std::printf("PASS %s rel=%.2e\n", what, rel);
      } else {
        ++st.fail;
        std::printf("FAIL %s rel=%.2e%s%s\n", what, rel, finite ? "" : " non-finite",
                    pad_ok ? "" : " padding-overwritten");
      }
    }
  }
}

struct BenchProblem {
  DeviceBuffer da, db, dc;
  GemmArgs args;
  BenchProblem(int64_t m, int64_t n, int64_t k, bool a_trans)
      : da(static_cast<std::size_t>(m * k) * 4),
        db(static_cast<std::size_t>(k * n) * 4),
        dc(static_cast<std::size_t>(m * n) * 4) {
    fill_random<<<1024, 256>>>(static_cast<float*>(da.p), m * k, 1u);
    fill_random<<<1024, 256>>>(static_cast<float*>(db.p), k * n, 2u);
    CHECK_CUDA(cudaGetLastError());
    args.m = m;
    args.n = n;
    args.k = k;
    args.a = da.p;
    args.a_stride_m = a_trans ? 1 : k;
    args.a_stride_k = a_trans ? m : 1;
    args.b = db.p;
    args.b_stride_k = n;
    args.b_stride_n = 1;
    args.c = dc.p;
    args.ldc = n;
    args.sm_count = g_sm_count;
  }
};

// Times one float32 problem (row-major operands) and prints TFLOP/s (GB/s for gemv).
void bench(GemmVariant v, int64_t m, int64_t n, int64_t k) {
  BenchProblem pb(m, n, k, false);
  const GemmArgs& args = pb.args;
  const gemmt::SimtPlan plan = gemmt::gemm_simt_plan(args, v);
  DeviceBuffer ws(plan.workspace_bytes);
  const double ms = median_ms([&] { return gemmt::gemm_simt_run(args, v, ws.p, 0); }, 20);
  const double sec = ms / 1e3;
  const double tflops = 2.0 * m * n * k / sec / 1e12;
  const double gbs = 4.0 * (m * k + k * n + m * n) / sec / 1e9;
  std::printf(
      "BENCH %-10s float32 %6lldx%6lldx%6lld tile=%dx%dx%d splits=%-3d sk=%d/%-3d %8.3f ms "
      "%7.2f TFLOP/s %7.1f GB/s\n",
      variant_name(v), static_cast<long long>(m), static_cast<long long>(n),
      static_cast<long long>(k), plan.block_m, plan.block_n, plan.block_k, plan.splits,
      plan.stream_k_tiles, plan.stream_k_blocks, ms, tflops, gbs);
}

// Times every tile configuration of the pipelined kernel (auto candidates and the float32
// ones under evaluation) on one problem; where a shape tiles the problem exactly, both its
// interior instance ("interior") and its general one ("general"); each data-parallel only
// ("dp") and, where the shape has a stream-k kernel, with the last wave as stream-k ("sk",
// forced) and as planned ("auto", printed when the planner's choice differs from both).
void sweep(int64_t m, int64_t n, int64_t k, bool a_trans) {
  BenchProblem pb(m, n, k, a_trans);
  for (int cfg = 0; cfg < gemmt::detail::gemm_simt_pipelined_config_count(); ++cfg) {
    for (const bool allow_interior : {true, false}) {
      const gemmt::SimtPlan dp =
          gemmt::detail::gemm_simt_plan_pipelined_config(pb.args, cfg, allow_interior, 0);
      if (dp.block_m == 0) break;
      for (const int stream_k : {0, 1}) {
        const gemmt::SimtPlan plan =
            gemmt::detail::gemm_simt_plan_pipelined_config(pb.args, cfg, allow_interior, stream_k);
        if (stream_k > 0 && plan.stream_k_blocks == 0) continue;
        DeviceBuffer ws(plan.workspace_bytes);
        const double ms = median_ms(
            [&] {
              return gemmt::detail::gemm_simt_run_pipelined_config(pb.args, cfg, ws.p, 0,
                                                                   allow_interior, stream_k);
            },
            m * n * k >= (int64_t{1} << 36) ? 10 : 30);
        const gemmt::SimtPlan chosen =
            gemmt::detail::gemm_simt_plan_pipelined_config(pb.args, cfg, allow_interior, -1);
        std::printf(
            "SWEEP cfg=%d %s %6lldx%6lldx%6lld tile=%dx%dx%d stages=%d threads=%d %-8s %-2s "
            "sk=%d/%d%s %8.3f ms %7.2f TFLOP/s\n",
            cfg, a_trans ? "tn" : "nn", static_cast<long long>(m), static_cast<long long>(n),
            static_cast<long long>(k), plan.block_m, plan.block_n, plan.block_k, plan.stages,
            plan.threads, plan.interior ? "interior" : "general", stream_k ? "sk" : "dp",
            plan.stream_k_tiles, plan.stream_k_blocks,
            chosen.stream_k_blocks == plan.stream_k_blocks ? " planned" : "", ms,
            2.0 * m * n * k / ms / 1e9);
      }
      if (!dp.interior) break;  // no interior instance: the general one was just timed
    }
  }
}

// The median of 5 rounds of time_way(w) for each of `ways` configurations, run in rotating
// order so that no configuration always runs first (a fixed order drifts: the first one of a
// sweep ran up to 30% slower).
template <class F>
std::vector<double> rotating_medians(int ways, F&& time_way) {
  constexpr int kRounds = 5;
  std::vector<std::vector<double>> ms(static_cast<std::size_t>(ways));
  for (int r = 0; r < kRounds; ++r)
    for (int j = 0; j < ways; ++j) {
      const int w = (j + r) % ways;
      ms[static_cast<std::size_t>(w)].push_back(time_way(w));
    }
  std::vector<double> med;
  for (std::vector<double>& v : ms) {
    std::sort(v.begin(), v.end());
    med.push_back(v[kRounds / 2]);
  }
  return med;
}

// One-token decode (bf16 x @ W^T, W of n x k) on the gemv kernel, W rotated through copies
// that together exceed 150 MB (three times an H100's L2) so that every call reads it from
// DRAM. First each count of warps per row ("auto": the planner's); then, where the planner
// prefetches, its L2 prefetch at several distances against none, in rotating rounds so that
// no configuration always runs first. One GEMVSWEEP / GEMVPREFETCH line per configuration.
void gemv_sweep() {
  struct Weight {
    int64_t k, n;
  };
  const Weight weights[] = {
      {4096, 11008}, {11008, 4096},  {4096, 14336},  {14336, 4096}, {8192, 28672}, {28672, 8192},
      {4096, 32000}, {4096, 128256}, {3584, 18944},  {18944, 3584}, {5120, 13824}, {13824, 5120},
      {4096, 4096},  {8192, 8192},   {3584, 152064}, {5120, 32000}, {2048, 8192},  {8192, 2048},
      {6144, 16384}, {7168, 18432},  {2048, 5632},   {1024, 4096},  {2560, 6912},  {12288, 3072}};
  std::printf("\nGemv sweep (bf16, m = 1, W from DRAM, median of 20):\n");
  for (const Weight& w : weights) {
    const std::size_t w_bytes = static_cast<std::size_t>(w.k * w.n) * 2;
    const int copies =
        static_cast<int>(std::max<std::size_t>(2, (std::size_t{150} << 20) / w_bytes + 1));
    std::vector<DeviceBuffer> dw(static_cast<std::size_t>(copies));
    for (int i = 0; i < copies; ++i) {
      CHECK_CUDA(cudaMalloc(&dw[i].p, w_bytes));
      gemmt_bench::fill_random_as<__nv_bfloat16>
          <<<1024, 256>>>(static_cast<__nv_bfloat16*>(dw[i].p), w.k * w.n, 7u + i);
    }
    DeviceBuffer dx(static_cast<std::size_t>(w.k) * 2), dc(static_cast<std::size_t>(w.n) * 2);
    gemmt_bench::fill_random_as<__nv_bfloat16>
        <<<64, 256>>>(static_cast<__nv_bfloat16*>(dx.p), w.k, 3u);
    CHECK_CUDA(cudaGetLastError());
    GemmArgs args;
    args.dtype = ScalarType::kBFloat16;
    args.m = 1;
    args.n = w.n;
    args.k = w.k;
    args.a = dx.p;
    args.a_stride_m = w.k;
    args.a_stride_k = 1;
    args.b = dw[0].p;
    args.b_stride_k = 1;  // W^T: B's column j is W's row j
    args.b_stride_n = w.k;
    args.c = dc.p;
    args.ldc = w.n;
    args.sm_count = g_sm_count;
    args.cc_major = g_cc_major;
    int next = 0;
    auto time_gemv = [&](int wpr, int64_t prefetch, DeviceBuffer& ws) {
      return median_ms(
          [&] {
            GemmArgs a = args;
            a.b = dw[next].p;
            next = (next + 1) % copies;
            return gemmt::detail::gemm_simt_run_gemv(a, wpr, ws.p, 0, prefetch);
          },
          20);
    };
    for (const int wpr : {0, 1, 2, 4, 8}) {
      const gemmt::SimtPlan plan = gemmt::detail::gemm_simt_plan_gemv(args, wpr);
      DeviceBuffer ws(plan.workspace_bytes);
      const double ms = time_gemv(wpr, -1, ws);
      std::printf("GEMVSWEEP k=%6lld n=%6lld wpr=%-4s splits=%d %9.2f us %6.0f GB/s\n",
                  static_cast<long long>(w.k), static_cast<long long>(w.n),
                  wpr == 0 ? "auto" : std::to_string(wpr).c_str(), plan.splits, ms * 1e3,
                  static_cast<double>(w_bytes) / (ms * 1e-3) / 1e9);
      std::fflush(stdout);
    }
    const gemmt::SimtPlan plan = gemmt::detail::gemm_simt_plan_gemv(args, 0);
    DeviceBuffer ws(plan.workspace_bytes);
    const int64_t leads[] = {0, 4 * int64_t{g_sm_count}, 8 * int64_t{g_sm_count},
                             16 * int64_t{g_sm_count}};
    constexpr int kLeads = 4;
    const std::vector<double> meds =
        rotating_medians(kLeads, [&](int i) { return time_gemv(0, leads[i], ws); });
    for (int i = 0; i < kLeads; ++i) {
      const double med = meds[static_cast<std::size_t>(i)];
      std::printf("GEMVPREFETCH k=%6lld n=%6lld lead=%5lld blocks %9.2f us %6.0f GB/s\n",
                  static_cast<long long>(w.k), static_cast<long long>(w.n),
                  static_cast<long long>(leads[i]), med * 1e3,
                  static_cast<double>(w_bytes) / (med * 1e-3) / 1e9);
    }
    std::fflush(stdout);
  }
}

// p[r * cols + c] = uniform_hash(c * rows + r, seed): the transpose of fill_random's matrix.
__global__ void fill_random_transposed(float* p, int64_t rows, int64_t cols, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = gemmt_bench::uniform_hash((i % cols) * rows + i / cols, seed);
  }
}

// The Linear forward in float32 (x @ W^T: A row-major, B = W^T K-major) read each way
// (gemm_simt_run_k_major_b: 0 "staged", 1 "in_place", 2 "swapped"), the planner's choice
// ("auto") and, as the ceiling, the same product on an N-major copy of W ("n_major"), in 5
// rotating rounds so that no way always runs first. One KMAJOR line per way with its median and
// the ratio to n_major; the outputs of every other way are compared with n_major's first.
void k_major_sweep() {
  struct Problem {
    int64_t m, n, k;
  };
  // The planner's rule (kernels/plan/simt_plan.h, stages_b) was fitted on the 4096 x 11008,
  // 28672 x 8192, 32000 x 4096 and 4096^2 weights (and their transposes) at m = 512-2048; the
  // rest check it on weights and token counts it was not fitted on.
  std::vector<Problem> problems;
  for (const int64_t m : {512, 1024, 2048})
    for (const auto& nk : {std::pair<int64_t, int64_t>{11008, 4096},
                           {4096, 11008},
                           {28672, 8192},
                           {8192, 28672},
                           {32000, 4096},
                           {4096, 4096}})
      problems.push_back({m, nk.first, nk.second});
  for (const Problem& p :
       {Problem{896, 4096, 14336}, Problem{1024, 13824, 5120}, Problem{1024, 5120, 13824},
        Problem{1152, 18944, 3584}, Problem{1280, 3584, 18944}, Problem{1792, 8192, 8192},
        Problem{1280, 8192, 2048}, Problem{1152, 16384, 4096}, Problem{1536, 6144, 16384},
        Problem{1792, 2048, 8192}, Problem{1024, 14336, 4096}, Problem{1536, 18432, 7168},
        Problem{2048, 4096, 14336}, Problem{1000, 1000, 1000}})
    problems.push_back(p);
  std::printf("\nK-major B sweep (float32 x @ W^T, median per round, 5 rounds):\n");
  const char* names[] = {"staged", "in_place", "swapped", "auto", "n_major"};
  constexpr int kHooks = 3, kAuto = 3, kWays = 5, kNMajor = 4;
  for (const Problem& pr : problems) {
    const int64_t m = pr.m, n = pr.n, k = pr.k;
    DeviceBuffer da(static_cast<std::size_t>(m * k) * 4), dw(static_cast<std::size_t>(n * k) * 4),
        dwt(static_cast<std::size_t>(n * k) * 4), dc(static_cast<std::size_t>(m * n) * 4),
        dref(static_cast<std::size_t>(m * n) * 4);
    fill_random<<<1024, 256>>>(static_cast<float*>(da.p), m * k, 1u);
    fill_random<<<1024, 256>>>(static_cast<float*>(dw.p), n * k, 2u);
    fill_random_transposed<<<1024, 256>>>(static_cast<float*>(dwt.p), k, n, 2u);
    CHECK_CUDA(cudaGetLastError());
    GemmArgs args;
    args.m = m;
    args.n = n;
    args.k = k;
    args.a = da.p;
    args.a_stride_m = k;
    args.a_stride_k = 1;
    args.b = dw.p;
    args.b_stride_k = 1;
    args.b_stride_n = k;
    args.c = dc.p;
    args.ldc = n;
    args.sm_count = g_sm_count;
    GemmArgs nmajor = args;
    nmajor.b = dwt.p;
    nmajor.b_stride_k = n;
    nmajor.b_stride_n = 1;
    auto plan_of = [&](int way) {
      return way < kHooks
                 ? gemmt::detail::gemm_simt_plan_k_major_b(args, way)
                 : gemmt::gemm_simt_plan(way == kAuto ? args : nmajor, GemmVariant::kPipelined);
    };
    std::size_t ws_bytes = 0;
    for (int w = 0; w < kWays; ++w) ws_bytes = std::max(ws_bytes, plan_of(w).workspace_bytes);
    DeviceBuffer ws(ws_bytes);
    auto run = [&](int way) {
      if (way < kHooks) return gemmt::detail::gemm_simt_run_k_major_b(args, way, ws.p, 0);
      return gemmt::gemm_simt_run(way == kAuto ? args : nmajor, GemmVariant::kPipelined, ws.p, 0);
    };
    {
      GemmArgs r = nmajor;
      r.c = dref.p;
      CHECK_CUDA(gemmt::gemm_simt_run(r, GemmVariant::kPipelined, ws.p, 0));
      std::vector<float> ref(static_cast<std::size_t>(m * n)), got(ref.size());
      CHECK_CUDA(cudaMemcpy(ref.data(), dref.p, ref.size() * 4, cudaMemcpyDeviceToHost));
      for (int way = 0; way < kNMajor; ++way) {
        CHECK_CUDA(cudaMemset(dc.p, 0xff, got.size() * 4));  // NaN
        CHECK_CUDA(run(way));
        CHECK_CUDA(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));
        double max_ref = 0, max_diff = 0;
        bool finite = true;
        for (std::size_t i = 0; i < ref.size(); ++i) {
          finite = finite && std::isfinite(got[i]);
          max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
          max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
        }
        const bool ok = finite && max_diff <= 1e-5 * max_ref;
        if (!ok) ++g_sweep_failures;
        if (!ok || !g_quiet)
          std::printf("%s KMAJOR %lldx%lldx%lld %s against n_major: max diff %.2e of %.2e\n",
                      ok ? "PASS" : "FAIL", static_cast<long long>(m), static_cast<long long>(n),
                      static_cast<long long>(k), names[way], max_diff, max_ref);
      }
    }
    const int reps = m * n * k >= (int64_t{1} << 37) ? 5 : 15;
    const std::vector<double> med =
        rotating_medians(kWays, [&](int w) { return median_ms([&] { return run(w); }, reps); });
    for (int w = 0; w < kWays; ++w) {
      const gemmt::SimtPlan pl = plan_of(w);
      std::printf(
          "KMAJOR %6lldx%6lldx%6lld %-8s tile=%dx%d interior=%d sk=%d %9.3f ms %6.2f TFLOP/s "
          "%.3f of n_major\n",
          static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), names[w],
          pl.block_m, pl.block_n, pl.interior ? 1 : 0, pl.stream_k_blocks, med[w],
          2.0 * m * n * k / med[w] / 1e9, med[kNMajor] / med[w]);
    }
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool do_bench = false, do_sweep = false, do_gemv_sweep = false, do_k_major_sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-q") == 0) g_quiet = true;
    if (std::strcmp(argv[i], "-bench") == 0) do_bench = true;
    if (std::strcmp(argv[i], "-sweep") == 0) do_sweep = true;
    if (std::strcmp(argv[i], "-gemv-sweep") == 0) do_gemv_sweep = true;
    if (std::strcmp(argv[i], "-k-major-sweep") == 0) do_k_major_sweep = true;
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  g_sm_count = prop.multiProcessorCount;
  g_cc_major = prop.major;
  std::printf("device %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);

  const Shape shapes[] = {
      {1, 1, 1},
      {7, 7, 7},
      {33, 33, 33},
      {1, 1, 1000},
      {1, 257, 127},
      {257, 1, 129},
      {33, 1, 7},
      {1, 7, 33},
      {127, 129, 257},
      {129, 127, 33},
      {257, 257, 1},
      {7, 257, 129},
      {257, 7, 129},
      {100, 70, 5000},
      {4, 1, 200000},
      {1, 300, 100000},
      // 16-bit matrices over 40 MiB in more row-dot gemv blocks than the L2 prefetch's lead
      // (8 x 132 on an H100): the last blocks' rows are prefetched, up to the partial last one.
      {1, 45001, 512},
      {24001, 1, 1024},
      {200, 136, 264},
      {72, 520, 48},
      {1000, 1000, 1000},
      {256, 256, 8192},
      // Whole tiles of the 128x256 and 64x128 shapes: their interior instances (fewer
      // k-tiles than pipeline stages in the first).
      {128, 256, 16},
      {256, 512, 48},
      {9, 11, 0},
      // m >= 2048: a K-major B is first copied N-major (with split-k in the second).
      {2050, 36, 77},
      {2304, 40, 4100},
  };
  const ScalarType dtypes[] = {ScalarType::kFloat32, ScalarType::kFloat16, ScalarType::kBFloat16};
  const std::pair<Layout, Layout> layouts[] = {
      {Layout::kRow, Layout::kRow},        {Layout::kRow, Layout::kCol},
      {Layout::kCol, Layout::kRow},        {Layout::kCol, Layout::kCol},
      {Layout::kStrided, Layout::kRowOff}, {Layout::kRowOff, Layout::kStrided},
      {Layout::kColOff, Layout::kColOff},
  };

  Stats st;
  for (const Shape& s : shapes) {
    for (ScalarType dt : dtypes) {
      std::mt19937 rng(static_cast<unsigned>(s.m * 131 + s.n * 17 + s.k));
      std::uniform_real_distribution<double> uni(-1.0, 1.0);
      std::vector<double> A(static_cast<std::size_t>(s.m * s.k)),
          B(static_cast<std::size_t>(s.k * s.n));
      for (double& x : A) x = round_to(dt, uni(rng));
      for (double& x : B) x = round_to(dt, uni(rng));
      std::vector<double> ab;
      reference(A, B, s.m, s.n, s.k, ab);
      for (const auto& lay : layouts) run_case(dt, s, A, B, ab, lay.first, lay.second, st);
    }
  }
  // The whole-tiles shapes above must have reached the interior instances (auto, split-k and
  // the per-shape runs), or those instances went untested.
  if (g_interior_runs == 0) {
    std::printf("FAIL no case ran an interior pipelined instance\n");
    ++st.fail;
  } else {
    std::printf("interior pipelined instances ran in %d cases\n", g_interior_runs);
  }
  if (g_streamk_runs == 0) {
    std::printf("FAIL no case ran the stream-k kernel\n");
    ++st.fail;
  } else {
    std::printf("stream-k runs: %d cases\n", g_streamk_runs);
  }
  std::printf("%s: %d passed, %d failed\n", st.fail ? "FAILED" : "ALL PASSED", st.pass, st.fail);
  if (do_bench) {
    bench(GemmVariant::kPipelined, 4096, 4096, 4096);
    bench(GemmVariant::kPipelined, 8192, 8192, 8192);
    bench(GemmVariant::kPipelined, 2048, 2048, 2048);
    bench(GemmVariant::kPipelined, 1024, 1024, 1024);
    bench(GemmVariant::kPipelined, 4096, 1024, 4096);
    bench(GemmVariant::kPipelined, 256, 256, 65536);
    bench(GemmVariant::kSplitK, 256, 256, 65536);
    bench(GemmVariant::kSplitK, 8192, 64, 8192);
    bench(GemmVariant::kPipelined, 1000, 1000, 1000);
    bench(GemmVariant::kSplitK, 1000, 1000, 1000);
    bench(GemmVariant::kPipelined, 4097, 4097, 4097);
    bench(GemmVariant::kWarpTiled, 4096, 4096, 4096);
    bench(GemmVariant::kGemv, 1, 8192, 8192);
    bench(GemmVariant::kGemv, 8192, 1, 8192);
  }
  if (do_gemv_sweep) gemv_sweep();
  if (do_k_major_sweep) k_major_sweep();
  if (do_sweep) {
    for (int64_t s : {1024, 2048, 4096, 6144, 8192}) sweep(s, s, s, false);
    sweep(4096, 4096, 4096, true);
    sweep(4097, 4097, 4097, false);
    sweep(8192, 64, 8192, false);
    sweep(127, 8192, 511, false);
  }
  return st.fail || g_sweep_failures ? 1 : 0;
}
