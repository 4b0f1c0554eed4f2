// gemm (in place) and mm (functional): validation, the CPU kernel, and CUDA dispatch.
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "gemm_launch.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemm_tuner.h"
#include "gemmt/gemm.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kGemm = "gemmt::gemm";
constexpr const char* kMm = "gemmt::mm";

// Shape, dtype and device checks of a @ b; symbolic sizes keep this usable from Meta.
void check_matmul_operands(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_dim(op, "a", a, 2);
  check_dim(op, "b", b, 2);
  check_dtype(op, "a", a, float_dtypes_for(a));
  check_same_dtype(op, "a", a, "b", b);
  check_same_device(op, "a", a, "b", b);
  TORCH_CHECK(a.sym_size(1) == b.sym_size(0), op,
              ": arguments 'a' and 'b' expected a.shape[1] == b.shape[0] (the inner dimension "
              "of a @ b), got ",
              describe(a), " and ", describe(b));
}

void check_gemm_operands(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_matmul_operands(kGemm, a, b);
  check_dim(kGemm, "c", c, 2);
  check_same_dtype(kGemm, "a", a, "c", c);
  check_same_device(kGemm, "a", a, "c", c);
  TORCH_CHECK(c.sym_size(0) == a.sym_size(0) && c.sym_size(1) == b.sym_size(1), kGemm,
              ": argument 'c' expected shape [", a.sym_size(0), ", ", b.sym_size(1),
              "] (a.shape[0], b.shape[1]), got ", describe(c));
}

// Byte range [first, last + 1) that a tensor's elements occupy in its storage.
std::pair<int64_t, int64_t> byte_span(const at::Tensor& t) {
  int64_t lo = t.storage_offset(), hi = lo;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t step = (t.size(d) - 1) * t.stride(d);
    (step < 0 ? lo : hi) += step;
  }
  return {lo * t.itemsize(), (hi + 1) * t.itemsize()};
}

// c is written while a and b are read, so they must not share memory. Exact overlap of two
// strided views is expensive to decide; views of one storage whose byte ranges intersect are
// refused (interleaved-but-disjoint views are rare and get a clear error).
void check_no_overlap(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(at::has_internal_overlap(c) != at::MemOverlap::Yes, kGemm,
              ": argument 'c' expected a tensor whose elements do not share memory, got ",
              describe(c), " with strides ", c.strides(), " (an expanded view?)");
  if (c.numel() == 0) return;
  const auto cs = byte_span(c);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor&>{"a", a}, {"b", b}}) {
    if (t.numel() == 0 || !c.storage().is_alias_of(t.storage())) continue;
    const auto ts = byte_span(t);
    TORCH_CHECK(cs.second <= ts.first || ts.second <= cs.first, kGemm,
                ": argument 'c' expected memory separate from argument '", name,
                "' (c is written "
                "while ",
                name, " is read), got views of one storage whose memory ranges overlap");
  }
}

GemmVariant parse_variant(std::string_view name) {
  GemmVariant v;
  if (gemm_variant_from_name(name, &v) && v != GemmVariant::kCount) return v;
  std::string all;
  for (const char* n : kGemmVariantNames) all += std::string(all.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, kGemm, ": argument 'variant' expected one of ", all, ", got '",
              std::string(name), "'");
}

