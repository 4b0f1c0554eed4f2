"""gradcheck, torch.library.opcheck and torch.compile for every op."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import gemmt
from conftest import randn


def grad_inputs(device: str, *shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    # float64 on every device: the CPU and CUDA kernels both take it, so finite differences
    # check the gradients at gradcheck's own (tight) tolerances.
    return tuple(torch.randn(*s, dtype=torch.float64, device=device, requires_grad=True)
                 for s in shapes)


def check_grad(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> None:
    if inputs[0].dtype == torch.float64:
        assert torch.autograd.gradcheck(fn, inputs)
    else:
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=1e-2, rtol=1e-2)


def test_gradcheck_mm(device: str) -> None:
    check_grad(gemmt.mm, grad_inputs(device, (7, 5), (5, 3)))
    a, b = grad_inputs(device, (6, 4), (3, 6))
    check_grad(lambda x, y: gemmt.mm(x.t(), y.t()), (a, b))  # transposed views


@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_mm_gradients_keep_operand_layout(device: str, a_t: bool, b_t: bool) -> None:
    # mm's backward writes each gradient in its operand's layout, so autograd has no copy
    # to make before accumulating it (the gradient of W in x @ W.t() is W's own layout).
    torch.manual_seed(0)
    dtype = torch.float32
    x = torch.randn(24, 40, device=device, dtype=dtype)
    w = torch.randn(40, 56, device=device, dtype=dtype)
    x_leaf = (x.t().contiguous() if a_t else x).requires_grad_()
    w_leaf = (w.t().contiguous() if b_t else w).requires_grad_()
    a = x_leaf.t() if a_t else x_leaf
    b = w_leaf.t() if b_t else w_leaf
    g = torch.randn(24, 56, device=device, dtype=dtype)
    ga, gb = torch.autograd.grad(gemmt.mm(a, b), (x_leaf, w_leaf), g)
    assert ga.stride() == x_leaf.stride() and gb.stride() == w_leaf.stride()
    ref_a = (g.double() @ w.double().t())
    ref_b = (x.double().t() @ g.double())
    got_a = ga.t() if a_t else ga
    got_b = gb.t() if b_t else gb
    assert torch.allclose(got_a.double(), ref_a, rtol=1e-5, atol=1e-4)
    assert torch.allclose(got_b.double(), ref_b, rtol=1e-5, atol=1e-4)


def test_gradcheck_add(device: str) -> None:
    check_grad(gemmt.add, grad_inputs(device, (4, 6), (4, 6)))


def test_gradcheck_square(device: str) -> None:
    check_grad(gemmt.square, grad_inputs(device, (3, 4, 5)))


def test_gradcheck_scale(device: str) -> None:
    check_grad(lambda x: gemmt.scale(x, -1.75), grad_inputs(device, (9,)))


def test_gradgradcheck_elementwise_and_mm(device: str) -> None:
    # Second derivatives: each op's recorded backward is itself differentiable.
    assert torch.autograd.gradgradcheck(gemmt.mm, grad_inputs(device, (5, 4), (4, 3)))
    a, b = grad_inputs(device, (4, 6), (3, 4))
    assert torch.autograd.gradgradcheck(lambda x, y: gemmt.mm(x.t(), y.t()), (a, b))
    assert torch.autograd.gradgradcheck(gemmt.add, grad_inputs(device, (3, 5), (3, 5)))
    assert torch.autograd.gradgradcheck(gemmt.square, grad_inputs(device, (4, 5)))
    assert torch.autograd.gradgradcheck(lambda x: gemmt.scale(x, 0.3), grad_inputs(device, (7,)))


class GemmFunction(torch.autograd.Function):
    """out = alpha * a @ b + beta * c through gemmt.gemm, the backward through gemmt.gemm on
    transposed views (the way a user's own autograd Function would use it)."""

    @staticmethod
    def forward(ctx: Any, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
                beta: float) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.alpha, ctx.beta = alpha, beta
        out = c.detach().clone()
        gemmt.gemm(out, a.detach(), b.detach(), alpha, beta)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.saved_tensors
        grad_a = torch.empty_like(a)
        gemmt.gemm(grad_a, grad, b.t(), ctx.alpha, 0.0)
        grad_b = torch.empty_like(b)
        gemmt.gemm(grad_b, a.t(), grad, ctx.alpha, 0.0)
        return gemmt.scale(grad, ctx.beta), grad_a, grad_b, None, None


def test_gradcheck_gemm_in_a_custom_function(device: str) -> None:
    c, a, b = grad_inputs(device, (6, 5), (6, 7), (7, 5))
    check_grad(lambda c, a, b: GemmFunction.apply(c, a, b, 1.5, -0.5), (c, a, b))
    # Transposed operands: the kernels read the views in place.
    c, at, bt = grad_inputs(device, (6, 5), (7, 6), (5, 7))
    check_grad(lambda c, at, bt: GemmFunction.apply(c, at.t(), bt.t(), 0.75, 2.0), (c, at, bt))


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_linear(device: str, activation: str, bias: bool) -> None:
    x, w, b = grad_inputs(device, (2, 3, 5), (4, 5), (4,))
    inputs = (x, w, b) if bias else (x, w)
    fn = lambda x, w, b=None: gemmt.linear(x, w, b, activation)  # noqa: E731
    check_grad(fn, inputs)
    if activation != "relu":
        # ReLU's second derivative is zero away from its kink and undefined at it.
        assert torch.autograd.gradgradcheck(fn, inputs)
    # The pre-activation path of the backward (linear_with_preact and the fused
    # linear_activation_backward / linear_bias_backward) on a transposed input.
    xt, = grad_inputs(device, (5, 6))
    check_grad(lambda xt, w, *rest: fn(xt.t(), w, *rest), (xt,) + inputs[1:])


def test_gradcheck_swiglu(device: str) -> None:
    gate, up = grad_inputs(device, (4, 7), (4, 7))
    check_grad(gemmt.swiglu, (gate, up))
    assert torch.autograd.gradgradcheck(gemmt.swiglu, (gate, up))


def test_backward_matches_torch(device: str) -> None:
    a, b = grad_inputs(device, (16, 8), (8, 12))
    (gemmt.square(gemmt.scale(gemmt.mm(a, b), 0.5)).sum()).backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    (((a @ b) * 0.5) ** 2).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)


