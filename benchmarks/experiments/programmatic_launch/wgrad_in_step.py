"""A grad_weight product (g.T @ x, bf16) timed alone on the main thread, alone on a new thread,
and inside an autograd backward (the engine's thread), with the kernels' full names, grids
and reported durations from the profiler's trace. (In the backward its reported duration
includes the time its first blocks, placed early by the programmatic launch, waited for the
grad_input product before it: `git show 463def5:benchmarks/results/h100_2026-11-27_programmatic_launch/README.md`.)"""

from __future__ import annotations

import sys
import threading

import torch

import gemmt
from gemmt._timing import median_ms
from gemmt.bench_linear import gpu_busy_ms


def events_ms(fn) -> float:
    return median_ms(fn, "cuda", warmup=1, reps=20)


def kernels(fn) -> list[tuple[str, float, object]]:
    fn()
    _, _, kern = gpu_busy_ms(fn)
    return [(ev["name"][:160], ev["dur"], ev.get("args", {}).get("grid")) for ev in kern]


def main() -> None:
    torch.manual_seed(0)
    for rows, tokens, cols in ((11008, 1024, 4096), (32000, 1024, 4096), (4096, 1024, 4096)):
        g = torch.randn(tokens, rows, device="cuda").to(torch.bfloat16)
        x = torch.randn(tokens, cols, device="cuda").to(torch.bfloat16)
        w = torch.randn(rows, cols, device="cuda").to(torch.bfloat16) / 64
        print(f"== grad_weight {rows} x {cols}, {tokens} tokens")
        alone = lambda: gemmt.mm(g.t(), x)  # noqa: E731
        print(f"alone, main thread: {events_ms(alone) * 1e3:.1f} us; torch "
              f"{events_ms(lambda: torch.matmul(g.t(), x)) * 1e3:.1f} us")
        res = {}
        t = threading.Thread(target=lambda: res.setdefault("t", events_ms(alone)))
        t.start()
        t.join()
        print(f"alone, new thread: {res['t'] * 1e3:.1f} us")
        for name, k, d, grid in ((n, "alone", dur, gr) for n, dur, gr in kernels(alone)):
            print(f"   {k}: {d:8.1f} us grid {grid} {name}")
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()

        def step():
            y = gemmt.linear(xr, wr)
            y.backward(g)

        print(f"forward + backward: {events_ms(step) * 1e3:.1f} us")
        for name, d, grid in kernels(step):
            print(f"   in step: {d:8.1f} us grid {grid} {name}")
        x3 = x.view(2, tokens // 2, cols).detach().requires_grad_()

        def step3():
            y = gemmt.linear(x3, wr)
            y.backward(g.view(2, tokens // 2, rows))

        for name, d, grid in kernels(step3):
            print(f"   3-D step: {d:8.1f} us grid {grid} {name}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
