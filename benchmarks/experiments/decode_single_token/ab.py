"""One-token decode (m = 1, x @ W^T) on the gemv kernel against the Hopper GEMM's narrow
tile, both against torch, on the benchmark's weights and on weights it does not hold.

Each weight is rotated through copies that together exceed L2 three times, so every call
reads W from DRAM. The four calls (gemv, wgmma, ``gemmt.linear``'s own choice, torch) are
timed in alternating rounds of CUDA-graph replays; one JSON line per weight and dtype.

    python benchmarks/experiments/decode_single_token/ab.py OUT.jsonl [--rounds 9]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics

import torch
import torch.nn.functional as F

import gemmt
from gemmt.bench_linear import L2_BYTES, LAYERS, _Replay, copy_gbps

HELD_OUT = [(3584, 18944), (18944, 3584), (5120, 13824), (13824, 5120), (4096, 4096),
            (8192, 8192), (3584, 152064), (5120, 32000), (2048, 8192), (8192, 2048),
            (6144, 16384), (7168, 18432), (2048, 5632), (1024, 4096)]


def run(out: str, rounds: int) -> None:
    bw = copy_gbps()
    with open(out, "w") as f:
        for dtype in (torch.bfloat16, torch.float16):
            for fin, fout in LAYERS + HELD_OUT:
                if dtype == torch.float16 and (fin, fout) not in LAYERS[:4] + HELD_OUT[:6]:
                    continue
                wbytes = fin * fout * 2
                copies = max(2, math.ceil(3 * L2_BYTES / wbytes))
                ws = [(torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(dtype)
                      for _ in range(copies)]
                x = torch.randn(1, fin, device="cuda").to(dtype)
                c = torch.empty(1, fout, device="cuda", dtype=dtype)
                ref = x.double() @ ws[0].double().t()
                calls = {
                    "gemv": lambda w: gemmt.gemm(c, x, w.t(), variant="gemv"),
                    "wgmma": lambda w: gemmt.gemm(c, x, w.t(), variant="wgmma"),
                    "auto": lambda w: gemmt.linear(x, w),
                    "torch": lambda w: F.linear(x, w),
                }
                errs = {}
                for name, fn in calls.items():
                    c.fill_(float("nan"))
                    got = fn(ws[0])
                    got = c if got is None else got
                    errs[name] = float((got.double() - ref).norm() / ref.norm())
                reps = {n: _Replay([lambda w=w, fn=fn: fn(w) for w in ws]) for n, fn in calls.items()}
                times: dict[str, list[float]] = {n: [] for n in calls}
                names = list(calls)
                for r in range(rounds):
                    for j in range(len(names)):
                        n = names[(j + r) % len(names)]
                        times[n].append(reps[n].ms())
                med = {n: statistics.median(t) for n, t in times.items()}
                rec = dict(dtype=str(dtype).replace("torch.", ""), in_features=fin,
                           out_features=fout, copies=copies, copy_gbps=bw,
                           us={n: v * 1e3 for n, v in med.items()},
                           rounds_us={n: [v * 1e3 for v in t] for n, t in times.items()},
                           vs_torch={n: med["torch"] / v for n, v in med.items()},
                           bw_fraction={n: wbytes / v / 1e6 / bw for n, v in med.items()},
                           rel_err=errs, device=torch.cuda.get_device_name(),
                           torch_version=torch.__version__, cuda_version=torch.version.cuda,
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                               timespec="seconds"))
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(f"{rec['dtype']:9} {fin:6}->{fout:<7} " + " ".join(
                    f"{n} {med[n] * 1e3:8.2f}us ({rec['vs_torch'][n]:.3f})" for n in names),
                    flush=True)
                del reps, ws
                torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    run(a.out, a.rounds)