def opcheck_cases(device: str) -> list[tuple[Any, tuple, dict]]:
    img = torch.randint(0, 256, (5, 6, 3), dtype=torch.uint8, device=device)
    vol = torch.randint(0, 4096, (3, 4, 5), dtype=torch.int32, device=device).to(torch.uint16)
    g = torch.ops.gemmt
    x = randn(5, 7, device=device)
    return [
        (g.gemm, (randn(4, 3, device=device), randn(4, 5, device=device),
                  randn(5, 3, device=device), 1.5, 0.5), {}),
        (g.mm, (randn(4, 5, device=device, ).requires_grad_(), randn(5, 3, device=device)), {}),
        (g.add, (x.clone().requires_grad_(), randn(5, 7, device=device)), {}),
        (g.square, (x.clone().requires_grad_(),), {}),
        (g.square_backward, (randn(5, 7, device=device), x), {}),
        (g.scale, (x.clone().requires_grad_(), 3.0), {}),
        (g.rgb_to_gray, (img,), {"bgr": True}),
        (g.normalize_volume, (vol, 4095.0), {}),
        (g.linear, (randn(2, 3, 7, device=device).requires_grad_(),
                    randn(5, 7, device=device).requires_grad_(),
                    randn(5, device=device).requires_grad_(), "gelu_tanh"), {}),
        (g.linear_with_preact, (randn(4, 7, device=device), randn(5, 7, device=device), None,
                                "silu"), {}),
        (g.linear_activation_backward, (randn(4, 5, device=device), randn(4, 5, device=device),
                                        "gelu", True), {}),
        (g.linear_bias_backward, (randn(3, 4, 5, device=device),), {}),
    ]


def test_opcheck_all_ops(device: str) -> None:
    gemmt.build_info()  # load the library
    for op, args, kwargs in opcheck_cases(device):
        result = torch.library.opcheck(op, args, kwargs)
        failed = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not failed, (op, failed)


