"""Kernel-by-kernel breakdown of a few GEMM shapes, for Nsight Compute.

Warms every case up, then runs each once between cudaProfilerStart/Stop, so that

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        python scripts/profile_gemm.py

reports only the timed calls: which kernels `auto` launches for the shape (staging copy,
main kernel, split-k reduction) and how long each one takes.
"""

from __future__ import annotations

import torch

import gemmt

# (dtype, allow_tf32, m, n, k): the shapes whose ratio to cuBLAS is furthest from target.
CASES: list[tuple[torch.dtype, bool, int, int, int]] = [
    (torch.float32, True, 127, 8192, 511),
    (torch.bfloat16, False, 127, 8192, 511),
    (torch.bfloat16, False, 256, 256, 65536),
    (torch.float32, False, 8192, 64, 8192),
    (torch.float32, False, 256, 256, 65536),
    (torch.float32, False, 1000, 1000, 1000),
]


def main() -> None:
    """Runs every case once under the profiler (after a warm-up outside it)."""
    prepared = []
    for dtype, tf32, m, n, k in CASES:
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(k, n, device="cuda").to(dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        prepared.append((tf32, a, b, c))
    for tf32, a, b, c in prepared:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        gemmt.gemm(c, a, b)
        torch.matmul(a, b)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for tf32, a, b, c in prepared:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.cuda.nvtx.range_push(f"gemmt {a.dtype} tf32={tf32} {tuple(a.shape)}x{tuple(b.shape)}")
        gemmt.gemm(c, a, b)
        torch.cuda.nvtx.range_pop()
        torch.matmul(a, b)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
