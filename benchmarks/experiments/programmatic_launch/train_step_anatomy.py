"""The Llama-shaped training step of ``python -m gemmt bench linear`` (model section), taken
apart: host-blocking calls (sync debug mode), kernels per step, the host's issue time, and
the kernels' summed GPU time per step for gemmt's Linears and torch's (profiler, alternating
rounds), grouped so that the Linear products can be told from the rest."""

from __future__ import annotations

import collections
import statistics
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from gemmt.bench_linear import gpu_busy_ms, llama_pair


def main() -> None:
    ref, ours = llama_pair(4)
    ids = torch.randint(0, ref.config.vocab_size, (2, 512), device="cuda")

    def step(model):
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss

    for _ in range(3):
        step(ours), step(ref)
    torch.cuda.synchronize()
    for name, model in (("gemmt", ours), ("torch", ref)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            step(model)
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        print(f"{name}: {len(caught)} synchronizing calls in a step")
        for w in caught[:5]:
            print("   ", str(w.message).splitlines()[0][:200])
        t0 = time.perf_counter()
        step(model)
        print(f"{name}: host issue {1e3 * (time.perf_counter() - t0):.2f} ms")
        torch.cuda.synchronize()
    # GPU busy time per step (gpu_busy_ms: overlapping kernels of programmatic launches
    # counted once), split by kind of kernel.
    busy = {"gemmt": [], "torch": []}
    span = {"gemmt": [], "torch": []}
    groups = {"gemmt": collections.Counter(), "torch": collections.Counter()}
    counts = {}
    per_kernel = {"gemmt": collections.defaultdict(lambda: [0.0, 0.0]),
                  "torch": collections.defaultdict(lambda: [0.0, 0.0])}
    rounds = 5
    for _ in range(rounds):
        for name, model in (("gemmt", ours), ("torch", ref)):
            b_ms, s_ms, kern = gpu_busy_ms(lambda: step(model))
            busy[name].append(b_ms)
            span[name].append(s_ms)
            counts[name] = len(kern)
            for ev in kern:
                n = ev["name"]
                g = ("gemmt" if "gemmt" in n else
                     "gemm (cuBLAS)" if any(s in n for s in ("nvjet", "gemm", "cutlass", "xmma")) else
                     "attention" if any(s in n for s in ("flash", "fmha", "attention")) else "other")
                groups[name][g] += ev["own_us"] / 1e3 / rounds
                if g.startswith("gemm"):
                    short = n.replace("void gemmt::(anonymous namespace)::", "").split("(")[0]
                    grid = ev.get("args", {}).get("grid")
                    per_kernel[name][(short, str(grid))][0] += ev["own_us"] / rounds
                    per_kernel[name][(short, str(grid))][1] += 1 / rounds
    for name in busy:
        print(f"{name}: {counts[name]} kernels a step, GPU busy {statistics.median(busy[name]):.3f} ms "
              f"of a {statistics.median(span[name]):.3f} ms span (rounds "
              f"{', '.join(f'{t:.3f}' for t in busy[name])})")
        for g, t in sorted(groups[name].items()):
            print(f"    {g:14s} {t:8.3f} ms")
    for name, table in per_kernel.items():
        print(f"==== {name}: GEMM kernels by busy time a step (us; calls a step)")
        for (short, grid), (us, calls) in sorted(table.items(), key=lambda kv: -kv[1][0]):
            print(f"    {us:9.1f} {calls:5.1f}  grid {grid:14s} {short}")
    print(f"busy-time ratio torch / gemmt: "
          f"{statistics.median(busy['torch']) / statistics.median(busy['gemmt']):.4f}; "
          f"span ratio {statistics.median(span['torch']) / statistics.median(span['gemmt']):.4f}")
    # Which operators, on which shapes, the kernel time belongs to.
    for name, model in (("gemmt", ours), ("torch", ref)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True) as prof:
            step(model)
            torch.cuda.synchronize()
        print(f"==== {name}: operators by self device time")
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_device_time_total", row_limit=40, max_name_column_width=60,
            max_shapes_column_width=80))


if __name__ == "__main__":
    main()
