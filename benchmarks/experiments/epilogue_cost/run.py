"""Where the fused Linear forward's time goes: gemmt.linear with no epilogue, bias only,
activation only and both, against F.linear (cuBLASLt, bias in its epilogue) and F.linear +
activation, in the same run (CUDA-graph replays, medians of alternating rounds).

    python benchmarks/experiments/epilogue_cost/run.py [OUT.json] [--dtypes bfloat16,float16]
        [--cases bias,gelu_tanh,bias+gelu_tanh,silu,bias+silu]

An epilogue's cost is its line's gemmt time less the plain line's, of the same shape and run.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import gemmt
from gemmt.bench_linear import _Replay, paired_ms

SHAPES = [(2048, 4096, 11008), (2048, 4096, 14336), (8192, 4096, 11008)]


def cases(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict:
    """Each case's gemmt call and its eager torch counterpart."""
    gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    return {
        "plain": (lambda: gemmt.linear(x, w), lambda: F.linear(x, w)),
        "bias": (lambda: gemmt.linear(x, w, b), lambda: F.linear(x, w, b)),
        "gelu_tanh": (lambda: gemmt.linear(x, w, None, "gelu_tanh"),
                      lambda: gelu(F.linear(x, w))),
        "bias+gelu_tanh": (lambda: gemmt.linear(x, w, b, "gelu_tanh"),
                           lambda: gelu(F.linear(x, w, b))),
        "silu": (lambda: gemmt.linear(x, w, None, "silu"), lambda: F.silu(F.linear(x, w))),
        "bias+silu": (lambda: gemmt.linear(x, w, b, "silu"),
                      lambda: F.silu(F.linear(x, w, b))),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--cases", default="", help="comma separated (default: all); plain "
                        "always runs, first")
    args = parser.parse_args()
    wanted = {"plain", *args.cases.split(",")} if args.cases else None
    torch.manual_seed(0)
    rows = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, k, n in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            plain_us = None
            with torch.no_grad():
                for name, (ours, ref) in cases(x, w, b).items():
                    if wanted is not None and name not in wanted:
                        continue
                    o, r = paired_ms(_Replay([ours] * 10), _Replay([ref] * 10))
                    if name == "plain":
                        plain_us = o * 1e3
                    rows.append(dict(dtype=str(dtype).split(".")[-1], m=m, k=k, n=n, case=name,
                                     ours_ms=o, torch_ms=r, ratio=r / o,
                                     over_plain_us=o * 1e3 - plain_us))
                    print(f"{str(dtype)[6:]:9s} {m:6d} {k:6d} {n:6d} {name:15s} gemmt "
                          f"{o * 1e3:8.1f} us (+{o * 1e3 - plain_us:5.1f})  torch "
                          f"{r * 1e3:8.1f} us  ratio {r / o:.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           gemmt=gemmt.build_info(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
