// The tensors of gemmt::grouped_mm, gemmt::scaled_grouped_mm and gemmt::scaled_mm as the Hopper
// grouped / scaled GEMM takes them: strides, offsets and scales passed as they are (the offsets
// never leave the GPU), operands copied only when no layout of the kernel can read them.
// scaled_mm's decode-sized products go to their own kernel first (fp8_decode_cuda.cpp).
#include "grouped_gemm_cuda.h"

#ifdef GEMMT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include <limits>
#include <vector>

#include "common.h"
#include "common/gemm_tc_kind.h"
#include "fp8_decode_cuda.h"
#include "gemmt/grouped_gemm.h"

namespace gemmt::wrapper {
namespace {

void check_hopper(const char* op, const at::Tensor& t) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(t.get_device());
  TORCH_CHECK(prop->major == 9, op,
              ": the CUDA kernel needs a Hopper GPU (compute capability 9.0: wgmma, TMA and the "
              "FP8 tensor cores); got ",
              prop->name, " (compute capability ", prop->major, ".", prop->minor, ")");
}

// The group count as the kernel's int; a batch of stride-0 operands can hold more.
int group_count(const char* op, int64_t groups) {
  TORCH_CHECK(groups <= std::numeric_limits<int>::max(), op,
              ": expected at most 2^31 - 1 groups, got ", groups);
  return static_cast<int>(groups);
}

OutKind out_kind(at::ScalarType t) {
  return t == at::kBFloat16 ? OutKind::kBF16 : t == at::kHalf ? OutKind::kF16 : OutKind::kF32;
}

void run(const char* op, GroupedGemmArgs& x, const at::Tensor& like) {
  const char* why = nullptr;
  TORCH_CHECK(grouped_gemm_sm90_supported(x, &why), op,
              ": the Hopper kernel cannot take these operands: ", why);
  x.sm_count = usable_sm_count(op);
  // Scratch the plan asks for (float32 partial sums of k-slices), from the caching allocator
  // on the current stream.
  at::Tensor workspace;
  if (const std::size_t bytes = grouped_gemm_sm90_workspace_bytes(x)) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    x.workspace = workspace.data_ptr();
    x.workspace_bytes = bytes;
  }
  const char* step = "";
  const cudaError_t status = grouped_gemm_sm90(x, stream_for(like), &step);
  if (status != cudaSuccess) (void)cudaGetLastError();  // not left for a later check to find
  TORCH_CHECK(status == cudaSuccess, op, ": the Hopper grouped GEMM failed at ", step, " (",
              launch_status_text(status), "); m=", x.m, " n=", x.n, " k=", x.k,
              " groups=", x.groups, " split=", static_cast<int>(x.split), " a strides (", x.a_sg,
              ", ", x.a_sm, ", ", x.a_sk, ") b strides (", x.b_sg, ", ", x.b_sk, ", ", x.b_sn, ")");
}

// a's strides as (g, rows, k) and b's as (g, k, cols), for 2-D and 3-D operands.
void set_operands(GroupedGemmArgs& x, const at::Tensor& a, const at::Tensor& b) {
  const bool a3 = a.dim() == 3, b3 = b.dim() == 3;
  x.a = a.const_data_ptr();
  x.a_sg = a3 ? a.stride(0) : 0;
  x.a_sm = a.stride(a3 ? 1 : 0);
  x.a_sk = a.stride(a3 ? 2 : 1);
  x.b = b.const_data_ptr();
  x.b_sg = b3 ? b.stride(0) : 0;
  x.b_sk = b.stride(b3 ? 1 : 0);
  x.b_sn = b.stride(b3 ? 2 : 1);
}

// A copy of t with its last dimension contiguous and each row padded to a multiple of 16 bytes
// (the tensor maps' stride rule), viewed at t's sizes.
at::Tensor padded_rows(const at::Tensor& t) {
  const int64_t elt = t.element_size();
  const int64_t cols = t.size(-1);
  const int64_t ld = (cols * elt + 15) / 16 * 16 / elt;
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes.back() = ld;
  at::Tensor view = at::empty(sizes, t.options()).narrow(-1, 0, cols);
  view.copy_(t);
  return view;
}

// The (groups, N) bias in C's type, contiguous, as x's bias rows (undefined without one); the
// caller keeps the returned tensor alive while the kernel runs.
at::Tensor set_group_bias(GroupedGemmArgs& x, const std::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype) {
  if (!bias.has_value() || !bias->defined()) return {};
  at::Tensor b = bias->to(out_dtype).contiguous();
  x.bias = b.const_data_ptr();
  x.bias_sg = b.size(1);
  return b;
}

