"""Where a training step of the Llama-shaped model spends its GPU time, with gemmt's Linears
and with torch's: CUDA kernel time per kernel name over a few profiled steps (the model and
step of ``python -m gemmt bench linear``'s model section: 4 layers, hidden 4096,
intermediate 11008, bf16, 2 x 512 tokens, forward and backward).

    python benchmarks/experiments/train_step/profile_train_step.py [STEPS]
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from gemmt.bench_linear import llama_pair


def kernel_times(step, steps: int) -> dict[str, float]:
    """Total CUDA time (us) per kernel name over `steps` calls of `step`."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time_total / steps
    return totals


def category(name: str) -> str:
    low = name.lower()
    if "gemmt::" in name:
        return "gemmt"
    if any(k in low for k in ("gemm", "nvjet", "xmma", "cutlass", "cublas")):
        return "cublas"
    if "flash" in low or "attention" in low or "fmha" in low:
        return "attention"
    return "other"


def main(steps: int) -> None:
    ref, ours = llama_pair(4)
    ids = torch.randint(0, ref.config.vocab_size, (2, 512), device="cuda")

    def stepper(model):
        def step():
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids, use_cache=False).loss.backward()
        return step

    for label, model in (("torch", ref), ("gemmt", ours)):
        totals = kernel_times(stepper(model), steps)
        by_cat: dict[str, float] = collections.defaultdict(float)
        for name, us in totals.items():
            by_cat[category(name)] += us
        print(f"== {label}: {sum(totals.values()):.0f} us of kernels per step; "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_cat.items())))
        for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[:14]:
            print(f"   {us:9.1f} us  {category(name):9s} {name[:110]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
