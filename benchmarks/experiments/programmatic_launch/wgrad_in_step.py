"""Why a grad_weight product ran slower inside the training step than alone: the same
product (g.T @ x, bf16) timed alone on the main thread, alone on a new thread, and inside an
autograd backward (the engine's thread), with the kernels' full names, grids and times from
the profiler's trace."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading

import torch
from torch.profiler import ProfilerActivity, profile

import gemmt


def events_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def kernels(fn) -> list[tuple[str, float, object]]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    out = []
    for ev in trace["traceEvents"]:
        if ev.get("cat") in ("kernel", "gpu_memset"):
            args = ev.get("args", {})
            out.append((ev["name"][:160], ev["dur"], args.get("grid")))
    return out


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