// out = act(bias), bias broadcast to out's shape: the C of products over an empty contraction.
void fill_with_bias(const at::Tensor& bias, Activation act, at::Tensor& out) {
  out.copy_(bias.expand_as(out));
  aten_activation_out(act, out, out);
}

// C of a product whose contraction is empty (K = 0, or no tokens at all in a split of K): every
// product is zero, so C = act(bias) where a group has a bias row and zeros elsewhere (rows past
// the last offset of a row split included). A tensor map cannot describe an empty extent, so
// the kernel does not run.
void fill_empty_contraction(const std::optional<at::Tensor>& offs, const at::Tensor& bias,
                            GroupedLayout layout, Activation act, at::Tensor& out) {
  out.zero_();
  if (!bias.defined()) return;  // act(0) = 0 for every activation
  if (layout == GroupedLayout::k2d3d) {
    // Row r belongs to the group of the first offset above it; rows past the last offset
    // belong to none.
    const at::Tensor rows = at::arange(out.size(0), offs->options().dtype(at::kLong));
    const at::Tensor group = at::searchsorted(offs->to(at::kLong), rows, false, true);
    const int64_t groups = bias.size(0);
    const at::Tensor in_group = (group < groups).unsqueeze(1);
    const at::Tensor rows_bias = bias.index_select(0, group.clamp_max(groups - 1));
    fill_with_bias(at::where(in_group, rows_bias, at::zeros_like(rows_bias)), act, out);
  } else {
    fill_with_bias(bias.unsqueeze(1), act, out);
  }
}

}  // namespace

void grouped_mm_cuda_into(const char* op, const at::Tensor& a_in, const at::Tensor& b_in,
                          const std::optional<at::Tensor>& offs,
                          const std::optional<at::Tensor>& bias, GroupedLayout layout,
                          Activation act, at::Tensor& out) {
  TORCH_CHECK(a_in.is_cuda(), op, ": the CUDA kernel expected CUDA tensors, got ", describe(a_in));
  const c10::cuda::CUDAGuard guard(a_in.device());
  check_hopper(op, a_in);
  if (out.numel() == 0) return;
  GroupedGemmArgs x;
  x.kind = a_in.scalar_type() == at::kBFloat16 ? kBF16 : kF16;
  x.out = out_kind(out.scalar_type());
  x.act = act;
  const at::Tensor a = a_in, b = b_in;
  switch (layout) {
    case GroupedLayout::k2d3d:
      x.split = GroupSplit::kRows;
      x.groups = group_count(op, b.size(0));
      x.m = a.size(0), x.k = a.size(1), x.n = b.size(2);
      x.ldc = out.stride(0);
      break;
    case GroupedLayout::k3d3d:
      x.split = GroupSplit::kNone;
      x.groups = group_count(op, a.size(0));
      x.m = a.size(1), x.k = a.size(2), x.n = b.size(2);
      x.c_sg = out.stride(0);
      x.ldc = out.stride(1);
      break;
    case GroupedLayout::k2d2d:
      x.split = GroupSplit::kDepth;
      x.groups = group_count(op, offs->size(0));
      x.m = a.size(0), x.k = a.size(1), x.n = b.size(1);
      x.c_sg = out.stride(0);
      x.ldc = out.stride(1);
      break;
    case GroupedLayout::k3d2d: {
      // Columns of b split by the offsets: run out^T = b^T a_g^T, whose rows are split, on
      // a K-major copy of b^T (TMA boxes cannot start at any inner coordinate), then
      // transpose. (No bias in this layout.)
      at::Tensor out_t = at::empty({out.size(1), out.size(0)}, out.options());
      grouped_mm_cuda_into(op, padded_rows(b.t()), a.transpose(1, 2), offs, bias,
                           GroupedLayout::k2d3d, act, out_t);
      out.copy_(out_t.t());
      return;
    }
  }
  if (x.groups == 0) {
    out.zero_();
    return;
  }
  if (x.split != GroupSplit::kNone) x.offs = offs->const_data_ptr<int>();
  const at::Tensor bias_c = set_group_bias(x, bias, out.scalar_type());
  if (x.k == 0) {
    fill_empty_contraction(offs, bias_c, layout, act, out);
    return;
  }
  x.c = out.data_ptr();
  set_operands(x, a, b);
  const char* why = nullptr;
  if (!grouped_gemm_sm90_supported(x, &why)) {
    // Copies with 16-byte rows: K-major A with N-major B, which every instance set has; a
    // split of the contraction dimension reads an M-major A (its tail is zeroed by K rows).
    const bool depth = layout == GroupedLayout::k2d2d;
    const at::Tensor ac = depth ? padded_rows(a.t()).t() : padded_rows(a);
    const at::Tensor bc = padded_rows(b);
    set_operands(x, ac, bc);
    run(op, x, out);
    return;
  }
  run(op, x, out);
}

