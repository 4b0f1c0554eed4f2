"""Tensors of more than 2^31 elements through the product families (CUDA).

Each case builds an operand or an output past element 2^31 and checks rows on both sides of
that element (and the last one) against float64, so that 32-bit index arithmetic anywhere in
a kernel's addressing shows as a wrong row, a fault or NaN. Cases skip when the GPU lacks the
memory. (`test_bad_inputs.py` covers the elementwise ops and `gemm`, `test_fp8.py` the
quantisation of such inputs.)
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import gemmt
from conftest import HAS_CUDA, rel_err

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")]

E4M3 = torch.float8_e4m3fn
# An output of M x N > 2^31 elements from a short contraction: 65600 x 32784 = 2^31 + 3.6M.
M, N = 65600, 32784


def need_gib(gib: float) -> None:
    """Skips the test unless the GPU has ``gib`` GiB free."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2**30:
        pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free / 2**30:.1f} free")


def rows_across(m: int) -> torch.Tensor:
    """Rows on both sides of the middle and at both ends (an M x N output's element 2^31
    falls in its last rows)."""
    return torch.tensor(sorted({0, 1, m // 2, m - 3, m - 2, m - 1}), device="cuda")


def gelu_grad(z: torch.Tensor) -> torch.Tensor:
    """d/dz of the erf GELU."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z * z / 2) / math.sqrt(
        2 * math.pi)


def test_linear_forward_backward_output_over_2_31() -> None:
    need_gib(40)
    k = 32
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, k, device="cuda") * k**-0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = gemmt.linear(x, w, b, "gelu")
    assert y.numel() > 2**31
    rows = rows_across(M)
    x64, w64, b64 = x.detach().double(), w.detach().double(), b.detach().double()
    ref = F.gelu(x64[rows] @ w64.t() + b64)
    assert rel_err(y.detach()[rows], ref) < 1e-2
    g = torch.randn_like(y)
    y.backward(g)
    del y
    # The gradients in float64, 4096 rows at a time.
    gx = torch.empty_like(x64)
    gw = torch.zeros_like(w64)
    gb = torch.zeros_like(b64)
    for r0 in range(0, M, 4096):
        r1 = min(M, r0 + 4096)
        pre = torch.addmm(b64, x64[r0:r1], w64.t())
        d = g[r0:r1].double() * gelu_grad(pre)
        gx[r0:r1] = d @ w64
        gw += d.t() @ x64[r0:r1]
        gb += d.sum(0)
        del pre, d
    assert rel_err(x.grad, gx) < 1e-2
    assert rel_err(w.grad, gw) < 1e-2
    assert rel_err(b.grad, gb) < 1e-2


def test_swiglu_forward_backward_over_2_31_elements() -> None:
    need_gib(32)
    n = 2**31 + 17
    gate = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    up = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = gemmt.swiglu(gate, up)
    ends = (slice(0, 1 << 16), slice(n - (1 << 16), n))
    for part in ends:
        ref = F.silu(gate[part].double()) * up[part].double()
        assert rel_err(out[part], ref) < 8e-3
    del out
    g = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    d_gate, d_up = torch.ops.gemmt.swiglu_backward(g, gate, up)
    for part in ends:
        gd, ud, gg = gate[part].double(), up[part].double(), g[part].double()
        sig = torch.sigmoid(gd)
        assert rel_err(d_gate[part], gg * ud * sig * (1 + gd * (1 - sig))) < 8e-3
        assert rel_err(d_up[part], gg * F.silu(gd)) < 8e-3


FP8_MODES = {"tensorwise": ("tensor", "tensor"), "rowwise": ("row", "row"),
             "blockwise": ("block", "block_128x128")}


def dequant(q: torch.Tensor, s: torch.Tensor, gran: str) -> torch.Tensor:
    """q's real values in float64 (s as quantize_fp8 returns it for q's layout)."""
    r, c = q.shape
    s = s.double()
    if gran == "block":
        s = s.repeat_interleave(128, 1)[:, :c]
    elif gran == "block_128x128":
        s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:r, :c]
    return q.double() * s


@pytest.mark.parametrize("mode", list(FP8_MODES))
def test_scaled_mm_output_over_2_31(mode: str) -> None:
    need_gib(24)
    k = 128
    ga, gb = FP8_MODES[mode]
    a, sa = gemmt.quantize_fp8(torch.randn(M, k, device="cuda"), ga)
    wq, sw = gemmt.quantize_fp8(torch.randn(N, k, device="cuda"), gb)
    # Tensorwise through the register epilogue (bias, activation), the others staged.
    bias = torch.randn(N, device="cuda") if mode == "tensorwise" else None
    act = "relu" if mode == "tensorwise" else "none"
    out = gemmt.scaled_mm(a, wq.t(), sa, sw.t(), bias, torch.bfloat16, act)
    assert out.numel() > 2**31
    rows = rows_across(M)
    ref = dequant(a[rows], sa[rows] if ga != "tensor" else sa, ga) @ dequant(wq, sw, gb).t()
    if bias is not None:
        ref = torch.relu(ref + bias.double())
    assert rel_err(out[rows], ref) < 1e-2


def test_grouped_mm_outputs_over_2_31() -> None:
    need_gib(24)
    k, bounds = 64, [20000, 40001, M]
    a = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(3, k, N, device="cuda") * k**-0.5).to(torch.bfloat16)
    offs = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    bias = torch.randn(3, N, device="cuda", dtype=torch.bfloat16)
    out = gemmt.grouped_mm(a, b, offs, bias, torch.float32, "silu")
    assert out.numel() > 2**31
    starts = [0, *bounds[:-1]]
    for g, (r0, r1) in enumerate(zip(starts, bounds)):
        rows = torch.tensor([r0, r0 + 1, r1 - 2, r1 - 1], device="cuda")
        ref = F.silu(a[rows].double() @ b[g].double() + bias[g].double())
        assert rel_err(out[rows], ref) < 1e-2, f"group {g}"
    del out
    # The weight gradient's layout: a split of K into groups, (G, M, N) out.
    tokens, m2 = 96, 16384
    a2 = torch.randn(m2, tokens, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(tokens, N, device="cuda", dtype=torch.bfloat16)
    offs2 = torch.tensor([30, 30, 71, tokens], device="cuda", dtype=torch.int32)
    out2 = gemmt.grouped_mm(a2, b2, offs2)
    assert out2.numel() > 2**31
    rows = rows_across(m2)
    for g, (k0, k1) in enumerate(zip([0, 30, 30, 71], [30, 30, 71, tokens])):
        ref = a2[rows, k0:k1].double() @ b2[k0:k1].double()
        if k1 == k0:
            assert bool((out2[g, rows] == 0).all()), f"empty group {g}"
        else:
            assert rel_err(out2[g, rows], ref) < 1e-2, f"group {g}"


def chunked_decode_ref(x64: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None
                       ) -> torch.Tensor:
    """x64 @ (w * w_scale).T in float64, 4096 weight rows at a time."""
    out = torch.empty(x64.shape[0], w.shape[0], device="cuda", dtype=torch.float64)
    for r0 in range(0, w.shape[0], 4096):
        wr = w[r0:r0 + 4096].double()
        if w_scale is not None:
            wr *= w_scale if w_scale.numel() == 1 else w_scale[r0:r0 + 4096, None]
        out[:, r0:r0 + 4096] = x64 @ wr.t()
    return out


@pytest.mark.parametrize("mode", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_decode_weight_over_2_31(mode: str, fast_accum: bool) -> None:
    need_gib(12)
    gran = FP8_MODES[mode][0]
    k = N
    wq, sw = gemmt.quantize_fp8(torch.randn(M, k, device="cuda", dtype=torch.bfloat16), gran)
    assert wq.numel() > 2**31
    for tokens in (1, 4, 16):
        a, sa = gemmt.quantize_fp8(torch.randn(tokens, k, device="cuda"), gran)
        out = gemmt.scaled_mm(a, wq.t(), sa, sw.t(), out_dtype=torch.float32,
                              use_fast_accum=fast_accum)
        ref = chunked_decode_ref(dequant(a, sa, gran), wq, sw.double().flatten())
        assert rel_err(out, ref) < 1e-2, f"{tokens} tokens"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_weight_over_2_31(dtype: torch.dtype) -> None:
    need_gib(16)
    k = N
    w = torch.randn(M, k, device="cuda", dtype=dtype).mul_(k**-0.5)
    assert w.numel() > 2**31
    for tokens in (1, 3, 16, 64):
        x = torch.randn(tokens, k, device="cuda", dtype=dtype)
        ref = chunked_decode_ref(x.double(), w, None)
        assert rel_err(gemmt.linear(x, w), ref) < 1e-2, f"linear, {tokens} tokens"
        assert rel_err(gemmt.mm(x, w.t()), ref) < 1e-2, f"mm, {tokens} tokens"


def test_moe_experts_tokens_times_hidden_over_2_31() -> None:
    need_gib(64)
    tokens, hidden, inter, experts = 2**20 + 8, 2048, 16, 2
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wgu = (torch.randn(experts, 2 * inter, hidden, device="cuda") * hidden**-0.5).to(
        torch.bfloat16).requires_grad_()
    wd = (torch.randn(experts, hidden, inter, device="cuda") * inter**-0.5).to(
        torch.bfloat16).requires_grad_()
    ids = torch.randint(0, experts, (tokens, 1), device="cuda")
    weights = torch.rand(tokens, 1, device="cuda", requires_grad=True)
    order, offsets = gemmt.moe_permute(ids, experts)
    out = gemmt.moe_experts(x, wgu, wd, weights, ids, order, offsets)
    assert out.numel() > 2**31
    g = torch.randn_like(out)
    out.backward(g)
    # Token by token in float64 on rows at both ends (x's element 2^31 is in its last rows).
    picked = rows_across(tokens)
    xs = x.detach()[picked].double().requires_grad_()
    ws = weights.detach()[picked].double().requires_grad_()
    e = ids[picked, 0]
    h = torch.einsum("th,tih->ti", xs, wgu.detach()[e].double())
    act = F.silu(h[:, :inter]) * h[:, inter:]
    ref = ws * torch.einsum("ti,thi->th", act, wd.detach()[e].double())
    assert rel_err(out.detach()[picked], ref) < 1e-2
    ref.backward(g[picked].double())
    assert rel_err(x.grad[picked], xs.grad) < 1e-2
    assert rel_err(weights.grad[picked], ws.grad) < 1e-2
    assert torch.isfinite(wgu.grad).all() and torch.isfinite(wd.grad).all()