// The reference CPU product (the loops the tests hold ATen's kernels to, and the CUDA
// epilogue's semantics: the activation reads the unrounded sum). Cache-blocked: each task owns one
// kMB x kNB tile of C, packs the A and B panels it needs into contiguous buffers (any input strides
// become unit-stride), and runs an i-p-j loop whose inner j loop the compiler vectorises.
template <typename scalar_t>
void gemm_cpu_kernel(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                     double beta, const EpilogueTensors& epi) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t kMB = 64, kNB = 256, kKB = 128;
  const int64_t M = a.size(0), N = b.size(1), K = a.size(1);
  const scalar_t* A = a.const_data_ptr<scalar_t>();
  const scalar_t* B = b.const_data_ptr<scalar_t>();
  scalar_t* C = c.mutable_data_ptr<scalar_t>();
  const int64_t sam = a.stride(0), sak = a.stride(1), sbk = b.stride(0), sbn = b.stride(1);
  const int64_t scm = c.stride(0), scn = c.stride(1);
  const acc_t alpha_v = static_cast<acc_t>(alpha), beta_v = static_cast<acc_t>(beta);
  const scalar_t* bias = epi.bias.defined() ? epi.bias.const_data_ptr<scalar_t>() : nullptr;
  const int64_t bias_stride = epi.bias.defined() ? epi.bias.stride(0) : 0;
  scalar_t* preact = epi.preact.defined() ? epi.preact.mutable_data_ptr<scalar_t>() : nullptr;
  const int64_t spm = preact ? epi.preact.stride(0) : 0, spn = preact ? epi.preact.stride(1) : 0;
  const Activation act = epi.activation;
  const int64_t m_blocks = (M + kMB - 1) / kMB, n_blocks = (N + kNB - 1) / kNB;

  at::parallel_for(0, m_blocks * n_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(kMB * kNB), a_pack(kMB * kKB), b_pack(kKB * kNB);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t i0 = (tile / n_blocks) * kMB, j0 = (tile % n_blocks) * kNB;
      const int64_t mb = std::min(kMB, M - i0), nb = std::min(kNB, N - j0);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t p0 = 0; p0 < K; p0 += kKB) {
        const int64_t kb = std::min(kKB, K - p0);
        for (int64_t i = 0; i < mb; ++i)
          for (int64_t p = 0; p < kb; ++p)
            a_pack[i * kKB + p] = static_cast<acc_t>(A[(i0 + i) * sam + (p0 + p) * sak]);
        for (int64_t p = 0; p < kb; ++p)
          for (int64_t j = 0; j < nb; ++j)
            b_pack[p * kNB + j] = static_cast<acc_t>(B[(p0 + p) * sbk + (j0 + j) * sbn]);
        for (int64_t i = 0; i < mb; ++i) {
          acc_t* acc_row = acc.data() + i * kNB;
          for (int64_t p = 0; p < kb; ++p) {
            const acc_t av = a_pack[i * kKB + p];
            const acc_t* b_row = b_pack.data() + p * kNB;
            for (int64_t j = 0; j < nb; ++j) acc_row[j] += av * b_row[j];
          }
        }
      }
      // beta == 0 must not read C: it may hold NaN, and 0 * NaN is NaN.
      for (int64_t i = 0; i < mb; ++i) {
        for (int64_t j = 0; j < nb; ++j) {
          scalar_t& out = C[(i0 + i) * scm + (j0 + j) * scn];
          acc_t v = alpha_v * acc[i * kNB + j];
          if (beta_v != acc_t(0)) v += beta_v * static_cast<acc_t>(out);
          if (bias) v += static_cast<acc_t>(bias[(j0 + j) * bias_stride]);
          if (preact) preact[(i0 + i) * spm + (j0 + j) * spn] = static_cast<scalar_t>(v);
          out = static_cast<scalar_t>(apply_activation(act, v));
        }
      }
    }
  });
}

#ifdef GEMMT_WITH_CUDA
bool allow_tf32() {
  auto& ctx = at::globalContext();
  return ctx.allowTF32CuBLAS() ||
         ctx.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
}

// Fills GemmArgs for C (m x n, row-major with leading dimension ldc) = A @ B, where the
// operands are given by pointer and strides. A stride of a size-1 dimension is never
// used, so it is set to the value that lets the kernels take their unit-stride paths.
GemmArgs make_args(int64_t m, int64_t n, int64_t k, const void* a, int64_t sam, int64_t sak,
                   const void* b, int64_t sbk, int64_t sbn, void* c, int64_t ldc) {
  GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a;
  args.a_stride_m = (m == 1) ? k : sam;
  args.a_stride_k = (k == 1) ? 1 : sak;
  args.b = b;
  args.b_stride_k = (k == 1) ? n : sbk;
  args.b_stride_n = (n == 1) ? 1 : sbn;
  args.c = c;
  args.ldc = ldc;
  return args;
}

