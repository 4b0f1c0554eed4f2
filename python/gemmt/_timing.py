"""Timing helpers: CUDA events on the GPU, a monotonic clock on the CPU; medians."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(
    fn: Callable[[], object],
    device: torch.device | str,
    *,
    warmup: int = 3,
    reps: int = 20,
    budget_s: float = 2.0,
) -> float:
    """Median time of one call of ``fn`` in milliseconds.

    Warms up first, then times up to ``reps`` calls, stopping early once ``budget_s`` of
    timed work has passed (slow kernels get fewer repetitions, never fewer than 3).
    """
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    sync(dev)
    times: list[float] = []
    spent = 0.0
    if dev.type == "cuda":
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            times.append(ms)
            spent += ms / 1e3
            if spent > budget_s and len(times) >= 3:
                break
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
            times.append(ms)
            spent += ms / 1e3
            if spent > budget_s and len(times) >= 3:
                break
    return statistics.median(times)


def per_call_us(fn: Callable[[], object], device: torch.device | str, calls: int = 2000) -> float:
    """Host-side time per call for a stream of back-to-back calls (launch/dispatch cost)."""
    dev = torch.device(device)
    for _ in range(100):
        fn()
    sync(dev)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(dev)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)
