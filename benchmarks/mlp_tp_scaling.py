"""Tensor-parallel scaling of a Llama MLP block: one GPU against several, gemmt's Linear
against torch's Linear on each.

    python benchmarks/mlp_tp_scaling.py --out benchmarks/results/<folder>

The block is ``x + down(silu(gate(norm(x))) * up(norm(x)))`` in bf16 (hidden 4096,
intermediate 11008, 8192 tokens by default). On one GPU it runs as it is; on ``n`` GPUs gate
and up are column-wise and down row-wise (``parallelize_module``), so each rank computes
``1/n`` of every product and the block's output and its input gradient are all-reduced over
NCCL. A step is the forward and the backward (input and weight gradients), no optimizer.

Both implementations are built on every rank from the same seed (same weights, inputs and
output gradient) and timed in the same processes: ``--rounds`` rounds of ``--steps`` steps
each, the two alternating (and which goes first alternating too), each round timed with
CUDA events between barriers and taken as the slowest rank's time. The medians of the
rounds are reported. Before timing, gemmt's output, input gradient and weight gradients
are compared with torch's (relative Frobenius error, float64).

Writes ``mlp_tp_scaling.json`` (and a PNG when matplotlib is there) under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

# NVLink multicast stays off: it is not needed here, and on shared hosts it must not be used.
for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")

IMPLS = ("torch", "gemmt")


def _dtype(args: argparse.Namespace) -> torch.dtype:
    # bf16 on GPUs; the CPU run (gloo, a check of this script) stays in float32.
    return torch.bfloat16 if args.device == "cuda" else torch.float32


class _Timer:
    """CUDA events on the GPU, the wall clock on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop_ms(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end)
        return (time.perf_counter() - self._t0) * 1e3


