"""Kernel-by-kernel breakdown of a few GEMM shapes, for Nsight Compute.

Warms every case up, then runs each once between cudaProfilerStart/Stop, so that

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        python scripts/profile_gemm.py

reports only the timed calls: which kernels `auto` launches for the shape (staging copy,
main kernel, split-k reduction) and how long each one takes.

`--linear M,N,K[:PLAN] ...` profiles bf16 `gemmt.linear(x, W)` (x of M x K, W of N x K) and
`F.linear` instead, each once, the plan forced through the tuner's cache where one is named
(a tuner plan such as `wgmma:bn=192:splits=4:orient=swapped`); every gemmt result is checked
against a float64 product first. With `--clock-control none` and the default cache flush,
each kernel is timed alone: under `torch.profiler` a programmatic launch's time includes its
wait for the kernel before it.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import gemmt
from gemmt import _native

# (dtype, allow_tf32, m, n, k): the shapes whose ratio to cuBLAS is furthest from target.
CASES: list[tuple[torch.dtype, bool, int, int, int]] = [
    (torch.float32, True, 127, 8192, 511),
    (torch.bfloat16, False, 127, 8192, 511),
    (torch.bfloat16, False, 256, 256, 65536),
    (torch.float32, False, 8192, 64, 8192),
    (torch.float32, False, 256, 256, 65536),
    (torch.float32, False, 1000, 1000, 1000),
]


def tuner_key(x: torch.Tensor, w: torch.Tensor) -> tuple[str, str]:
    """The tuner cache's (device, problem) key of gemmt.linear(x, w), from one tuned call."""
    lib = _native.load()
    lib.tuning_clear()
    with gemmt.tune():
        gemmt.linear(x, w)
    return [(e["device"], e["problem"]) for e in gemmt.tuning_entries()][-1]


def forced_linear(x: torch.Tensor, w: torch.Tensor, plan: str,
                  key: tuple[str, str] | None) -> torch.Tensor:
    """gemmt.linear(x, w) on `plan` through the tuner's cache (no timing: the key is cached),
    or on the default plan where `plan` is empty."""
    if not plan or key is None:
        return gemmt.linear(x, w)
    _native.load().tuning_insert(key[0], key[1], plan, 1.0, 1.0)
    with gemmt.tune():
        return gemmt.linear(x, w)


def profile_linear(cases: list[str]) -> None:
    """Profiles each "M,N,K[:PLAN]" case's gemmt.linear and F.linear once (bf16)."""
    prepared = []
    for case in cases:
        shape, _, plan = case.partition(":")
        m, n, k = (int(v) for v in shape.split(","))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        key = tuner_key(x, w) if plan else None
        y = forced_linear(x, w, plan, key).double()
        ref = F.linear(x.double(), w.double())
        err = ((y - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{case}: relative error {err:.2e}"
        print(f"{case}: relative error {err:.2e}", flush=True)
        F.linear(x, w)
        prepared.append((case, plan, key, x, w))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for case, plan, key, x, w in prepared:
        torch.cuda.nvtx.range_push(f"gemmt {case}")
        forced_linear(x, w, plan, key)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push(f"cublas {case}")
        F.linear(x, w)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    """Runs every case once under the profiler (after a warm-up outside it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--linear", nargs="+", default=None, metavar="M,N,K[:PLAN]",
                        help="profile bf16 gemmt.linear / F.linear at these products instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_gemm: needs a CUDA device (run it under ncu on a GPU machine)")
        raise SystemExit(1)
    if args.linear:
        profile_linear(args.linear)
        return
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
