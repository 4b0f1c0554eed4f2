"""The Linear backward's activation pass alone: gemmt.linear_activation_backward (grad * act'(z)
and the bias sums in one pass) against eager's activation backward plus its column sum, bf16,
with the bandwidth it reaches (grad and z read, grad_preact written) as a share of a
device-to-device copy measured in the same run. CUDA events, median of 30 after 3 warm-ups.

    python benchmarks/experiments/act_backward/bench_act_backward.py LABEL
"""

from __future__ import annotations

import statistics
import sys
from typing import Callable

import torch

import gemmt

SHAPES = ((2048, 11008), (8192, 11008))
ACTIVATIONS = ("gelu_tanh", "silu", "gelu", "relu")


def median_ms(fn: Callable[[], object], runs: int = 30) -> float:
    """Median time of `fn` in milliseconds (CUDA events, after three warm-up calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_gbps() -> float:
    """Device-to-device copy bandwidth (bytes read plus written per second), in GB/s."""
    src = torch.empty(2**28, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_ms(lambda: dst.copy_(src)) / 1e6


def eager(grad: torch.Tensor, z: torch.Tensor, act: str) -> Callable[[], object]:
    """PyTorch's activation backward followed by the bias gradient's column sum."""
    def run() -> object:
        if act in ("gelu", "gelu_tanh"):
            gp = torch.ops.aten.gelu_backward(grad, z, approximate="tanh" if act == "gelu_tanh"
                                              else "none")
        elif act == "silu":
            gp = torch.ops.aten.silu_backward(grad, z)
        else:
            gp = torch.ops.aten.threshold_backward(grad, z, 0)
        return gp, gp.sum(0)
    return run


def main(label: str) -> None:
    gemmt._native.load()
    torch.manual_seed(0)
    bw = copy_gbps()
    print(f"copy {bw:.0f} GB/s")
    for rows, cols in SHAPES:
        grad = torch.randn(rows, cols, device="cuda").bfloat16()
        z = torch.randn(rows, cols, device="cuda").bfloat16()
        for act in ACTIVATIONS:
            ours = median_ms(lambda: torch.ops.gemmt.linear_activation_backward(grad, z, act, True))
            ref = median_ms(eager(grad, z, act))
            gbps = 3 * grad.numel() * grad.element_size() / ours / 1e6
            print(f"{label} {rows}x{cols} {act:10s} gemmt {ours * 1e3:8.1f} us ({gbps:5.0f} GB/s, "
                  f"{gbps / bw:.2f} of copy)  eager {ref * 1e3:8.1f} us  ratio {ref / ours:.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemmt")