// The kernel-level epilogue of a product written into C's memory as-is (transposed: the
// kernels see C^T, so the bias runs along their rows and preact is read transposed too).
GemmEpilogue kernel_epilogue(const EpilogueTensors& epi, bool transposed, int64_t rows) {
  GemmEpilogue e;
  e.activation = epi.activation;
  if (epi.bias.defined()) {
    TORCH_CHECK(epi.bias.is_contiguous(),
                "gemmt: internal error: the epilogue's bias must be "
                "contiguous, got strides ",
                epi.bias.strides());
    e.bias = epi.bias.const_data_ptr();
    e.bias_per_row = transposed;
  }
  if (epi.preact.defined()) {
    e.preact = epi.preact.data_ptr();
    const int64_t ld = transposed ? epi.preact.stride(1) : epi.preact.stride(0);
    e.ld_preact = rows == 1 ? std::max<int64_t>(ld, 1) : ld;
  }
  return e;
}

void launch_gemm(const char* op, GemmArgs args, const at::Tensor& c, GemmVariant variant) {
  const at::cuda::CUDAGuard guard(c.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  args.dtype = to_kernel_dtype(c.scalar_type());
  args.allow_tf32 = args.dtype == ScalarType::kFloat32 && allow_tf32();
  args.deterministic = at::globalContext().deterministicAlgorithms();
  args.sm_count = usable_sm_count(op);
  args.cc_major = prop->major;
  args.cc_minor = prop->minor;
  args.device = device_info(c.get_device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(c.get_device()).stream();
  if (variant == GemmVariant::kAuto && tuning::mode() != tuning::Mode::kOff) {
    check_launch(op, tuning::run_auto(op, args, c, stream));
    return;
  }
  if (variant == GemmVariant::kAuto) variant = gemm_pick(args);
  TORCH_CHECK(gemm_supports(args, variant), op, ": argument 'variant' = '",
              gemm_variant_name(variant), "' cannot run this problem (", args.m, "x", args.n, "x",
              args.k, " ", scalar_type_name(args.dtype), ", a strides [", args.a_stride_m, ", ",
              args.a_stride_k, "], b strides [", args.b_stride_k, ", ", args.b_stride_n, "], sm_",
              args.cc_major, args.cc_minor, args.epilogue.empty() ? "" : ", with an epilogue",
              "); use variant='auto'");
  const std::size_t ws_bytes = gemm_workspace_bytes(args, variant);
  at::Tensor workspace;
  if (ws_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(ws_bytes)}, c.options().dtype(at::kByte));
  }
  const cudaError_t status =
      gemm_run(args, variant, ws_bytes ? workspace.data_ptr() : nullptr, stream);
  check_launch(op, status);
}
#endif

}  // namespace

void gemm_cpu_reference_run(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                            double alpha, double beta, const EpilogueTensors& epilogue) {
  if (c.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "gemmt_gemm_cpu", [&] {
    gemm_cpu_kernel<scalar_t>(c, a, b, alpha, beta, epilogue);
  });
}

void gemm_cpu_run(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                  double beta) {
  if (c.numel() == 0) return;
  // ATen's own CPU GEMM (oneDNN or BLAS) writes straight into c, whatever its strides. The
  // product must not be recorded: the calling op is the one autograd sees.
  at::AutoDispatchBelowADInplaceOrView guard;
  if (beta == 0.0 && alpha == 1.0) {
    at::mm_out(const_cast<at::Tensor&>(c), a, b);
  } else {
    // addmm ignores its input when beta == 0 (NaN in c does not propagate), and at
    // K == 0 it zeroes or scales c without a product.
    at::addmm_out(const_cast<at::Tensor&>(c), c, a, b, beta, alpha);
  }
}

void gemm_meta(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double /*alpha*/,
               double /*beta*/, std::string_view variant) {
  check_gemm_operands(c, a, b);
  parse_variant(variant);
}