class MLPBlock(nn.Module):
    """Pre-norm residual SwiGLU MLP; ``linear`` builds its three projections."""

    def __init__(self, impl: str, dim: int, hidden: int, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.impl = impl
        kw: dict[str, Any] = {"bias": False, "device": device, "dtype": dtype}
        self.norm = nn.RMSNorm(dim, device=device, dtype=dtype)
        if impl == "gemmt":
            import gemmt

            # The gate's SiLU runs in its GEMM's epilogue.
            self.gate = gemmt.nn.Linear(dim, hidden, activation="silu", **kw)
            self.up = gemmt.nn.Linear(dim, hidden, **kw)
            self.down = gemmt.nn.Linear(hidden, dim, **kw)
        else:
            self.gate = nn.Linear(dim, hidden, **kw)
            self.up = nn.Linear(dim, hidden, **kw)
            self.down = nn.Linear(hidden, dim, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        g = self.gate(h)
        if self.impl == "torch":
            g = torch.nn.functional.silu(g)
        return x + self.down(g * self.up(h))


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    return ((out64 - ref64).norm() / ref64.norm()).item()


def _build(impl: str, args: argparse.Namespace, world: int, mesh: Any) -> MLPBlock:
    torch.manual_seed(args.seed)  # same full weights for both implementations
    block = MLPBlock(impl, args.dim, args.hidden, args.device, _dtype(args))
    with torch.no_grad():
        for p in (block.gate.weight, block.up.weight, block.down.weight):
            p.normal_(0.0, p.shape[1] ** -0.5)
    if world > 1:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        parallelize_module(block, mesh, {"gate": ColwiseParallel(), "up": ColwiseParallel(),
                                         "down": RowwiseParallel()})
    return block


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        if args.sm_carveout is not None:
            torch._C._set_sm_carveout_experimental(args.sm_carveout)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    completed = False
    try:
        out = _measure(rank, world, args)
        if rank == 0:
            Path(result).write_text(json.dumps(out))
        completed = True
    finally:
        from gemmt.distributed import leave_process_group

        leave_process_group(completed)


def _measure(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    dev = args.device
    mesh = init_device_mesh(dev, (world,), mesh_dim_names=("tp",)) if world > 1 else None
    blocks = {impl: _build(impl, args, world, mesh) for impl in IMPLS}
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    x = torch.randn(args.tokens, args.dim, device=dev, generator=gen).to(_dtype(args))
    grad = torch.randn(args.tokens, args.dim, device=dev, generator=gen).to(_dtype(args))
    xs = {impl: x.clone().requires_grad_(True) for impl in IMPLS}

    def step(impl: str) -> torch.Tensor:
        block = blocks[impl]
        for p in block.parameters():
            p.grad = None
        xs[impl].grad = None
        y = block(xs[impl])
        y.backward(grad)
        return y

    # Correctness: gemmt against torch on the same weights and data (each rank's shards).
    ys = {impl: step(impl).detach() for impl in IMPLS}
    errors = {"output": _rel_err(ys["gemmt"], ys["torch"]),
              "grad_input": _rel_err(xs["gemmt"].grad, xs["torch"].grad)}
    for name in ("gate", "up", "down"):
        g_ours = _local(getattr(blocks["gemmt"], name).weight.grad)
        g_ref = _local(getattr(blocks["torch"], name).weight.grad)
        errors[f"grad_{name}"] = _rel_err(g_ours, g_ref)
    worst = torch.tensor([max(errors.values())], device=dev, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    for impl in IMPLS:  # warm-up (lazy initialisation, allocator, NCCL channels)
        for _ in range(args.warmup):
            step(impl)
    sync()
    timer = _Timer(dev)
    times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for r in range(args.rounds):
        order = IMPLS if r % 2 == 0 else IMPLS[::-1]
        for impl in order:
            dist.barrier()
            sync()
            timer.start()
            for _ in range(args.steps):
                step(impl)
            ms = torch.tensor([timer.stop_ms() / args.steps], device=dev)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank does
            times[impl].append(ms.item())
    flops = 3 * 2 * 3 * args.tokens * args.dim * args.hidden  # 3 products, fwd + 2 bwd each
    out: dict[str, Any] = {"gpus": world, "max_rel_err": worst.item(), "rel_err_rank0": errors}
    for impl in IMPLS:
        ms = statistics.median(times[impl])
        out[impl] = {"step_ms": ms, "rounds_ms": times[impl],
                     "tflops_per_gpu": flops / world / (ms * 1e-3) / 1e12}
    out["gemmt_vs_torch"] = out["torch"]["step_ms"] / out["gemmt"]["step_ms"]
    out["sm_carveout"] = args.sm_carveout
    if args.profile and dev == "cuda":
        out["profile"] = _profile(rank, world, args, step, sync)
    return out


def _intervals_us(events: list[Any], want: Any) -> list[tuple[float, float]]:
    return sorted((e.time_range.start, e.time_range.end) for e in events if want(e.name))


def _overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time during which some interval of `a` and some interval of `b` both run."""
    total = 0.0
    merged: list[list[float]] = []
    for lo, hi in b:  # b's union, so that overlapping kernels of b count once
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    for lo, hi in a:
        for mlo, mhi in merged:
            total += max(0.0, min(hi, mhi) - max(lo, mlo))
    return total


def _profile(rank: int, world: int, args: argparse.Namespace, step: Any,
             sync: Any) -> dict[str, Any]:
    """Per rank and implementation: the host's time to issue a few steps against their time
    (equal when the rank is bound by its CPU), and two profiled steps each on the CPU (an op
    table, written under --out) and the GPU (the time of NCCL's kernels, how much of it ran
    beside other kernels, the GEMM kernels' time; rank 0's traces written under --out). NCCL
    kernel times include the wait for the slowest rank."""
    from torch.profiler import ProfilerActivity, profile

    def profiled(impl: str, activity: Any) -> Any:
        """Two steps of `impl` under the profiler, all ranks starting together."""
        dist.barrier()
        sync()
        with profile(activities=[activity]) as prof:
            for _ in range(2):
                step(impl)
            sync()
        return prof

    summary: dict[str, Any] = {}
    for impl in IMPLS:
        # How long the host takes to issue a step against how long the step takes: where the
        # two meet, the rank is bound by its CPU (Python, DTensor's dispatch), not its GPU.
        dist.barrier()
        sync()
        steps = 5
        t0 = time.perf_counter()
        for _ in range(steps):
            step(impl)
        issued = time.perf_counter()
        sync()
        host = {"issue_ms": (issued - t0) * 1e3 / steps,
                "step_ms": (time.perf_counter() - t0) * 1e3 / steps}
        cpu_prof = profiled(impl, ProfilerActivity.CPU)
        cpu_table = cpu_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        prof = profiled(impl, ProfilerActivity.CUDA)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        nccl = _intervals_us(kernels, lambda n: "nccl" in n.lower())
        other = _intervals_us(kernels, lambda n: "nccl" not in n.lower())
        gemm = _intervals_us(kernels, lambda n: any(k in n.lower() for k in (
            "gemm", "nvjet", "xmma", "cutlass", "cublas")))
        mine = {"nccl_us": sum(hi - lo for lo, hi in nccl) / 2,
                "nccl_beside_other_kernels_us": _overlap_us(nccl, other) / 2,
                "gemm_us": sum(hi - lo for lo, hi in gemm) / 2,
                "nccl_kernels": len(nccl) // 2, "host": host}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        summary[impl] = gathered
        args.out.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            prof.export_chrome_trace(str(args.out / f"trace_{world}gpus_{impl}_rank0.json"))
        (args.out / f"cpu_ops_{world}gpus_{impl}_rank{rank}.txt").write_text(cpu_table)
    return summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(device: str) -> dict[str, Any]:
    import gemmt

    cuda = device == "cuda"
    return {
        "devices": ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                    if cuda else [platform.processor() or "cpu"]),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "python": platform.python_version(),
        "gemmt": gemmt.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
    }


def _plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = report["runs"]
    gpus = [r["gpus"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.35
    for i, impl in enumerate(IMPLS):
        vals = [r[impl]["step_ms"] for r in runs]
        pos = [j + (i - 0.5) * width for j in range(len(runs))]
        bars = ax.bar(pos, vals, width, label=f"{impl} Linear")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(runs)), [f"{g} GPU{'s' if g > 1 else ''}" for g in gpus])
    ax.set_ylabel("forward + backward step (ms)")
    s = report["shape"]
    ax.set_title(f"MLP block {s['dim']}->{s['hidden']}->{s['dim']}, {s['tokens']} tokens, "
                 f"{s['dtype']}"
                 f"\n{report['environment']['devices'][0]}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", default="1,2", help="comma-separated GPU counts")
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=11008)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sm-carveout", type=int, default=None,
                        help="SMs left free for NCCL (torch._C._set_sm_carveout_experimental, "
                             "set for both implementations)")
    parser.add_argument("--profile", action="store_true",
                        help="also time each rank's host against its steps and profile two "
                             "steps of each implementation: host times, NCCL overlap and GEMM "
                             "time go into the JSON, CPU op tables and rank 0's traces beside "
                             "it")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: processes on gloo in float32, a check of this script")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs CUDA GPUs (or --device cpu)", file=sys.stderr)
        return 2
    counts = [int(g) for g in args.gpus.split(",")]
    have = torch.cuda.device_count() if args.device == "cuda" else max(counts)
    runs = []
    for world in counts:
        if world > have:
            print(f"skipping {world} GPUs: {have} present", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "result.json")
            mp.start_processes(_worker, args=(world, _free_port(), args, result), nprocs=world,
                               start_method="spawn")
            runs.append(json.loads(Path(result).read_text()))
    if not runs:
        return 2
    base = {impl: runs[0][impl]["step_ms"] for impl in IMPLS}
    for r in runs:
        for impl in IMPLS:
            # Speed-up over the first run and its share of the ideal (linear) speed-up.
            r[impl]["speedup"] = base[impl] / r[impl]["step_ms"]
            r[impl]["efficiency"] = r[impl]["speedup"] * runs[0]["gpus"] / r["gpus"]
    report = {"suite": "mlp_tp_scaling", "environment": _environment(args.device),
              "shape": {"dim": args.dim, "hidden": args.hidden, "tokens": args.tokens,
                        "dtype": str(_dtype(args)).removeprefix("torch.")},
              "method": {"steps_per_round": args.steps, "rounds": args.rounds,
                         "warmup": args.warmup, "timing": "CUDA events (wall clock on CPU), slowest rank, median"},
              "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mlp_tp_scaling.json").write_text(json.dumps(report, indent=1))
    plotted = _plot(report, args.out / "mlp_tp_scaling.png")
    print(f"{'GPUs':>4} {'torch ms':>9} {'gemmt ms':>9} {'gemmt/torch':>12} "
          f"{'torch speed-up':>15} {'gemmt speed-up':>15} {'max rel err':>12}")
    for r in runs:
        print(f"{r['gpus']:>4} {r['torch']['step_ms']:>9.3f} {r['gemmt']['step_ms']:>9.3f} "
              f"{r['gemmt_vs_torch']:>12.3f} {r['torch']['speedup']:>15.3f} "
              f"{r['gemmt']['speedup']:>15.3f} {r['max_rel_err']:>12.2e}")
    for r in runs:
        for impl, ranks in r.get("profile", {}).items():
            print(f"{r['gpus']} GPUs, {impl}: per step and rank, NCCL kernels "
                  + ", ".join(f"{p['nccl_us']:.0f} us ({p['nccl_beside_other_kernels_us']:.0f} "
                              f"beside other kernels)" for p in ranks)
                  + "; GEMM kernels " + ", ".join(f"{p['gemm_us']:.0f}" for p in ranks) + " us"
                  + "; host issue / step ms " + ", ".join(
                      f"{p['host']['issue_ms']:.2f}/{p['host']['step_ms']:.2f}" for p in ranks))
    print(f"wrote {args.out / 'mlp_tp_scaling.json'}" + (" and the PNG" if plotted else ""))
    bad = [r["gpus"] for r in runs if not r["max_rel_err"] < 2e-2]
    if bad:
        print(f"gemmt differs from torch beyond bf16 tolerance on {bad} GPUs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
