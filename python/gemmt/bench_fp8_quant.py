"""``python -m gemmt bench fp8_quant``: the FP8 quantisation kernels against the copy bandwidth.

Each granularity of ``gemmt.quantize_fp8`` (and of ``quantize_fp8_with_transpose``) is timed
on large bfloat16 inputs (``SHAPES``; the summary gives each one's median and worst over them) with CUDA events (warm-up, then the median over many events, random
data). Each event pair brackets CALLS back-to-back calls, so that what is timed is the
device's work and not the host's dispatch of one call (tens of microseconds of Python,
dispatcher and allocation, beside some 50 microseconds of kernel at 8192x8192): the host
runs ahead of the device as it does in training. Its bandwidth counts the bytes the
operation must move at the least: x read once, q (and qt) and the scales written. The copy
bandwidth, measured the same way in the same run, is that of a device-to-device copy
(``dst.copy_(src)``) of the same number of bytes read and written; the ratio of the two says
how close the kernel comes to moving memory and nothing else.

Two of the paths are two passes over x by construction: "tensor" (the amax over all of x
must be known before the first element is cast) and "row" with the transpose (the column
amaxes span all rows). Unless x fits in L2, x is read twice; their ``two_read_bound`` is
the fraction of the copy bandwidth that reading x twice allows (bytes counted / bytes moved
with the second read), and ``ratio_to_two_read_bound`` the ratio measured against it (above 1
where the second read finds part of x still in L2).

Results go to ``<out>/fp8_quant_<gpu>_<date>.json``, or to ``<out>`` itself when it ends in
``.json``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import statistics
from typing import Any, Callable

import torch

import gemmt
from gemmt._timing import median_ms

# Square and LLM-activation shapes (hidden 4096-8192, MLP widths 7168-14336, short and long
# rows); --quick times the first only.
SHAPES = [(8192, 8192), (16384, 8192), (4096, 14336), (8192, 4096), (16384, 2048), (2048, 7168)]
CALLS = 10  # back-to-back calls per event pair


def _block(n: int) -> int:
    return -(-n // 128)


def _scale_elems(rows: int, cols: int, granularity: str) -> int:
    return {"tensor": 1, "row": rows, "block": rows * _block(cols),
            "block_128x128": _block(rows) * _block(cols)}[granularity]


def min_bytes(rows: int, cols: int, x_dtype: torch.dtype, granularity: str,
              with_transpose: bool) -> int:
    """Bytes the quantisation moves at the least: x read once, q (and qt) and scales written."""
    x_bytes = rows * cols * torch.empty((), dtype=x_dtype).element_size()
    out = rows * cols + 4 * _scale_elems(rows, cols, granularity)
    if with_transpose:
        out += rows * cols + 4 * _scale_elems(cols, rows, granularity)
    return x_bytes + out


def reads_x_twice(granularity: str, with_transpose: bool) -> bool:
    """Whether the path makes two passes over x: "tensor", and "row" with the transpose."""
    return granularity == "tensor" or (granularity == "row" and with_transpose)


def _batched(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    def run_calls() -> None:
        for _ in range(calls):
            fn()
    return run_calls


def _device_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    """Median ms of one call of fn, timed over CALLS back-to-back calls per event pair."""
    return median_ms(_batched(fn, CALLS), "cuda", warmup=max(1, warmup // CALLS), reps=reps,
                     budget_s=30.0) / CALLS


def _copy_gbps(nbytes: int, warmup: int, reps: int) -> tuple[float, float]:
    """(ms, GB/s) of a device-to-device copy that reads and writes nbytes / 2 each."""
    half = nbytes // 2
    src = torch.randint(0, 256, (half,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _device_ms(lambda: dst.copy_(src), warmup, reps)
    return ms, 2 * half / ms / 1e6


def bench_fp8_quant(shapes: list[tuple[int, int]] | None = None,
                    granularities: tuple[str, ...] | None = None,
                    x_dtype: torch.dtype = torch.bfloat16,
                    dtype: torch.dtype = torch.float8_e4m3fn,
                    warmup: int = 10, reps: int = 100) -> list[dict[str, Any]]:
    """Times every granularity (with and without the transpose) on each shape.

    Returns one JSON-able dict per (shape, granularity, transpose): the median time in ms,
    the least bytes moved, the bandwidth in GB/s, the copy bandwidth measured for the same
    bytes in the same run, and their ratio.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("bench_fp8_quant needs a CUDA device")
    shapes = shapes if shapes is not None else SHAPES
    granularities = granularities if granularities is not None else tuple(gemmt.FP8_GRANULARITIES)
    gpu = torch.cuda.get_device_name()
    rows_out: list[dict[str, Any]] = []
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float32).to(x_dtype)
        for transpose in (False, True):
            for granularity in granularities:
                op = gemmt.quantize_fp8_with_transpose if transpose else gemmt.quantize_fp8
                call: Callable[[], object] = functools.partial(op, x, granularity, dtype)
                ms = _device_ms(call, warmup, reps)
                nbytes = min_bytes(rows, cols, x_dtype, granularity, transpose)
                copy_ms, copy_gbps = _copy_gbps(nbytes, warmup, reps)
                gbps = nbytes / ms / 1e6
                x_bytes = x.numel() * x.element_size()
                twice = reads_x_twice(granularity, transpose)
                bound = nbytes / (nbytes + x_bytes) if twice else 1.0
                row = {"op": "quantize_fp8_with_transpose" if transpose else "quantize_fp8",
                       "granularity": granularity, "with_transpose": transpose,
                       "rows": rows, "cols": cols, "x_dtype": str(x_dtype).split(".")[1],
                       "dtype": str(dtype).split(".")[1], "ms": ms, "bytes": nbytes,
                       "gbps": gbps, "copy_ms": copy_ms, "copy_gbps": copy_gbps,
                       "ratio_to_copy": gbps / copy_gbps, "reads_x_twice": twice,
                       "two_read_bound": bound,
                       "ratio_to_two_read_bound": gbps / copy_gbps / bound,
                       "calls_per_event": CALLS, "device_name": gpu}
                print(f"  {rows}x{cols} {row['x_dtype']} {granularity:<14} "
                      f"{'transpose' if transpose else '         '} {ms:8.4f} ms "
                      f"{gbps:8.1f} GB/s  copy {copy_gbps:8.1f} GB/s  "
                      f"ratio {row['ratio_to_copy']:.3f}"
                      + (f" (two reads of x: bound {bound:.3f}, "
                         f"{row['ratio_to_two_read_bound']:.3f} of it)" if twice else ""))
                rows_out.append(row)
        del x
    return rows_out


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median and worst ``ratio_to_copy`` over the shapes, per granularity and transpose."""
    groups: dict[str, list[float]] = {}
    for r in records:
        key = r["granularity"] + ("+transpose" if r["with_transpose"] else "")
        groups.setdefault(key, []).append(r["ratio_to_copy"])
    return {k: {"median": statistics.median(v), "worst": min(v), "points": len(v)}
            for k, v in groups.items()}


def run(out: str | None, quick: bool = False) -> int:
    """CLI entry: runs bench_fp8_quant and writes its JSON under ``out``; an exit code."""
    if not torch.cuda.is_available() or not gemmt.build_info().get("cuda"):
        print("bench fp8_quant: needs a CUDA device and a CUDA build of gemmt")
        return 1
    torch.manual_seed(0)
    print("FP8 quantisation against the copy bandwidth (CUDA events, medians):")
    rows = bench_fp8_quant(SHAPES[:1] if quick else SHAPES, reps=30 if quick else 100)
    summary = summarize(rows)
    print("fraction of the copy bandwidth over the shapes: median (worst)")
    for key, v in summary.items():
        print(f"  {key:<26} {v['median']:.3f} ({v['worst']:.3f})")
    if out:
        gpu = torch.cuda.get_device_name()
        date = datetime.date.today().isoformat()
        if out.endswith(".json"):
            path = out
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        else:
            os.makedirs(out, exist_ok=True)
            slug = gpu.lower().replace(" ", "_")
            path = os.path.join(out, f"fp8_quant_{slug}_{date}.json")
        doc = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
               "gemmt": gemmt.build_info(), "date": date, "summary": summary, "records": rows}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", path)
    return 0