namespace {

// The operand pair's kind (gemm_tc_kind.h: a's format first); both e5m2 is refused by the ops.
int fp8_pair_kind(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat8_e5m2) return kE5M2E4M3;
  return b.scalar_type() == at::kFloat8_e5m2 ? kE4M3E5M2 : kE4M3;
}

// t with its last two dimensions K-major as the float8 tensor cores read them: a row-major (K
// innermost) when `k_last`, else column-major (K the second to last dimension, innermost).
at::Tensor k_major_copy(const at::Tensor& t, bool k_last) {
  if (k_last) return t.stride(-1) == 1 ? t : t.contiguous();
  return t.stride(-2) == 1 ? t : t.transpose(-2, -1).contiguous().transpose(-2, -1);
}

}  // namespace

void scaled_grouped_mm_cuda_into(const char* op, const at::Tensor& a_in, const at::Tensor& b_in,
                                 const at::Tensor& sa, const at::Tensor& sb,
                                 const std::optional<at::Tensor>& offs,
                                 const std::optional<at::Tensor>& bias, GroupedLayout layout,
                                 Activation act, bool fast_accum, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(a_in.device());
  check_hopper(op, a_in);
  if (out.numel() == 0) return;
  if (layout == GroupedLayout::k3d2d) {
    // Columns of b split: out^T = b^T a_g^T, a split of rows whose operands stay K-major (b^T
    // row-major, a_g^T column-major), the scales swapped with them. (No bias in this layout.)
    at::Tensor out_t = at::empty({out.size(1), out.size(0)}, out.options());
    scaled_grouped_mm_cuda_into(op, b_in.t(), a_in.transpose(1, 2), sb, sa, offs, bias,
                                GroupedLayout::k2d3d, act, fast_accum, out_t);
    out.copy_(out_t.t());
    return;
  }
  TORCH_CHECK(layout != GroupedLayout::k2d2d, op, ": a split of K runs widened (moe_ops.cpp)");
  GroupedGemmArgs x;
  x.kind = fp8_pair_kind(a_in, b_in);
  x.out = out_kind(out.scalar_type());
  x.act = act;
  x.fast_accum = fast_accum;
  x.scale = ScaleKind::kRowCol;
  const bool rows = layout == GroupedLayout::k2d3d;
  x.split = rows ? GroupSplit::kRows : GroupSplit::kNone;
  x.groups = group_count(op, b_in.size(0));
  x.m = a_in.size(rows ? 0 : 1), x.k = a_in.size(-1), x.n = b_in.size(2);
  x.c_sg = rows ? 0 : out.stride(0);
  x.ldc = out.stride(rows ? 0 : 1);
  if (x.groups == 0) {
    out.zero_();
    return;
  }
  if (rows) x.offs = offs->const_data_ptr<int>();
  x.sa = sa.const_data_ptr<float>();
  x.sb = sb.const_data_ptr<float>();
  if (sa.dim() == a_in.dim()) {
    // Block scales (moe_ops.cpp checked their shapes): a's 1x128 ones, (rows, K/128) over all
    // its rows or a group's, and each group's 128x128 ones of b, (K/128, ceil(N/128)).
    x.scale = ScaleKind::kBlock;
    x.sa_sg = sa.dim() == 3 ? sa.stride(0) : 0;
    x.sa_s0 = sa.stride(-2);
    x.sa_s1 = sa.stride(-1);
    x.sb_sg = sb.stride(0);
    x.sb_s0 = sb.stride(1);
    x.sb_s1 = sb.stride(2);
  } else {
    // Row scales: a 2-D a's over all its rows (a split's ranges included), a 3-D operand's a
    // row of scales a group.
    x.sa_s0 = sa.stride(-1);
    x.sa_sg = sa.dim() == 2 ? sa.stride(0) : 0;
    x.sb_s1 = sb.stride(1);
    x.sb_sg = sb.stride(0);
  }
  const at::Tensor bias_c = set_group_bias(x, bias, out.scalar_type());
  if (x.k == 0) {
    fill_empty_contraction(offs, bias_c, layout, act, out);
    return;
  }
  x.c = out.data_ptr();
  at::Tensor a = k_major_copy(a_in, true), b = k_major_copy(b_in, false);
  set_operands(x, a, b);
  const char* why = nullptr;
  if (!grouped_gemm_sm90_supported(x, &why)) {
    // Rows padded to 16 bytes (an offset view's base, or strides the maps cannot take).
    a = padded_rows(a);
    b = padded_rows(b.transpose(-2, -1)).transpose(-2, -1);
    set_operands(x, a, b);
  }
  run(op, x, out);
}

