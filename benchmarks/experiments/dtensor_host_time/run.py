"""Host time of a Linear on DTensors: gemmt's against torch's, forward and backward, in one
process on the CPU (gloo, a mesh of one rank, tiny tensors), so that what is timed is the
dispatch (DTensor's sharding propagation and unwrapping, autograd) and not the product.

gemmt is timed twice, with its ops on DTensor's flat argument path (as registered) and with
the pytree flag that ``register_sharding`` sets put back, alternating with torch in the same
process: medians of ``ROUNDS`` rounds of 300 calls.

    python benchmarks/experiments/dtensor_host_time/run.py [ROUNDS]
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist


def per_call_us(fn: Callable[[], object], calls: int = 300) -> float:
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1),
                                rank=0, world_size=1)
        try:
            run(rounds)
        finally:
            dist.destroy_process_group()


def run(rounds: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    import gemmt

    gemmt.distributed.register()
    mesh = init_device_mesh("cpu", (1,))
    x = distribute_tensor(torch.randn(8, 16), mesh, [Replicate()]).requires_grad_()
    w = distribute_tensor(torch.randn(32, 16), mesh, [Shard(0)]).requires_grad_()
    prop = DTensor._op_dispatcher.sharding_propagator
    ops = [getattr(torch.ops.gemmt, n).default for n in gemmt.distributed._OPS]

    def set_pytree(flag: bool) -> None:
        for op in ops:
            prop.op_to_schema_info[op] = dataclasses.replace(prop.op_to_schema_info[op],
                                                             needs_pytree=flag)

    def step(f: Callable[[], torch.Tensor]) -> Callable[[], None]:
        return lambda: f().sum().backward()

    times: dict[str, list[float]] = {"torch": [], "gemmt": [], "gemmt, pytree flag on": []}
    for _ in range(rounds + 1):  # round 0 warms up (torch's first calls take seconds)
        times["torch"].append(per_call_us(step(lambda: torch.nn.functional.linear(x, w))))
        set_pytree(True)
        times["gemmt, pytree flag on"].append(per_call_us(step(lambda: gemmt.linear(x, w))))
        set_pytree(False)
        times["gemmt"].append(per_call_us(step(lambda: gemmt.linear(x, w))))
    for name, ts in times.items():
        ts = ts[1:]
        print(f"{name:22s} forward + backward: median {statistics.median(ts):6.1f} us "
              f"(rounds: {', '.join(f'{t:.0f}' for t in ts)})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