def test_every_registered_op_is_opchecked() -> None:
    # An op's own test file may hold its cases (an `opcheck_cases(device)` function of the
    # same form, as tests/test_swiglu.py does); every test module is asked.
    gemmt.build_info()
    registered = {
        s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("gemmt::")
    }
    checked: set[str] = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        cases = getattr(module, "opcheck_cases", None)
        if cases is not None:
            checked |= {op._qualified_op_name.split("::")[1] for op, _, _ in cases("cpu")}
    assert registered == checked, sorted(registered ^ checked)


def test_meta_shapes() -> None:
    gemmt.build_info()
    a, b = torch.empty(7, 5, device="meta"), torch.empty(5, 3, device="meta")
    assert torch.ops.gemmt.mm(a, b).shape == (7, 3)
    img = torch.empty(2, 4, 6, 3, dtype=torch.uint8, device="meta")
    assert torch.ops.gemmt.rgb_to_gray(img).shape == (2, 4, 6)
    vol = torch.empty(3, 3, dtype=torch.uint16, device="meta")
    assert torch.ops.gemmt.normalize_volume(vol, 2.0).dtype == torch.float32
    with pytest.raises(RuntimeError, match="gemmt::mm"):
        torch.ops.gemmt.mm(a, a)


def test_torch_compile_fullgraph(device: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = gemmt.mm(a, b)
        y = gemmt.add(y, gemmt.square(x))
        return gemmt.scale(y, 0.5)

    def fn_inplace(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        gemmt.gemm(c, a, b, 1.0, 1.0)
        return c * 2

    a, b, x = randn(16, 8, device=device), randn(8, 12, device=device), randn(16, 12, device=device)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b, x), fn(a, b, x))
    c = randn(16, 12, device=device)
    c_eager = c.clone()
    compiled_inplace = torch.compile(fn_inplace, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled_inplace(c, a, b), fn_inplace(c_eager, a, b))
    torch.testing.assert_close(c, c_eager)
    img = torch.randint(0, 256, (8, 8, 3), dtype=torch.uint8, device=device)
    gray = torch.compile(lambda t: gemmt.rgb_to_gray(t, bgr=True), fullgraph=True,
                         backend="aot_eager")
    assert torch.equal(gray(img), gemmt.rgb_to_gray(img, bgr=True))


def test_python_entry_points_route_overrides_through_torch_ops(device: str) -> None:
    # Eager calls take the extension's binding; a __torch_function__ mode must still see
    # every op (it only sees calls made through torch.ops), and both routes must agree.
    from torch.overrides import TorchFunctionMode

    seen: list[str] = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    a, b, x = randn(16, 8, device=device), randn(8, 12, device=device), randn(16, 12, device=device)
    img = torch.randint(0, 256, (4, 5, 3), dtype=torch.uint8, device=device)
    vol = torch.randint(0, 4096, (3, 4), dtype=torch.int32, device=device).to(torch.uint16)
    calls: dict[str, Callable[[], Any]] = {
        "mm": lambda: gemmt.mm(a, b),
        "add": lambda: gemmt.add(x, x),
        "square": lambda: gemmt.square(x),
        "scale": lambda: gemmt.scale(x, 3.0),
        "rgb_to_gray": lambda: gemmt.rgb_to_gray(img, bgr=True),
        "normalize_volume": lambda: gemmt.normalize_volume(vol, 4095.0),
    }
    eager = {name: fn() for name, fn in calls.items()}
    with Spy():
        spied = {name: fn() for name, fn in calls.items()}
        c = torch.zeros(16, 12, device=device)
        gemmt.gemm(c, a, b, 2.0, 0.0)
    for name in calls:
        assert any(f"gemmt.{name}" in s for s in seen), (name, seen)
        assert torch.equal(spied[name], eager[name]), name
    assert any("gemmt.gemm" in s for s in seen), seen
    torch.testing.assert_close(c, 2.0 * eager["mm"])


def test_torch_compile_fullgraph_after_dtensor_import() -> None:
    # DTensor imported after gemmt's library loaded: the first op call then happens inside
    # the trace, where registering the sharding rules (a lock) cannot be traced.
    code = (
        "import torch, gemmt\n"
        "gemmt.build_info()\n"
        "import torch.distributed.tensor\n"
        "f = torch.compile(lambda a, b: gemmt.mm(a, b), fullgraph=True, backend='aot_eager')\n"
        "a, b = torch.randn(8, 8), torch.randn(8, 8)\n"
        "torch.testing.assert_close(f(a, b), a @ b)\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
