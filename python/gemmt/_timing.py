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


def paired_median_ms(
    fns: list[Callable[[], object]],
    device: torch.device | str,
    *,
    warmup: int = 3,
    reps: int = 21,
    budget_s: float = 2.0,
) -> list[float]:
    """Median time of one call of each of ``fns`` in milliseconds, timed in alternation.

    Each round times one call of every function, the order rotating from round to round,
    so that a slow phase of a shared host lands on all of them alike. All run in this
    process, so on the CPU they share one intra-op thread count. Stops early once
    ``budget_s`` of timed work has passed (never before 5 rounds).
    """
    dev = torch.device(device)
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync(dev)
    times: list[list[float]] = [[] for _ in fns]
    spent = 0.0
    for r in range(reps):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            if dev.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fns[i]()
                ms = (time.perf_counter() - t0) * 1e3
            times[i].append(ms)
            spent += ms / 1e3
        if spent > budget_s and r + 1 >= 5:
            break
    return [statistics.median(t) for t in times]


def _calls_us(fn: Callable[[], object], dev: torch.device, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) / calls * 1e6


def per_call_us_many(
    fns: dict[str, Callable[[], object]],
    device: torch.device | str,
    *,
    calls: int = 1000,
    rounds: int = 15,
) -> dict[str, float]:
    """Host time per call of each of ``fns``, medians over ``rounds`` interleaved rounds.

    Every round times a stream of ``calls`` back-to-back calls of each function in turn, so
    that a slow phase of the host (another process, a frequency change) lands on all of
    them alike instead of on whichever was being timed at that moment.
    """
    dev = torch.device(device)
    for fn in fns.values():
        for _ in range(100):
            fn()
    sync(dev)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_calls_us(fn, dev, calls))
    return {name: statistics.median(s) for name, s in samples.items()}
