"""Runs Python snippets in a fresh interpreter: each way of building gemmt registers the
torch.ops.gemmt namespace, and only one copy may be loaded per process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Exercises every op, autograd and a Meta tensor through torch.ops.gemmt alone.
OPS_SMOKE = textwrap.dedent(
    """
    import torch
    dev = "cuda" if (torch.cuda.is_available() and DEVICE_CUDA) else "cpu"
    g = torch.ops.gemmt
    a, b = torch.randn(33, 17, device=dev), torch.randn(17, 9, device=dev)
    c = torch.full((33, 9), float("nan"), device=dev)
    g.gemm(c, a, b)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-5
    x = torch.randn(1000, device=dev, requires_grad=True)
    y = g.scale(g.square(g.add(x, x)), 0.5)
    y.sum().backward()
    assert torch.allclose(x.grad, 4 * x.detach(), rtol=1e-5, atol=1e-5)
    a.requires_grad_(); g.mm(a, b).sum().backward(); assert a.grad.shape == a.shape
    img = torch.randint(0, 256, (4, 5, 3), dtype=torch.uint8, device=dev)
    assert g.rgb_to_gray(img).shape == (4, 5)
    vol = torch.randint(0, 4096, (4, 5), dtype=torch.int32, device=dev).to(torch.uint16)
    assert torch.equal(g.normalize_volume(vol, 4095.0), (vol.double() / 4095.0).float())
    assert g.mm(torch.empty(3, 4, device="meta"), torch.empty(4, 5, device="meta")).shape == (3, 5)
    print("SMOKE-OK", dev)
    """
)


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 1800) -> str:
    full_env = dict(os.environ)
    full_env.pop("GEMMT_LIBRARY", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout


def smoke(device_cuda: bool) -> str:
    return OPS_SMOKE.replace("DEVICE_CUDA", "True" if device_cuda else "False")