at::Tensor scaled_mm_cuda_run(const char* op, const at::Tensor& a_in, const at::Tensor& b_in,
                              const at::Tensor& sa, const at::Tensor& sb,
                              const std::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                              Activation act, const Fp8Scaling& scaling, bool fast_accum) {
  TORCH_CHECK(a_in.is_cuda(), op, ": the CUDA kernel expected CUDA tensors, got ", describe(a_in));
  const c10::cuda::CUDAGuard guard(a_in.device());
  // Decode-sized products (m <= 64 against a K-major weight) on their own kernel.
  if (std::optional<at::Tensor> out = scaled_mm_decode_cuda(op, a_in, b_in, sa, sb, bias, out_dtype,
                                                            act, scaling, fast_accum)) {
    return *out;
  }
  check_hopper(op, a_in);
  TORCH_CHECK(scaling.kind != 2 || !scaling.a_square_blocks, op,
              ": the CUDA kernel takes the blockwise pairings of 1x128 scales for a with 128x128 "
              "or 128x1 scales for b (scale_a [M, K/128], scale_b [K/128, ceil(N/128)] or "
              "[K/128, N]); got scale_a ",
              describe(sa), " and scale_b ", describe(sb));
  const bool a_e5 = a_in.scalar_type() == at::kFloat8_e5m2;
  const bool b_e5 = b_in.scalar_type() == at::kFloat8_e5m2;
  TORCH_CHECK(!(a_e5 && b_e5), op,
              ": arguments 'a' and 'b' expected at most one Float8_e5m2 operand (as "
              "torch._scaled_mm), got both Float8_e5m2");
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b_in.size(1);
  at::Tensor out = at::empty({m, n}, a_in.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  if (k == 0) {
    // An empty contraction: C = act(bias), or zeros (no tensor map for an empty extent).
    if (bias.has_value() && bias->defined()) {
      fill_with_bias(bias->to(out_dtype), act, out);
    } else {
      out.zero_();
    }
    return out;
  }
  // Both operands K-major: a row-major, b column-major.
  const at::Tensor a = a_in.stride(1) == 1 ? a_in : a_in.contiguous();
  const at::Tensor b = b_in.stride(0) == 1 ? b_in : b_in.t().contiguous().t();
  GroupedGemmArgs x;
  x.kind = fp8_pair_kind(a_in, b_in);
  x.out = out_kind(out_dtype);
  x.act = act;
  x.m = m, x.n = n, x.k = k;
  set_operands(x, a, b);
  x.c = out.data_ptr();
  x.ldc = n;
  x.fast_accum = fast_accum;
  // 128x1 scales of b are read a k-block row at a time: unit stride along N.
  const bool b_cols = scaling.kind == 2 && !scaling.b_square_blocks;
  const at::Tensor sb_k = b_cols && sb.stride(1) != 1 ? sb.contiguous() : sb;
  x.sa = sa.const_data_ptr<float>();
  x.sb = sb_k.const_data_ptr<float>();
  if (scaling.kind == 2) {
    x.scale = ScaleKind::kBlock;
    x.b_block_cols = b_cols;
    x.sa_s0 = sa.stride(0), x.sa_s1 = sa.stride(1);
    x.sb_s0 = sb_k.stride(0), x.sb_s1 = sb_k.stride(1);
  } else {
    x.scale = ScaleKind::kRowCol;
    if (scaling.kind == 1) {
      x.sa_s0 = sa.stride(0);
      x.sb_s1 = sb.stride(1);
    }
  }
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->to(out_dtype).contiguous();
    x.bias = bias_c.const_data_ptr();
  }
  run(op, x, out);
  return out;
}

}  // namespace gemmt::wrapper
#endif  // GEMMT_WITH_CUDA
