"""Which cuBLAS kernel torch runs for each Linear product of ``python -m gemmt bench
linear``'s prefill section (forward ``x @ W.T``, grad_input ``g @ W``, grad_weight
``g.T @ x``) at a given token count, with its time: the tile shapes cuBLAS picks per class
are the reference for gemmt's planner.

    python benchmarks/experiments/cublas_kernel_choice/run.py OUT.json [TOKENS ...]
"""

from __future__ import annotations

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

LAYERS = [(4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096), (8192, 28672),
          (28672, 8192), (4096, 32000), (4096, 128256)]


def products(tokens: int, k_in: int, n_out: int) -> dict[str, tuple[torch.Tensor, ...]]:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(tokens, k_in, device=dev, dtype=dt)
    w = torch.randn(n_out, k_in, device=dev, dtype=dt) * k_in**-0.5
    g = torch.randn(tokens, n_out, device=dev, dtype=dt)
    return {"fwd": (x, w.t()), "dgrad": (g, w), "wgrad": (g.t(), x)}


def kernel_of(a: torch.Tensor, b: torch.Tensor) -> tuple[str, float]:
    """The longest CUDA kernel of torch.matmul(a, b) and its median time over 20 calls."""
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name, []).append(e.device_time_total)
    name = max(times, key=lambda n: sum(times[n]))
    ts = sorted(times[name])
    return name, ts[len(ts) // 2]


def main() -> None:
    out = sys.argv[1]
    token_counts = [int(t) for t in sys.argv[2:]] or [512, 1024, 2048]
    rows = []
    for tokens in token_counts:
        for k_in, n_out in LAYERS:
            for case, (a, b) in products(tokens, k_in, n_out).items():
                name, us = kernel_of(a, b)
                rows.append({"tokens": tokens, "in": k_in, "out": n_out, "case": case,
                             "kernel": name, "us": us})
                print(f"{tokens:5d} {k_in:6d} -> {n_out:6d} {case:5s} {us:8.1f} us  {name[:90]}",
                      flush=True)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    with open(out, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
