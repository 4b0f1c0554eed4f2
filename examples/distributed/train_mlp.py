"""Train a transformer MLP block with gemmt's Linear layers under tensor parallelism (TP),
FSDP2, or both on a 2-D mesh, and check every step against the same model on one process.

    torchrun --nproc-per-node 2 examples/distributed/train_mlp.py
    torchrun --nproc-per-node 4 examples/distributed/train_mlp.py --mode 2d

The backend is NCCL when CUDA is available (and gemmt was built with it), gloo on CPU
otherwise. Modes: ``tp`` (all ranks one TP group), ``fsdp`` (all ranks one FSDP group),
``2d`` (FSDP across groups of ``--tp`` ranks that each run TP), ``auto`` (2d with 4 ranks or
more, else tp).

The block is Llama's: ``x + down(silu(gate(norm(x))) * up(norm(x)))``, with gate and up
column-wise and down row-wise, gate's SiLU fused into its GEMM. Each step trains on random
inputs against a fixed random teacher; rank 0 trains the unsharded block on the whole
batch alongside and prints both losses and the largest difference between the parameters.
AdamW (the default) divides each gradient by its own running magnitude, so the rounding of
a near-zero gradient (summed in another order when sharded) is magnified in its update:
the parameters differ by up to about 1e-4 of their ~0.1 size. With ``--optim sgd`` they
agree to float32 rounding (about 1e-8).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import gemmt


class MLPBlock(nn.Module):
    """Pre-norm residual MLP block, its three projections gemmt Linear layers."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.gate = gemmt.nn.Linear(dim, hidden, bias=False, activation="silu")
        self.up = gemmt.nn.Linear(dim, hidden, bias=False)
        self.down = gemmt.nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(self.gate(h) * self.up(h))


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(dim, hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


TP_PLAN = {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}


def batch(step: int, dp_rank: int, args: argparse.Namespace, teacher: torch.Tensor,
          device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel rank ``dp_rank``'s batch of ``step``: the same on every rank that asks."""
    gen = torch.Generator().manual_seed(1000 * step + dp_rank)
    x = torch.randn(args.batch, args.seq, args.dim, generator=gen).to(device)
    return x, torch.tanh(x @ teacher)


def placements(t: torch.Tensor) -> str:
    if not isinstance(t, DTensor):
        return "plain tensor"
    names = t.device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(t.device_mesh.ndim))
    return ", ".join(f"{p} on {n}" for p, n in zip(t.placements, names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("auto", "tp", "fsdp", "2d"), default="auto")
    parser.add_argument("--tp", type=int, default=2, help="TP group size in 2d mode")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="per data-parallel rank")
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--optim", choices=("adamw", "sgd"), default="adamw")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available() and bool(gemmt.build_info().get("cuda"))
    backend, device = ("nccl", "cuda") if use_cuda else ("gloo", "cpu")
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    completed = False
    try:
        run(args, backend, device)
        completed = True
    finally:
        # Frees the sharded model, waits for every rank (rank 0 still runs the one-process
        # reference when the others are done), then destroys the process group.
        gemmt.distributed.leave_process_group(completed)


def run(args: argparse.Namespace, backend: str, device: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    # Gathering the 2-D sharded parameters for the comparison takes two all-gathers, which
    # DTensor warns about on every rank; the training itself does not gather them.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mode = args.mode
    if mode == "auto":
        mode = "2d" if world >= 4 and world % args.tp == 0 else "tp"
    tp_mesh: DeviceMesh | None = None
    dp_mesh: DeviceMesh | None = None
    if mode == "tp":
        tp_mesh = init_device_mesh(device, (world,), mesh_dim_names=("tp",))
    elif mode == "fsdp":
        dp_mesh = init_device_mesh(device, (world,), mesh_dim_names=("dp",))
    else:
        if world % args.tp:
            raise SystemExit(f"--mode 2d needs a world size divisible by --tp {args.tp}")
        mesh = init_device_mesh(device, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    dp_rank = dp_mesh.get_local_rank() if dp_mesh is not None else 0
    dp_size = dp_mesh.size() if dp_mesh is not None else 1

    torch.manual_seed(0)
    model = Model(args.dim, args.hidden, args.layers).to(device)
    teacher = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(7)).to(
        device) / args.dim**0.5
    reference = None
    if rank == 0:
        reference = Model(args.dim, args.hidden, args.layers).to(device)
        reference.load_state_dict(model.state_dict())
    if tp_mesh is not None:
        for block in model.blocks:
            parallelize_module(block, tp_mesh, TP_PLAN)
    if dp_mesh is not None:
        for block in model.blocks:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)

    optim = torch.optim.AdamW if args.optim == "adamw" else torch.optim.SGD
    # Under TP the norms' weights stay plain tensors (every rank computes the same gradient
    # for them from the replicated input) beside the DTensor projections, and the optimizers'
    # multi-tensor kernels (their default on CUDA) refuse such a mix: step one at a time.
    opt = optim(model.parameters(), lr=args.lr, foreach=False if tp_mesh is not None else None)
    ref_opt = optim(reference.parameters(), lr=args.lr) if reference else None
    if rank == 0:
        print(f"backend {backend} on {device}, {world} ranks, mode {mode}"
              f"{f' (dp {dp_size} x tp {tp_mesh.size()})' if mode == '2d' else ''}; "
              f"block {args.dim} -> {args.hidden} -> {args.dim} x {args.layers} layers, "
              f"batch {args.batch * dp_size} x {args.seq}")
        for name in ("gate.weight", "up.weight", "down.weight"):
            module = model.blocks[0].get_submodule(name.split(".")[0])
            print(f"  blocks.0.{name:12s} {type(module).__module__}.{type(module).__name__}, "
                  f"{placements(module.weight)}")
        print(f"{'step':>4} {'loss':>12} {'one-process loss':>17} {'max |param diff|':>17} "
              f"{'ms/step':>8}")

    for step in range(args.steps):
        start = time.perf_counter()
        x, target = batch(step, dp_rank, args, teacher, device)
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss = loss.detach()
        if dp_mesh is not None:  # the mean over data-parallel ranks is the whole batch's loss
            dist.all_reduce(loss, group=dp_mesh.get_group())
            loss /= dp_size
        elapsed_ms = (time.perf_counter() - start) * 1e3
        # Gather the sharded parameters (collectives: every rank takes part).
        params = {n: p.full_tensor() if isinstance(p, DTensor) else p.detach()
                  for n, p in model.named_parameters()}
        if reference is not None and ref_opt is not None:
            parts = [batch(step, r, args, teacher, device) for r in range(dp_size)]
            xs, ts = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            ref_loss = F.mse_loss(reference(xs), ts)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            diff = max((params[n] - p.detach()).abs().max().item()
                       for n, p in reference.named_parameters())
            print(f"{step:>4} {loss.item():>12.6f} {ref_loss.item():>17.6f} {diff:>17.2e} "
                  f"{elapsed_ms:>8.1f}")


if __name__ == "__main__":
    main()
