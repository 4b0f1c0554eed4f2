"""Where the fused Linear forward's time goes: gemmt.linear with no epilogue, bias only,
activation only and both, against F.linear (cuBLASLt, bias in its epilogue) and F.linear +
activation, bf16, in the same run (CUDA-graph replays, medians of alternating rounds)."""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import gemmt
from gemmt.bench_linear import _Replay, paired_ms


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for m, k, n in [(2048, 4096, 11008), (8192, 4096, 11008)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cases = {
            "plain": (lambda: gemmt.linear(x, w), lambda: F.linear(x, w)),
            "bias": (lambda: gemmt.linear(x, w, b), lambda: F.linear(x, w, b)),
            "gelu_tanh": (lambda: gemmt.linear(x, w, None, "gelu_tanh"),
                          lambda: F.gelu(F.linear(x, w), approximate="tanh")),
            "bias+gelu_tanh": (lambda: gemmt.linear(x, w, b, "gelu_tanh"),
                               lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
            "bias+silu": (lambda: gemmt.linear(x, w, b, "silu"),
                          lambda: F.silu(F.linear(x, w, b))),
        }
        with torch.no_grad():
            for name, (ours, ref) in cases.items():
                o, r = paired_ms(_Replay([ours] * 10), _Replay([ref] * 10))
                row = dict(m=m, k=k, n=n, case=name, ours_ms=o, torch_ms=r, ratio=r / o)
                rows.append(row)
                print(f"{m:6d} {k:6d} {n:6d} {name:16s} gemmt {o * 1e3:8.1f} us  torch "
                      f"{r * 1e3:8.1f} us  ratio {r / o:.3f}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
