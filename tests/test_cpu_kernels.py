"""The CPU kernels (ATen's GEMM and vectorised loops) against gemmt's own reference loops
(_gemmt.reference) and float64: every op, every CPU dtype, transposed, strided, empty and
K == 0 operands, alpha and beta, NaN in c with beta == 0, and sizes that cross the chunks
of the float16/bfloat16 chains."""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import gemmt
from gemmt import _native
from conftest import rel_err, tol_for, torch_act

CPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ACTS = list(gemmt.ACTIVATIONS)
ops = torch.ops.gemmt


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    """gemmt's plain CPU loops, bound by the extension module."""
    return _native.load().reference


def tol(dtype: torch.dtype) -> float:
    # float16 products on the CPU may round partial sums in float16 (oneDNN's fp16 path).
    return 2e-2 if dtype == torch.float16 else tol_for(dtype)


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The values of t as a contiguous, transposed (column-major) or strided matrix."""
    if layout == "contiguous":
        return t.contiguous()
    if layout == "transposed":
        return t.t().contiguous().t()
    wide = torch.full((t.shape[0] * 2, t.shape[1] * 3), float("nan"), dtype=t.dtype)
    view = wide[::2, ::3]
    view.copy_(t)
    return view


LAYOUTS = ["contiguous", "transposed", "strided"]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("la,lb,lc", list(itertools.product(LAYOUTS, repeat=3))[::2])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 0.0), (1.5, -0.75), (1.0, 1.0)])
def test_gemm_matches_reference_and_float64(ref: ModuleType, dtype: torch.dtype, la: str,
                                            lb: str, lc: str, alpha: float, beta: float) -> None:
    m, n, k = 37, 29, 45
    a = laid_out(torch.randn(m, k).to(dtype), la)
    b = laid_out(torch.randn(k, n).to(dtype), lb)
    c0 = torch.randn(m, n).to(dtype)
    if beta == 0.0:
        c0.fill_(float("nan"))  # beta == 0 must never read c
    c_fast, c_ref = laid_out(c0.clone(), lc), laid_out(c0.clone(), lc)
    gemmt.gemm(c_fast, a, b, alpha, beta)
    ref.gemm(c_ref, a, b, alpha, beta)
    want = alpha * (a.double() @ b.double())
    if beta != 0.0:
        want = want + beta * c0.double()
    assert not c_fast.isnan().any()
    assert rel_err(c_fast, want) <= tol(dtype), (dtype, la, lb, lc)
    assert rel_err(c_ref, want) <= tol(dtype)
    assert rel_err(c_fast, c_ref) <= 2 * tol(dtype)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("beta", [0.0, 2.0])
def test_gemm_k_zero(ref: ModuleType, dtype: torch.dtype, beta: float) -> None:
    a, b = torch.empty(5, 0, dtype=dtype), torch.empty(0, 7, dtype=dtype)
    c0 = torch.full((5, 7), float("nan") if beta == 0.0 else 1.5, dtype=dtype)
    c_fast, c_ref = c0.clone(), c0.clone()
    gemmt.gemm(c_fast, a, b, 3.0, beta)
    ref.gemm(c_ref, a, b, 3.0, beta)
    want = torch.full((5, 7), 3.0 if beta else 0.0, dtype=dtype)
    assert torch.equal(c_fast, want) and torch.equal(c_ref, want)
    assert torch.equal(gemmt.mm(a, b), torch.zeros(5, 7, dtype=dtype))


@pytest.mark.parametrize("shape", [(0, 4, 6), (4, 6, 0), (0, 0, 0)])
def test_gemm_and_mm_empty(ref: ModuleType, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.empty(m, n)
    gemmt.gemm(c, a, b, 1.0, 1.0)
    ref.gemm(c, a, b, 1.0, 1.0)
    assert gemmt.mm(a, b).shape == (m, n) and ref.mm(a, b).shape == (m, n)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("la,lb", list(itertools.product(LAYOUTS, repeat=2)))
def test_mm_matches_reference(ref: ModuleType, dtype: torch.dtype, la: str, lb: str) -> None:
    a = laid_out(torch.randn(70, 130).to(dtype), la)
    b = laid_out(torch.randn(130, 1).to(dtype) if lb == "contiguous" else
                 torch.randn(130, 66).to(dtype), lb)
    out = gemmt.mm(a, b)
    want = a.double() @ b.double()
    assert out.is_contiguous() and out.dtype == dtype
    assert rel_err(out, want) <= tol(dtype)
    assert rel_err(out, ref.mm(a, b)) <= 2 * tol(dtype)


def test_gemm_leaves_non_finite_inputs_to_the_product(ref: ModuleType) -> None:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    a[2, 3] = float("nan")
    c = torch.zeros(8, 8)
    gemmt.gemm(c, a, b)
    assert c[2].isnan().all() and not c[torch.arange(8) != 2].isnan().any()
    c = torch.randn(8, 8)
    c[0, 0] = float("nan")
    a[2, 3] = 0.0
    gemmt.gemm(c, a, b, 1.0, 1.0)  # beta != 0 reads c: its NaN stays
    assert c[0, 0].isnan() and c.isnan().sum() == 1


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_rounds_as_torch(ref: ModuleType, dtype: torch.dtype, activation: str,
                                bias: bool) -> None:
    for shape in [(5, 40), (2, 9, 40), (40,)]:
        x = torch.randn(*shape).to(dtype)
        w = (torch.randn(24, 40) / 40 ** 0.5).to(dtype)
        b = torch.randn(24).to(dtype) if bias else None
        out, z = ops.linear_with_preact(x, w, b, activation)
        assert torch.equal(ops.linear(x, w, b, activation), out)
        # The pre-activation is rounded once to the dtype, and the activation reads that
        # rounded value: the output is exactly torch's activation of the pre-activation.
        assert torch.equal(out, torch_act(z, activation)), (shape, dtype)
        z64 = x.double() @ w.double().t() + (b.double() if bias else 0.0)
        assert rel_err(z, z64) <= tol(dtype)
        assert rel_err(out, torch_act(z64, activation)) <= tol(dtype)
        out_ref, z_ref = ref.linear(x, w, b, activation)
        assert rel_err(out, out_ref) <= 2 * tol(dtype) and rel_err(z, z_ref) <= 2 * tol(dtype)


def test_linear_strided_input_and_no_in_features(ref: ModuleType) -> None:
    x = torch.randn(40, 12).t()  # (12, 40), column-major
    w, b = torch.randn(7, 40), torch.randn(7)
    out = gemmt.linear(x, w, b, "gelu")
    assert rel_err(out, F.gelu(x.double() @ w.double().t() + b.double())) <= 1e-5
    x0, w0 = torch.randn(3, 0), torch.randn(7, 0)
    out0, z0 = ops.linear_with_preact(x0, w0, b, "silu")
    assert torch.equal(z0, b.expand(3, 7)) and torch.equal(out0, F.silu(z0))
    assert torch.equal(ref.linear(x0, w0, b, "silu")[1], z0)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("activation", [a for a in ACTS if a != "none"])
def test_linear_activation_backward(ref: ModuleType, dtype: torch.dtype, activation: str) -> None:
    g = torch.randn(3, 70, 33).to(dtype)
    z = torch.randn(3, 70, 33).to(dtype)
    gz, gb = ops.linear_activation_backward(g, z, activation, True)
    gz_ref, gb_ref = ref.linear_activation_backward(g, z, activation, True)
    z64 = z.detach().clone().double().requires_grad_()
    want, = torch.autograd.grad(torch_act(z64, activation), z64, g.double())
    assert gz.shape == g.shape and gb.shape == (33,)
    assert rel_err(gz, want) <= tol(dtype) and rel_err(gz, gz_ref) <= 2 * tol(dtype)
    assert rel_err(gb, want.sum((0, 1))) <= tol(dtype)
    assert rel_err(gb, gb_ref) <= 2 * tol(dtype)
    gz2, gb2 = ops.linear_activation_backward(g.transpose(0, 1), z.transpose(0, 1), activation,
                                              False)
    # Strided operands may take ATen's scalar loop instead of the vector one: an ulp apart.
    assert rel_err(gz2, gz.transpose(0, 1)) <= tol(dtype) and gb2.numel() == 0


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_linear_bias_backward(ref: ModuleType, dtype: torch.dtype) -> None:
    g = torch.randn(300, 4, 65).to(dtype)
    want = g.double().sum((0, 1))
    assert rel_err(ops.linear_bias_backward(g), want) <= tol(dtype)
    assert rel_err(ref.linear_bias_backward(g), want) <= tol(dtype)
    assert rel_err(ops.linear_bias_backward(g.transpose(0, 1)), want) <= tol(dtype)
    empty = torch.empty(0, 5, dtype=dtype)
    assert torch.equal(ops.linear_bias_backward(empty), torch.zeros(5, dtype=dtype))


def elementwise_inputs(dtype: torch.dtype, n: int) -> list[torch.Tensor]:
    """Contiguous, transposed and strided tensors of n elements or so."""
    cols = 97
    rows = max(1, n // cols)
    base = torch.randn(rows, cols).to(dtype)
    return [base, laid_out(base, "transposed"), laid_out(base, "strided")]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_add_square_scale_square_backward_match_reference_bitwise(ref: ModuleType,
                                                                  dtype: torch.dtype) -> None:
    for a, b in zip(elementwise_inputs(dtype, 5000), elementwise_inputs(dtype, 5000)[::-1]):
        assert torch.equal(gemmt.add(a, b), ref.add(a, b))
        assert torch.equal(gemmt.square(a), ref.square(a))
        assert torch.equal(gemmt.scale(a, -0.3), ref.scale(a, -0.3))
        assert torch.equal(ops.square_backward(b, a), ref.square_backward(b, a))
        assert rel_err(ops.square_backward(b, a), b.double() * 2 * a.double()) <= tol(dtype)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("n", [1000, 200_003])  # the larger crosses several chunks
def test_swiglu_and_backward(ref: ModuleType, dtype: torch.dtype, n: int) -> None:
    # float32 and float64 chain two ATen ops exactly as the reference loop rounds; float16
    # and bfloat16 round the forward twice (torch's silu, then the product) and the backward
    # once from float, against the reference's one rounding: they agree to an ulp.
    close = {torch.float64: 1e-14, torch.float32: 1e-6}.get(dtype, 4e-3)
    for gate, up, g in zip(*(elementwise_inputs(dtype, n) for _ in range(3))):
        gate, up, g = gate * 3, up.contiguous().view(gate.shape), g.contiguous().view(gate.shape)
        out = gemmt.swiglu(gate, up)
        x, u, gg = gate.double(), up.double(), g.double()
        s = torch.sigmoid(x)
        assert out.is_contiguous() and out.dtype == dtype
        assert rel_err(out, x * s * u) <= tol(dtype)
        assert rel_err(out, ref.swiglu(gate, up)) <= close
        d_gate, d_up = ops.swiglu_backward(g, gate, up)
        r_gate, r_up = ref.swiglu_backward(g, gate, up)
        assert rel_err(d_gate, gg * u * s * (1 + x * (1 - s))) <= tol(dtype)
        assert rel_err(d_up, gg * x * s) <= tol(dtype)
        assert rel_err(d_gate, r_gate) <= close and rel_err(d_up, r_up) <= close
    empty = torch.empty(0, 3, dtype=dtype)
    assert gemmt.swiglu(empty, empty).shape == (0, 3)
    assert all(t.shape == (0, 3) for t in ops.swiglu_backward(empty, empty, empty))


@pytest.mark.parametrize("bgr", [False, True])
def test_rgb_to_gray_matches_reference(ref: ModuleType, bgr: bool) -> None:
    img = torch.randint(0, 256, (3, 41, 53, 3), dtype=torch.uint8)
    out = gemmt.rgb_to_gray(img, bgr)
    assert torch.equal(out, ref.rgb_to_gray(img, bgr))
    f = img.double().flip(-1) if bgr else img.double()
    want = torch.floor((299 * f[..., 0] + 587 * f[..., 1] + 114 * f[..., 2] + 500) / 1000)
    assert torch.equal(out.double(), want)
    strided = img.transpose(1, 2)
    assert torch.equal(gemmt.rgb_to_gray(strided, bgr), out.transpose(1, 2))


def test_normalize_volume_reference_is_ieee_division(ref: ModuleType) -> None:
    vol = torch.randint(0, 65536, (5, 33, 17), dtype=torch.int32).to(torch.uint16)
    assert torch.equal(gemmt.normalize_volume(vol, 4095.0), vol.float() / 4095.0)
    assert torch.equal(ref.normalize_volume(vol, 4095.0), vol.float() / 4095.0)


def test_reference_refuses_non_cpu_tensors(ref: ModuleType) -> None:
    a = torch.empty(4, 4, device="meta")
    with pytest.raises(RuntimeError, match=r"gemmt::add .*CPU tensors"):
        ref.add(a, a)
    with pytest.raises(RuntimeError, match=r"gemmt::gemm .*CPU tensors"):
        ref.gemm(a, a, a)


def test_cpu_kernels_run_below_autograd() -> None:
    # The kernels write through ATen's out= ops, which refuse inputs that require grad
    # while autograd records; they must run below it, the calling op being the one it sees.
    a = torch.randn(6, 5, requires_grad=True)
    b = torch.randn(5, 4)
    c = torch.zeros(6, 4)
    gemmt.gemm(c, a, b, 2.0, 0.0)
    assert rel_err(c, 2 * a.detach().double() @ b.double()) <= 1e-6
    w = torch.randn(4, 5, requires_grad=True)
    y = gemmt.linear(a, w, None, "gelu")
    y.backward(torch.ones_like(y))
    a64, w64 = (t.detach().double().requires_grad_() for t in (a, w))
    F.gelu(a64 @ w64.t()).backward(torch.ones(6, 4, dtype=torch.float64))
    assert rel_err(a.grad, a64.grad) <= 1e-5 and rel_err(w.grad, w64.grad) <= 1e-5
