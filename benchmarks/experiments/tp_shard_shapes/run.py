"""The products one rank of a tensor-parallel Llama MLP (hidden 4096, intermediate 11008,
8192 tokens, bf16) runs, for TP degrees 1, 2 and 4: gate/up shard 4096 -> 11008/tp and down
shard 11008/tp -> 4096, each as forward, grad_input and grad_weight, gemmt against torch
in the same run (the Linear benchmark's timing: CUDA-graph replays, alternating rounds).

    python benchmarks/experiments/tp_shard_shapes/run.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

from gemmt import bench_linear


def main(path: str) -> None:
    records = []
    for tp in (1, 2, 4):
        shard = 11008 // tp
        for fin, fout in ((4096, shard), (shard, 4096)):
            for case in ("fwd", "dgrad", "wgrad"):
                r = bench_linear._product_record(case, 8192, fin, fout, torch.bfloat16, 700.0)
                r["tp"] = tp
                records.append(r)
                print(f"tp {tp} {case:5s} {fin:5d} -> {fout:5d}: gemmt {r['ours_ms']*1e3:8.1f} us"
                      f"  torch {r['ref_ms']*1e3:8.1f} us  ratio {r['ratio']:.3f}", flush=True)
                torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "records": records}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