void gemm_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
              double beta, std::string_view variant) {
  check_gemm_operands(c, a, b);
  TORCH_CHECK(parse_variant(variant) == GemmVariant::kAuto, kGemm,
              ": argument 'variant' expected 'auto' for CPU tensors (the named variants are CUDA "
              "kernels), got '",
              std::string(variant), "'");
  check_no_overlap(c, a, b);
  gemm_cpu_run(c, a, b, alpha, beta);
}

at::Tensor mm_meta(const at::Tensor& a, const at::Tensor& b) {
  check_matmul_operands(kMm, a, b);
  return at::empty_symint({a.sym_size(0), b.sym_size(1)}, a.options());
}

at::Tensor mm_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_matmul_operands(kMm, a, b);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm_cpu_run(out, a, b, 1.0, 0.0);
  return out;
}

void gemm_cpu_reference(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                        double beta) {
  check_gemm_operands(c, a, b);
  check_cpu_reference(kGemm, c);
  check_no_overlap(c, a, b);
  gemm_cpu_reference_run(c, a, b, alpha, beta, EpilogueTensors{});
}

at::Tensor mm_cpu_reference(const at::Tensor& a, const at::Tensor& b) {
  check_matmul_operands(kMm, a, b);
  check_cpu_reference(kMm, a);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm_cpu_reference_run(out, a, b, 1.0, 0.0, EpilogueTensors{});
  return out;
}

#ifdef GEMMT_WITH_CUDA
void gemm_cuda_run(const char* op, const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                   double alpha, double beta, GemmVariant variant,
                   const EpilogueTensors& epilogue) {
  const int64_t M = a.size(0), N = b.size(1), K = a.size(1);
  if (M == 0 || N == 0) return;
  const bool c_row_major = (N == 1 || c.stride(1) == 1) && (M == 1 || c.stride(0) >= N);
  const bool c_col_major = (M == 1 || c.stride(0) == 1) && (N == 1 || c.stride(1) >= M);
  TORCH_CHECK(epilogue.empty() || c_row_major || c_col_major, op,
              ": internal error: an epilogue needs a row- or column-major output");
  if (c_row_major) {
    GemmArgs args =
        make_args(M, N, K, a.const_data_ptr(), a.stride(0), a.stride(1), b.const_data_ptr(),
                  b.stride(0), b.stride(1), c.data_ptr(), M == 1 ? N : c.stride(0));
    args.alpha = alpha;
    args.beta = beta;
    args.epilogue = kernel_epilogue(epilogue, false, M);
    launch_gemm(op, args, c, variant);
  } else if (c_col_major) {
    // C^T = B^T A^T is row-major in C's memory: swap the operands instead of copying C.
    GemmArgs args =
        make_args(N, M, K, b.const_data_ptr(), b.stride(1), b.stride(0), a.const_data_ptr(),
                  a.stride(1), a.stride(0), c.data_ptr(), N == 1 ? M : c.stride(1));
    args.alpha = alpha;
    args.beta = beta;
    args.epilogue = kernel_epilogue(epilogue, true, N);
    launch_gemm(op, args, c, variant);
  } else {
    // A C with no unit stride: compute into a row-major temporary and copy back.
    at::Tensor tmp = beta != 0.0 ? c.contiguous() : at::empty({M, N}, c.options());
    gemm_cuda_run(op, tmp, a, b, alpha, beta, variant, epilogue);
    c.copy_(tmp);
  }
}

void gemm_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
               double beta, std::string_view variant_name) {
  check_gemm_operands(c, a, b);
  const GemmVariant variant = parse_variant(variant_name);
  check_no_overlap(c, a, b);
  gemm_cuda_run(kGemm, c, a, b, alpha, beta, variant, EpilogueTensors{});
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_matmul_operands(kMm, a, b);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm_cuda_run(kMm, out, a, b, 1.0, 0.0, GemmVariant::kAuto, EpilogueTensors{});
  return out;
}
#endif

}  // namespace gemmt::wrapper
