"""swiglu(gate, up) = silu(gate) * up: values against PyTorch, gradients, opcheck, CUDA.

The op of docs/adding-an-op.md; this file is the test that walk-through describes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import gemmt
from conftest import FLOAT_DTYPES, randn

SHAPES = [(0,), (1,), (37,), (1000,), (33, 65), (2, 3, 4, 5)]


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in float64, rounded once to the inputs' dtype."""
    return (F.silu(gate.double()) * up.double()).to(gate.dtype)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    # float32 arithmetic, one rounding to the dtype: half an ulp of the dtype plus float32's
    # exp error, for float32 a few ulps.
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    if dtype == torch.float16:
        return {"rtol": 1e-3, "atol": 1e-5}
    return {"rtol": 8e-3, "atol": 1e-5}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_matches_torch(device: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gate = randn(*shape, dtype=dtype, device=device) * 4
    up = randn(*shape, dtype=dtype, device=device)
    out = gemmt.swiglu(gate, up)
    assert out.shape == gate.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out, reference(gate, up), **tolerance(dtype))


def test_swiglu_strided_and_extreme_inputs(device: str) -> None:
    gate = randn(64, 48, device=device).t()  # transposed view: the strided path on CUDA
    up = randn(128, 48, device=device)[::2].t()
    torch.testing.assert_close(gemmt.swiglu(gate, up), reference(gate, up), **tolerance(torch.float32))
    # silu saturates: -inf -> -0 (no NaN from inf / inf), +inf -> inf.
    big = torch.tensor([-1e4, -100.0, 0.0, 100.0, float("inf")], device=device)
    out = gemmt.swiglu(big, torch.ones_like(big))
    assert not out.isnan().any(), out
    torch.testing.assert_close(out, F.silu(big))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("inter", [24, 13])
def test_swiglu_on_the_halves_of_a_fused_product(device: str, dtype: torch.dtype,
                                                 inter: int) -> None:
    # gate and up as the column halves of one (rows, 2 * inter) product: row views read in
    # place (16-byte packs when inter is a multiple of the pack, one element otherwise),
    # forward and backward, 2-D and with a leading batch dimension.
    for lead in ((37,), (3, 5)):
        h = randn(*lead, 2 * inter, dtype=dtype, device=device) * 3
        gate, up = h[..., :inter], h[..., inter:]
        torch.testing.assert_close(gemmt.swiglu(gate, up), reference(gate, up), **tolerance(dtype))
        grad = randn(*lead, inter, dtype=dtype, device=device)
        d_gate, d_up = torch.ops.gemmt.swiglu_backward(grad, gate, up)
        g64, x64, u64 = (t.double().requires_grad_() for t in (grad, gate, up))
        r_gate, r_up = torch.autograd.grad(F.silu(x64) * u64, (x64, u64), g64)
        torch.testing.assert_close(d_gate, r_gate.to(dtype), **tolerance(dtype))
        torch.testing.assert_close(d_up, r_up.to(dtype), **tolerance(dtype))


def test_swiglu_gradcheck_cpu_float64() -> None:
    gate = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gemmt.swiglu, (gate, up))
    # Second derivatives: the recorded backward runs as differentiable ATen ops.
    assert torch.autograd.gradgradcheck(gemmt.swiglu, (gate, up))


def test_swiglu_backward_matches_torch(device: str) -> None:
    gate = randn(300, device=device).requires_grad_()
    up = randn(300, device=device).requires_grad_()
    grad = randn(300, device=device)
    d_gate, d_up = torch.autograd.grad(gemmt.swiglu(gate, up), (gate, up), grad)
    r_gate, r_up = torch.autograd.grad(F.silu(gate) * up, (gate, up), grad)
    torch.testing.assert_close(d_gate, r_gate)
    torch.testing.assert_close(d_up, r_up)


def test_swiglu_refuses_bad_arguments(device: str) -> None:
    x = randn(4, 5, device=device)
    with pytest.raises(RuntimeError, match="gemmt::swiglu: .*'up'"):
        gemmt.swiglu(x, randn(5, 4, device=device))
    with pytest.raises(RuntimeError, match="gemmt::swiglu: .*'up'"):
        gemmt.swiglu(x, x.half())
    with pytest.raises(RuntimeError, match="gemmt::swiglu: .*'gate'"):
        gemmt.swiglu(x.int(), x.int())


def opcheck_cases(device: str) -> list[tuple[Any, tuple, dict]]:
    """Collected by test_autograd_opcheck.test_every_registered_op_is_opchecked."""
    g = torch.ops.gemmt
    gate, up = randn(5, 7, device=device), randn(5, 7, device=device)
    return [
        (g.swiglu, (gate.clone().requires_grad_(), up.clone().requires_grad_()), {}),
        (g.swiglu_backward, (randn(5, 7, device=device), gate, up), {}),
    ]


def test_swiglu_opcheck(device: str) -> None:
    gemmt.build_info()  # load the library
    for op, args, kwargs in opcheck_cases(device):
        result = torch.library.opcheck(op, args, kwargs)
        failed = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not failed, (op, failed)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_swiglu_cuda_matches_cpu(dtype: torch.dtype) -> None:
    # Sizes around the 16-byte packs, a misaligned view (storage offset 1) and a large tensor.
    for n in (1, 7, 8, 9, 4097, 1 << 20):
        gate = randn(n + 1, dtype=dtype, device="cuda")[1:]
        up = randn(n, dtype=dtype, device="cuda")
        out = gemmt.swiglu(gate, up)
        torch.testing.assert_close(out.cpu(), gemmt.swiglu(gate.cpu(), up.cpu()),
                                   **tolerance(dtype))
        grad = randn(n, dtype=dtype, device="cuda")
        d_cuda = torch.ops.gemmt.swiglu_backward(grad, gate, up)
        d_cpu = torch.ops.gemmt.swiglu_backward(grad.cpu(), gate.cpu(), up.cpu())
        for got, want in zip(d_cuda, d_cpu):
            torch.testing.assert_close(got.cpu(), want, **tolerance(dtype))

