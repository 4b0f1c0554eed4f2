// Multi-threaded CPU loops for the memory-bound ops. Outputs are contiguous; an input is
// read through its StridedLayout, with a plain pointer loop when it is contiguous. These are
// the reference loops (ops.h); float_chunks serves the registered CPU kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>

#include "common.h"

namespace gemmt::wrapper {

// Walks the element offsets of a strided tensor in row-major order. Starting anywhere costs
// one div/mod per dimension; each step after that is an increment.
class StridedCursor {
 public:
  StridedCursor(const StridedLayout& layout, int64_t linear) : layout_(layout) {
    for (int d = layout_.ndim - 1; d >= 0; --d) {
      index_[d] = linear % layout_.sizes[d];
      linear /= layout_.sizes[d];
      offset_ += index_[d] * layout_.strides[d];
    }
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (int d = layout_.ndim - 1; d >= 0; --d) {
      offset_ += layout_.strides[d];
      if (++index_[d] < layout_.sizes[d]) return;
      offset_ -= index_[d] * layout_.strides[d];
      index_[d] = 0;
    }
  }

 private:
  const StridedLayout& layout_;
  int64_t index_[kMaxDims] = {};
  int64_t offset_ = 0;
};

inline bool is_unit_stride(const StridedLayout& l) {
  return l.ndim == 0 || (l.ndim == 1 && l.strides[0] == 1);
}

// Grain: enough elements per task that thread start-up is noise next to the work.
constexpr int64_t kCpuGrain = 32768;

// out[i] = f(in[i]) for every element; in_t and out_t are the element types.
template <typename in_t, typename out_t, typename F>
void cpu_unary(const char* op, const at::Tensor& in, const at::Tensor& out, F f) {
  const StridedLayout layout = strided_layout(op, "input", in);
  const in_t* src = in.const_data_ptr<in_t>();
  out_t* dst = out.mutable_data_ptr<out_t>();
  const bool flat = is_unit_stride(layout);
  at::parallel_for(0, out.numel(), kCpuGrain, [&](int64_t begin, int64_t end) {
    if (flat) {
      for (int64_t i = begin; i < end; ++i) dst[i] = f(src[i]);
      return;
    }
    StridedCursor cur(layout, begin);
    for (int64_t i = begin; i < end; ++i, cur.next()) dst[i] = f(src[cur.offset()]);
  });
}

// out[i] = f(a[i], b[i]) for tensors of one shape.
template <typename in_t, typename out_t, typename F>
void cpu_binary(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                F f) {
  const StridedLayout la = strided_layout(op, "a", a), lb = strided_layout(op, "b", b);
  const in_t* pa = a.const_data_ptr<in_t>();
  const in_t* pb = b.const_data_ptr<in_t>();
  out_t* dst = out.mutable_data_ptr<out_t>();
  const bool flat = is_unit_stride(la) && is_unit_stride(lb);
  at::parallel_for(0, out.numel(), kCpuGrain, [&](int64_t begin, int64_t end) {
    if (flat) {
      for (int64_t i = begin; i < end; ++i) dst[i] = f(pa[i], pb[i]);
      return;
    }
    StridedCursor ca(la, begin), cb(lb, begin);
    for (int64_t i = begin; i < end; ++i, ca.next(), cb.next())
      dst[i] = f(pa[ca.offset()], pb[cb.offset()]);
  });
}

// Splits [0, n) into chunks small enough for the cache and calls body(begin, length, bufs)
// on each, across threads; bufs holds `buffers` float tensors of `length` elements, reused
// from chunk to chunk. A CPU kernel that chains several ATen ops for a float16 or bfloat16
// result runs the chain on float copies of one chunk at a time: the intermediates keep the
// op-math type (one rounding at the end, as a fused loop) and never leave the cache.
// The buffers live as long as the thread and serve every call on it. Allocated at every call,
// 256 KB each (above glibc's default mmap threshold, so possibly mapped and unmapped each
// time), they ran a bf16 swiglu_backward of 2^20 elements at 1.3 ms throughout in one of ten
// processes on a 2-core machine, 0.54-0.55 ms in the others; kept per thread, ten of ten ran
// at 0.54-0.55.
constexpr int64_t kFloatChunk = 1 << 16;
constexpr int kMaxFloatChunkBuffers = 4;

inline const at::Tensor& float_chunk_buffer(int i) {
  thread_local std::array<at::Tensor, kMaxFloatChunkBuffers> buffers;
  at::Tensor& t = buffers[static_cast<std::size_t>(i)];
  if (!t.defined()) t = at::empty({kFloatChunk}, at::TensorOptions().dtype(at::kFloat));
  return t;
}

template <int buffers, typename Body>
void float_chunks(int64_t n, Body body) {
  static_assert(buffers <= kMaxFloatChunkBuffers, "float_chunks holds four buffers a thread");
  at::parallel_for(0, (n + kFloatChunk - 1) / kFloatChunk, 1, [&](int64_t begin, int64_t end) {
    std::array<at::Tensor, buffers> bufs;
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kFloatChunk, len = std::min(kFloatChunk, n - lo);
      for (int i = 0; i < buffers; ++i) {
        const at::Tensor& t = float_chunk_buffer(i);
        bufs[i] = len == kFloatChunk ? t : t.narrow(0, 0, len);
      }
      body(lo, len, bufs);
    }
  });
}

}  // namespace gemmt::wrapper
