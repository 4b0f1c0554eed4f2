"""The SM clock and the board power while one large product runs back to back.

    python benchmarks/clock_power.py --out <folder> [--size 8192] [--seconds 4]

Times ``gemmt.scaled_mm`` and ``torch._scaled_mm`` (tensorwise and rowwise, and tensorwise with
the tensor cores' own accumulation on both sides), then ``gemmt.mm`` and ``torch.matmul`` in
bf16, each run back to back for a few seconds (10 calls an event pair, the median pair) while
``nvidia-smi`` samples the SM clock and the power draw every 50 ms; the first fifth of the
samples (the ramp) is dropped. Each run records its TFLOP/s, the median and lowest clock, the
median power, how often the power cap was the active limit, and its fraction of the tensor
cores' peak at the median clock (132 SMs x 8192 FP8 or 4096 bf16 flops a clock on an H100 or
H200). A product that holds the card at its power limit is bound by energy a flop, not by the
nominal peak. Writes ``clock_power_<gpu>_<date>.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time
from typing import Any, Callable

import torch

import gemmt

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.sw_power_cap"
FLOPS_A_CLOCK = {"fp8": 8192, "bf16": 4096}  # per SM, dense tensor cores (Hopper)


def sampled(fn: Callable[[], object], flops: float, kind: str, seconds: float) -> dict[str, Any]:
    """``fn`` back to back for ``seconds`` under nvidia-smi's sampling: speed, clock, power."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 10)
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].strip().splitlines()]
    rows = rows[len(rows) // 5:]
    clocks = [float(r[0]) for r in rows]
    ms = statistics.median(times)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mhz = statistics.median(clocks)
    return {"ms": ms, "tflops": flops / ms / 1e9, "sm_mhz_median": mhz, "sm_mhz_min": min(clocks),
            "power_w_median": statistics.median(float(r[1]) for r in rows),
            "power_cap_active_share": sum(r[3].strip() == "Active" for r in rows) / len(rows),
            "fraction_of_peak_at_median_clock":
                flops / ms / 1e9 / (sms * FLOPS_A_CLOCK[kind] * mhz * 1e6 / 1e12),
            "samples": len(rows)}


def main() -> int:
    """Runs every product under sampling and writes the record; 1 without a CUDA device."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("clock_power: needs a CUDA device")
        return 1
    n = args.size
    flops = 2.0 * n * n * n
    x, w = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    limits = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm,power.limit",
                             "--format=csv,noheader"], capture_output=True, text=True).stdout
    runs: dict[str, Any] = {}
    for mode in ("tensor", "row"):
        a, sa = gemmt.quantize_fp8(x, mode)
        b, sb = gemmt.quantize_fp8(w, mode)
        bt, sbt = b.t(), sb.t()
        for fast in ((False, True) if mode == "tensor" else (False,)):
            tag = f"fp8_{mode}{'_fast' if fast else ''}"
            runs[f"{tag}_gemmt"] = sampled(lambda: gemmt.scaled_mm(
                a, bt, sa, sbt, out_dtype=torch.bfloat16, use_fast_accum=fast), flops, "fp8",
                args.seconds)
            runs[f"{tag}_torch"] = sampled(lambda: torch._scaled_mm(
                a, bt, sa, sbt, out_dtype=torch.bfloat16, use_fast_accum=fast), flops, "fp8",
                args.seconds)
    xb, wb = x.bfloat16(), w.bfloat16()
    runs["bf16_gemmt"] = sampled(lambda: gemmt.mm(xb, wb.t()), flops, "bf16", args.seconds)
    runs["bf16_torch"] = sampled(lambda: torch.matmul(xb, wb.t()), flops, "bf16", args.seconds)
    gpu = torch.cuda.get_device_name()
    doc = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.date.today().isoformat(), "size": n, "limits": limits.strip(),
           "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"clock_power_{gpu.replace(' ', '_').lower()}_"
                                  f"{doc['date']}.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    for name, r in runs.items():
        print(f"{name:24s} {r['tflops']:7.0f} TFLOP/s  {r['sm_mhz_median']:5.0f} MHz  "
              f"{r['power_w_median']:4.0f} W  {r['fraction_of_peak_at_median_clock']:.3f} of peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
