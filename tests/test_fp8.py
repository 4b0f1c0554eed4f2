"""FP8: scaled_mm and quantize_fp8 against float64 references and torch._scaled_mm's CPU
implementation, every bad input, opcheck, and Float8Linear / convert_to_float8 (eager and
torch.compile). The CUDA kernels' own tests against the CPU reference and float64 are here
(quantisation), in test_grouped_gemm_cuda.py (scaled_mm) and in test_fp8_decode.py (scaled_mm's
decode path)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import gemmt
from conftest import HAS_CUDA, opcheck_float8, rel_err

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
# Mantissa bits (relative half-ulp 2^-(m+1)) and the smallest subnormal, per format.
MANTISSA = {E4M3: 3, E5M2: 2}
MIN_SUBNORMAL = {E4M3: 2.0 ** -9, E5M2: 2.0 ** -16}
BLOCK = 128


# ---- references (float64, written independently of the library) ----

def expand_scale(scale: torch.Tensor, rows: int, cols: int, granularity: str) -> torch.Tensor:
    """The per-element (rows, cols) float64 scale of a quantised (rows, cols) matrix."""
    s = scale.double()
    if granularity == "tensor":
        return s.reshape(1, 1).expand(rows, cols)
    if granularity == "row":
        return s.reshape(rows, 1).expand(rows, cols)
    if granularity == "block":
        return s.repeat_interleave(BLOCK, 1)[:, :cols]
    return s.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]


def ref_quantize(x: torch.Tensor, granularity: str, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's formulas (amax_to_scale, to_fp8_saturated) per group, amax over the finite
    elements: (q, dequantisation scale in the shape quantize_fp8 returns)."""
    rows, cols = x.shape
    xf = x.float()
    mag = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    if granularity == "tensor":
        amax = mag.max() if mag.numel() else torch.zeros(())
    elif granularity == "row":
        amax = mag.amax(1, keepdim=True)
    elif granularity == "block":
        p = F.pad(mag, (0, (-cols) % BLOCK))
        amax = p.view(rows, -1, BLOCK).amax(2)
    else:
        p = F.pad(mag, (0, (-cols) % BLOCK, 0, (-rows) % BLOCK))
        amax = p.view(p.shape[0] // BLOCK, BLOCK, p.shape[1] // BLOCK, BLOCK).amax((1, 3))
    factor = (FP8_MAX[dtype] / amax.double().clamp(min=1e-12)).float()
    full = expand_scale(factor, rows, cols, granularity).float()
    q = (xf * full).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return q, factor.reciprocal()


def dequant(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    return q.double() * expand_scale(scale, q.shape[0], q.shape[1], granularity)


def activate(z: torch.Tensor, activation: str) -> torch.Tensor:
    return {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](z)


def ref_scaled_mm(a: torch.Tensor, b: torch.Tensor, sa_full: torch.Tensor, sb_full: torch.Tensor,
                  bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    z = (a.double() * sa_full) @ (b.double() * sb_full)
    if bias is not None:
        z = z + bias.double()
    return activate(z, activation)


# Scaling modes: (scale_a granularity of a (M, K), scale_b granularity of b.t() (N, K)). A
# 128x1 scale of b is a 1x128 ("block") scale of b.t(). scale_b = scale of b.t(), transposed.
MODES = {
    "tensorwise": ("tensor", "tensor"),
    "rowwise": ("row", "row"),
    "block_1x128_128x128": ("block", "block_128x128"),
    "block_1x128_128x1": ("block", "block"),
    "block_128x128_128x1": ("block_128x128", "block"),
}


def make_operands(mode: str, m: int, k: int, n: int, a_dtype: torch.dtype = E4M3,
                  b_dtype: torch.dtype = E4M3, random_scales: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.Tensor]:
    """(a, b, scale_a, scale_b, sa_full, sb_full): float8 operands with b column-major (the
    layout torch's CUDA kernels take), scales in torch's shapes, and their float64 expansions."""
    ga, gb = MODES[mode]
    a = (torch.randn(m, k) * 40).to(a_dtype)
    bt = (torch.randn(n, k) * 40).to(b_dtype)

    def scales(gran: str, rows: int, cols: int) -> torch.Tensor:
        shape = {"tensor": (), "row": (rows, 1), "block": (rows, math.ceil(cols / BLOCK)),
                 "block_128x128": (math.ceil(rows / BLOCK), math.ceil(cols / BLOCK))}[gran]
        if not random_scales:
            return torch.ones(shape)
        return torch.rand(shape) * 0.02 + 1e-3  # positive, spread over a factor of 20

    sa, sbt = scales(ga, m, k), scales(gb, n, k)
    if ga == "block":
        sa = sa.t().contiguous().t()  # torch's column-major 1x128 layout
    sa_full = expand_scale(sa, m, k, ga)
    sb_full = expand_scale(sbt, n, k, gb).t()
    return a, bt.t(), sa, sbt.t(), sa_full, sb_full


TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scaled_mm_matches_float64(mode: str, out_dtype: torch.dtype) -> None:
    m, k, n = 40, 384, 200  # ragged M and N: partial 128-blocks
    a, b, sa, sb, sa_full, sb_full = make_operands(mode, m, k, n)
    out = gemmt.scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert rel_err(out, ref_scaled_mm(a, b, sa_full, sb_full)) < TOL[out_dtype]


@pytest.mark.parametrize("mode", ["tensorwise", "rowwise", "block_1x128_128x128"])
@pytest.mark.parametrize("activation", gemmt.ACTIVATIONS)
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_bias_and_activation(mode: str, activation: str, bias_dtype: torch.dtype
                                       ) -> None:
    m, k, n = 33, 256, 160
    a, b, sa, sb, sa_full, sb_full = make_operands(mode, m, k, n)
    bias = (torch.randn(n) * 50).to(bias_dtype)
    out = gemmt.scaled_mm(a, b, sa, sb, bias, torch.float32, activation)
    ref = ref_scaled_mm(a, b, sa_full, sb_full, bias, activation)
    assert rel_err(out, ref) < 2e-6


@pytest.mark.parametrize("dtypes", [(E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)])
def test_scaled_mm_mixed_formats(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    a, b, sa, sb, sa_full, sb_full = make_operands("rowwise", 24, 128, 48, *dtypes)
    out = gemmt.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert rel_err(out, ref_scaled_mm(a, b, sa_full, sb_full)) < 2e-6


@pytest.mark.parametrize("mode", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_matches_torch_cpu(mode: str, out_dtype: torch.dtype) -> None:
    # torch 2.13's CPU _scaled_mm has these two modes; the same arguments go to both.
    a, b, sa, sb, _, _ = make_operands(mode, 48, 256, 96)
    bias = torch.randn(96).to(out_dtype)
    ours = gemmt.scaled_mm(a, b, sa, sb, bias, out_dtype)
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    except (RuntimeError, ValueError, NotImplementedError) as e:  # before torch 2.13: tensorwise only
        pytest.skip(f"torch {torch.__version__} has no {mode} _scaled_mm on CPU: {e}"[:200])
    assert rel_err(ours, theirs) < (1e-6 if out_dtype == torch.float32 else 4e-3)


@pytest.mark.parametrize("mode", ["block_1x128_128x128", "block_1x128_128x1"])
def test_scaled_mm_blockwise_against_torch_cpu_if_it_has_it(mode: str) -> None:
    a, b, sa, sb, sa_full, sb_full = make_operands(mode, 32, 256, 256)
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} has no blockwise _scaled_mm on CPU: {e}"[:200])
    ours = gemmt.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert rel_err(ours, theirs) < 1e-5


def test_scaled_mm_accepts_any_operand_strides() -> None:
    a, b, sa, sb, sa_full, sb_full = make_operands("rowwise", 32, 128, 64)
    ref = gemmt.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    for a2, b2 in ((a.t().contiguous().t(), b.contiguous()), (a, b.contiguous())):
        assert torch.equal(gemmt.scaled_mm(a2, b2, sa, sb, out_dtype=torch.float32), ref)
    # Scales in either dense layout (torch's, or the other one).
    a, b, sa, sb, _, _ = make_operands("block_1x128_128x128", 40, 256, 256)
    ref = gemmt.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.equal(gemmt.scaled_mm(a, b, sa.contiguous(), sb.contiguous(),
                                       out_dtype=torch.float32), ref)


def test_scaled_mm_blockwise_error_flat_in_k() -> None:
    # Per 128-slice float32 sums with their scales, then the slices summed: the error
    # against the float64 product of the dequantised inputs stays flat from K = 1k to 16k.
    errors = []
    for k in (1024, 2048, 4096, 8192, 16384):
        x, w = torch.randn(16, k), torch.randn(24, k)
        xq, xs = gemmt.quantize_fp8(x, "block")
        wq, ws = gemmt.quantize_fp8(w, "block_128x128")
        out = gemmt.scaled_mm(xq, wq.t(), xs, ws.t(), out_dtype=torch.float32)
        ref = dequant(xq, xs, "block") @ dequant(wq, ws, "block_128x128").t()
        errors.append(rel_err(out, ref))
    assert max(errors) < 5e-7, errors
    assert max(errors) < 2.5 * min(errors), errors  # flat: no sqrt(K) or K growth


def test_scaled_mm_empty_and_zero() -> None:
    a, b, sa, sb, _, _ = make_operands("tensorwise", 0, 64, 16)
    assert gemmt.scaled_mm(a, b, sa, sb).shape == (0, 16)
    a = torch.zeros(8, 32).to(E4M3)
    b = torch.zeros(32, 16).to(E4M3).t().contiguous().t()
    bias = torch.randn(16)
    out = gemmt.scaled_mm(a, b, torch.tensor(1.0), torch.tensor(1.0), bias, torch.float32)
    assert torch.equal(out, bias.expand(8, 16))


def test_scaled_mm_nan_operand_propagates() -> None:
    a, b, sa, sb, _, _ = make_operands("rowwise", 8, 64, 16)
    a = a.clone()
    a[3, 5] = float("nan")  # float8_e4m3fn has a NaN
    out = gemmt.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.isnan(out[3]).all() and torch.isfinite(out[torch.arange(8) != 3]).all()


# ---- quantize_fp8 ----

@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_matches_torchao_formulas(granularity: str, dtype: torch.dtype,
                                           x_dtype: torch.dtype) -> None:
    x = (torch.randn(70, 300) * torch.logspace(-3, 3, 300)).to(x_dtype)
    q, s = gemmt.quantize_fp8(x, granularity, dtype)
    q_ref, s_ref = ref_quantize(x, granularity, dtype)
    assert q.dtype == dtype and s.dtype == torch.float32 and s.shape == s_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref)


@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_quantize_round_trip_error_bound(granularity: str, dtype: torch.dtype) -> None:
    x = torch.randn(130, 260, dtype=torch.float64) * torch.logspace(-4, 2, 260, dtype=torch.float64)
    q, s = gemmt.quantize_fp8(x, granularity, dtype)
    scale = expand_scale(s, 130, 260, granularity)
    err = (dequant(q, s, granularity) - x).abs()
    # Round to nearest: half an ulp of the element, or half the smallest subnormal (scaled);
    # 1e-6 of slack for the float32 multiply before the cast.
    bound = (x.abs() * 2.0 ** -(MANTISSA[dtype] + 1) + scale * MIN_SUBNORMAL[dtype] / 2) * (1 + 1e-6)
    assert (err <= bound).all(), (err - bound).max()
    # The largest element of each group lands on the format's maximum.
    mags = q.float().abs()
    if granularity == "row":
        assert (mags.amax(1) == FP8_MAX[dtype]).all()
    elif granularity == "tensor":
        assert mags.max() == FP8_MAX[dtype]
    else:
        ref_q, _ = ref_quantize(x, granularity, dtype)
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_quantize_scale_layouts_are_what_scaled_mm_takes() -> None:
    x = torch.randn(200, 384)
    q, s = gemmt.quantize_fp8(x, "tensor")
    assert s.shape == ()
    q, s = gemmt.quantize_fp8(x, "row")
    assert s.shape == (200, 1) and s.is_contiguous()
    q, s = gemmt.quantize_fp8(x, "block")
    assert s.shape == (200, 3) and s.stride() == (1, 200)  # torch's column-major 1x128 scales
    q, s = gemmt.quantize_fp8(x, "block_128x128")
    assert s.shape == (2, 3) and s.is_contiguous()
    assert q.shape == x.shape and q.is_contiguous()


@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
def test_quantize_with_transpose(granularity: str) -> None:
    x = torch.randn(256, 200) * 3
    q, s, qt, st = gemmt.quantize_fp8_with_transpose(x, granularity, E5M2)
    q1, s1 = gemmt.quantize_fp8(x, granularity, E5M2)
    assert torch.equal(q.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s, s1)
    assert qt.shape == (200, 256) and qt.is_contiguous()
    if granularity in ("row", "block"):
        qt1, st1 = gemmt.quantize_fp8(x.t(), granularity, E5M2)
        assert torch.equal(qt.view(torch.uint8), qt1.view(torch.uint8)) and torch.equal(st, st1)
    else:
        assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8))
        assert torch.equal(st, s.t() if s.dim() == 2 else s)
    if granularity != "block_128x128":  # 128x128 with 128x128 is not one of torch's pairings
        # The transposed operand goes straight into scaled_mm: x.T @ x, contracted over the
        # 256 rows of x, as a weight gradient contracts over the tokens.
        out = gemmt.scaled_mm(qt, qt.t(), st, st.t(), out_dtype=torch.float32)
        ref = dequant(qt, st, granularity) @ dequant(qt, st, granularity).t()
        assert rel_err(out, ref) < 2e-6


def test_quantize_all_zero() -> None:
    for granularity in gemmt.FP8_GRANULARITIES:
        q, s = gemmt.quantize_fp8(torch.zeros(130, 256), granularity)
        assert (q.float() == 0).all()
        # torchao's floor: factor 448 / 1e-12, so a finite, positive scale.
        expected = torch.tensor(448.0 / 1e-12, dtype=torch.float64).float().reciprocal()
        assert torch.isfinite(s).all() and (s == expected).all()
        if granularity in ("tensor", "row"):
            out = gemmt.scaled_mm(q, q.t(), s, s.t(), out_dtype=torch.float32)
            assert torch.equal(out, torch.zeros(130, 130))


def test_quantize_non_finite() -> None:
    x = torch.tensor([[1.0, -2.0, float("inf"), 4.0],
                      [float("nan"), 0.5, -float("inf"), 0.25],
                      [float("inf"), float("inf"), -float("inf"), float("inf")]])
    q, s = gemmt.quantize_fp8(x, "row")
    qf = q.float()
    # Row 0: amax over the finite elements (4), inf saturates.
    assert torch.equal(qf[0], torch.tensor([112.0, -224.0, 448.0, 448.0]))
    assert s[0, 0].item() == pytest.approx(4.0 / 448.0, rel=1e-7)
    # Row 1: NaN stays NaN, -inf saturates, the finite ones scale by their own amax.
    assert torch.isnan(qf[1, 0]) and qf[1, 2] == -448.0 and qf[1, 1] == 448.0
    # Row 2: no finite element: the all-zero rule's scale, every element saturated.
    assert torch.equal(qf[2].abs(), torch.full((4,), 448.0)) and torch.isfinite(s[2]).all()
    assert (s > 0).all()
    qt, st = gemmt.quantize_fp8(x, "tensor")
    assert s.shape == (3, 1) and st.item() == pytest.approx(4.0 / 448.0, rel=1e-6)


def test_quantize_empty() -> None:
    for granularity in gemmt.FP8_GRANULARITIES:
        for shape in ((0, 256), (5, 0)):
            q, s = gemmt.quantize_fp8(torch.empty(shape), granularity)
            assert q.shape == shape
            q, s, qt, st = gemmt.quantize_fp8_with_transpose(torch.empty(shape), granularity)
            assert qt.shape == shape[::-1]


# ---- bad input ----

def good_rowwise() -> dict[str, Any]:
    a, b, sa, sb, _, _ = make_operands("rowwise", 32, 64, 48)
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb}


def call(**kw: Any) -> torch.Tensor:
    args = good_rowwise()
    args.update(kw)
    return gemmt.scaled_mm(**args)


@pytest.mark.parametrize("kwargs,pattern", [
    (lambda g: {"a": g["a"].float()}, r"argument 'a' expected dtype Float8_e4m3fn, Float8_e5m2"),
    (lambda g: {"b": g["b"].to(torch.bfloat16)}, r"argument 'b' expected dtype Float8"),
    (lambda g: {"a": g["a"][0]}, r"argument 'a' expected a 2-D tensor"),
    (lambda g: {"scale_a": g["scale_a"].half()}, r"argument 'scale_a' expected dtype Float"),
    (lambda g: {"scale_b": g["scale_b"].double()}, r"argument 'scale_b' expected dtype Float"),
    (lambda g: {"scale_a": torch.ones(32, 2)}, r"'scale_a' and 'scale_b' match none"),
    (lambda g: {"scale_b": torch.ones(48, 1)}, r"'scale_a' and 'scale_b' match none"),
    (lambda g: {"scale_a": torch.ones(1, 32)}, r"match none .*rowwise \(scale_a \[32, 1\]"),
    (lambda g: {"scale_a": torch.tensor(1.0)}, r"match none"),  # tensorwise a, rowwise b
    (lambda g: {"b": torch.zeros(80, 48).to(E4M3)}, r"'a' \(M, K\) and 'b' \(K, N\) expected "
                                                    r"the same K"),
    (lambda g: {"bias": torch.ones(47)}, r"argument 'bias' expected a 1-D tensor of N = 48"),
    (lambda g: {"bias": torch.ones(48, dtype=torch.int32)}, r"argument 'bias' expected dtype"),
    (lambda g: {"out_dtype": torch.float64}, r"argument 'out_dtype' expected BFloat16, Half or "
                                             r"Float, got Double"),
    (lambda g: {"out_dtype": E4M3}, r"argument 'out_dtype'"),
    (lambda g: {"activation": "tanh"}, r"argument 'activation' expected one of .*got 'tanh'"),
])
def test_scaled_mm_bad_input(kwargs: Any, pattern: str) -> None:
    with pytest.raises(RuntimeError, match="gemmt::scaled_mm: .*" + pattern):
        call(**kwargs(good_rowwise()))


@pytest.mark.parametrize("value", [-1.0, 0.0, float("inf"), float("nan"), -0.0])
@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_scaled_mm_bad_scale_values(value: float, which: str) -> None:
    g = good_rowwise()
    s = g[which].clone()
    s.view(-1)[7] = value
    where = r"\[7, 0\]" if which == "scale_a" else r"\[0, 7\]"
    with pytest.raises(RuntimeError, match=f"gemmt::scaled_mm: argument '{which}' expected "
                                           f"finite, positive dequantisation scales, got .* at "
                                           f"{where}"):
        call(**{which: s})
    # Tensorwise too.
    a, b, sa, sb, _, _ = make_operands("tensorwise", 16, 32, 16)
    with pytest.raises(RuntimeError, match=f"'{which}' expected finite, positive"):
        gemmt.scaled_mm(a, b, **{"scale_a": sa, "scale_b": sb, which: torch.tensor(value)})


def test_scaled_mm_k_alignment() -> None:
    a, b, sa, sb, _, _ = make_operands("tensorwise", 16, 40, 16)
    with pytest.raises(RuntimeError, match=r"gemmt::scaled_mm: K .* expected a multiple of 16 "
                                           r"for tensorwise scaling, got K = 40"):
        gemmt.scaled_mm(a, b, sa, sb)
    a, b, sa, sb, _, _ = make_operands("rowwise", 16, 24, 16)
    with pytest.raises(RuntimeError, match=r"multiple of 16 for rowwise scaling, got K = 24"):
        gemmt.scaled_mm(a, b, sa, sb)
    # Blockwise: 144 is a multiple of 16, not of 128.
    a, b, sa, sb, _, _ = make_operands("block_1x128_128x128", 16, 144, 128)
    with pytest.raises(RuntimeError, match=r"multiple of 128 for blockwise scaling, got K = 144"):
        gemmt.scaled_mm(a, b, sa, sb)


def test_scaled_mm_bad_scale_layout() -> None:
    a, b, sa, sb, _, _ = make_operands("block_1x128_128x128", 16, 512, 256)
    expanded = sa[:, :1].expand(16, 4)  # a stride of 0: no unit stride... along K
    with pytest.raises(RuntimeError, match=r"argument 'scale_a' expected a row-major or "
                                           r"column-major layout .* with strides \[1, 0\]"):
        gemmt.scaled_mm(a, b, expanded, sb)
    every_other = torch.ones(4, 4)[:, ::2]  # (4, 2) scale_b with strides (4, 2)
    with pytest.raises(RuntimeError, match=r"argument 'scale_b' expected a row-major"):
        gemmt.scaled_mm(a, b, sa, every_other)


def test_scaled_mm_devices_must_match_and_meta_checks_shapes_only() -> None:
    g = good_rowwise()
    meta = {k: v.to("meta") for k, v in g.items()}
    assert gemmt.scaled_mm(**meta).shape == (32, 48)
    assert gemmt.scaled_mm(**meta).dtype == torch.bfloat16
    meta["scale_a"] = -torch.ones(32, 1, device="meta")  # values unknown on Meta: accepted
    assert gemmt.scaled_mm(**meta).shape == (32, 48)
    with pytest.raises(RuntimeError, match="gemmt::scaled_mm: .*'scale_a' and 'scale_b' match none"):
        gemmt.scaled_mm(**{**meta, "scale_a": torch.ones(31, 1, device="meta")})
    with pytest.raises(RuntimeError, match="gemmt::scaled_mm: arguments 'a' and 'scale_a' "
                                           "expected tensors on the same device"):
        gemmt.scaled_mm(g["a"], g["b"], g["scale_a"].to("meta"), g["scale_b"])


@pytest.mark.parametrize("kwargs,pattern", [
    ({"granularity": "column"}, r"argument 'granularity' expected one of tensor, row, block, "
                                r"block_128x128, got 'column'"),
    ({"dtype": torch.int8}, r"argument 'dtype' expected Float8_e4m3fn or Float8_e5m2"),
    ({"dtype": torch.bfloat16}, r"argument 'dtype' expected Float8"),
    ({"x": torch.ones(4, 4, dtype=torch.int32)}, r"argument 'x' expected dtype Float"),
    ({"x": torch.ones(2, 4, 4)}, r"argument 'x' expected a 2-D tensor"),
])
def test_quantize_bad_input(kwargs: dict[str, Any], pattern: str) -> None:
    args = {"x": torch.ones(4, 4), **kwargs}
    with pytest.raises(RuntimeError, match="gemmt::quantize_fp8: " + pattern):
        gemmt.quantize_fp8(**args)
    with pytest.raises(RuntimeError, match="gemmt::quantize_fp8_with_transpose: " + pattern):
        gemmt.quantize_fp8_with_transpose(**args)


def test_ops_refuse_inputs_that_require_grad() -> None:
    g = good_rowwise()
    bias = torch.ones(48, requires_grad=True)
    with pytest.raises(RuntimeError, match="gemmt::scaled_mm is not differentiable, but "
                                           "argument 'bias' requires grad.*Float8Linear"):
        gemmt.scaled_mm(**g, bias=bias)
    with torch.no_grad():
        assert gemmt.scaled_mm(**g, bias=bias).shape == (32, 48)
    x = torch.ones(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="gemmt::quantize_fp8 is not differentiable"):
        gemmt.quantize_fp8(x)
    with pytest.raises(RuntimeError, match="gemmt::quantize_fp8_with_transpose is not diff"):
        gemmt.quantize_fp8_with_transpose(x)


CUDA_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def test_cuda_kernels_refuse_naming_the_op() -> None:
    # The CUDA kernels are registered and refuse a CPU tensor (or, in a build without CUDA,
    # say so): no silent fallback. Called through the CUDA key directly, so this runs without
    # a GPU.
    g = good_rowwise()
    ops = torch.ops.gemmt
    cuda_build = bool(gemmt.build_info().get("cuda"))
    with pytest.raises(RuntimeError, match=r"gemmt::scaled_mm: " + (
            r"the CUDA kernel expected CUDA tensors" if cuda_build
            else r"this build of gemmt has no CUDA kernels")):
        ops.scaled_mm.default.redispatch(CUDA_KEYSET, g["a"], g["b"], g["scale_a"], g["scale_b"],
                                         None, torch.bfloat16, "none", False)
    x = torch.randn(8, 16)
    why = (r"argument 'x' expected a CUDA tensor, got a 2-D Float tensor of shape \[8, 16\] on cpu"
           if cuda_build else r"this build of gemmt has no CUDA kernels")
    with pytest.raises(RuntimeError, match=r"gemmt::quantize_fp8: " + why):
        ops.quantize_fp8.default.redispatch(CUDA_KEYSET, x, "tensor", E4M3)
    with pytest.raises(RuntimeError, match=r"gemmt::quantize_fp8_with_transpose: " + why):
        ops.quantize_fp8_with_transpose.default.redispatch(CUDA_KEYSET, x, "row", E4M3)
    # The argument checks come first, on every backend.
    with pytest.raises(RuntimeError, match=r"gemmt::quantize_fp8: argument 'granularity'"):
        ops.quantize_fp8.default.redispatch(CUDA_KEYSET, x, "column", E4M3)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
def test_cuda_tensors_get_a_clear_error() -> None:
    g = {k: v.cuda() for k, v in good_rowwise().items()}
    with pytest.raises(RuntimeError, match=r"gemmt::scaled_mm: arguments 'a' and 'b' expected at "
                                           r"most one Float8_e5m2 operand"):
        gemmt.scaled_mm(**{**g, "a": g["a"].float().to(E5M2), "b": g["b"].float().to(E5M2)})
    with pytest.raises(RuntimeError, match=r"gemmt::quantize_fp8: argument 'x' expected dtype"):
        gemmt.quantize_fp8(torch.ones(8, 16, dtype=torch.int32, device="cuda"))


# ---- the CUDA quantisation kernels against the CPU reference, bit for bit ----

# Odd and empty shapes, and the widths at which the row kernel changes form (a team of up to
# 256 threads holding 8 elements each, 2 or 4 chunks per thread, 512-thread teams, and rows
# read twice beyond 16384 columns). Rows a multiple of 16 over several 128-row tiles (the
# transpose's 16-byte stores, a partial last tile among them) and a multiple of 4 only. A
# decode step's activations (16 x 4096, on eight CTAs of the tensorwise kernel's one-cluster
# form), the most that form takes (208 x 4096: eight stashes full) and just past it
# (208 x 4104: the grid).
CUDA_SHAPES = [(1, 1), (1, 7), (3, 130), (257, 4099), (0, 128), (128, 0), (0, 0), (128, 128),
               (129, 257), (200, 384), (5, 3), (1000, 9), (2, 4096), (3, 5000), (2, 8192),
               (2, 12288), (2, 16384), (2, 17000), (1, 40000), (40000, 1), (272, 4100),
               (384, 1000), (516, 260), (16, 4096), (208, 4096), (208, 4104)]


def cuda_input(shape: tuple[int, int], x_dtype: torch.dtype) -> torch.Tensor:
    """Random data spread over six decades across the columns, an all-zero row and column."""
    rows, cols = shape
    x = torch.randn(rows, cols, dtype=torch.float64) * torch.logspace(-3, 3, max(cols, 1),
                                                                     dtype=torch.float64)[:cols]
    if rows > 2 and cols > 2:
        x[1] = 0
        x[:, 2] = 0
    return x.to(x_dtype).cuda()


def assert_same_quantized(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> None:
    """CUDA outputs (q, scale[, qt, scale_t]) equal the CPU reference's: bytes, values, layouts."""
    assert len(got) == len(ref)
    for i in range(0, len(got), 2):
        q, s = got[i], got[i + 1]
        q_ref, s_ref = ref[i], ref[i + 1]
        assert q.is_cuda and s.is_cuda
        assert q.dtype == q_ref.dtype and q.shape == q_ref.shape and q.is_contiguous()
        assert s.dtype == torch.float32 and s.shape == s_ref.shape and s.stride() == s_ref.stride()
        qb, qb_ref = q.cpu().view(torch.uint8), q_ref.view(torch.uint8)
        if not torch.equal(qb, qb_ref):
            bad = (qb != qb_ref).nonzero()
            r, c = bad[0].tolist()
            raise AssertionError(f"output {i}: {len(bad)} bytes differ, first at [{r}, {c}]: "
                                 f"{qb[r, c].item():#04x} vs {qb_ref[r, c].item():#04x}")
        # No NaN where the reference has none (implied by the bytes; said plainly).
        assert torch.equal(torch.isnan(q.cpu().float()), torch.isnan(q_ref.float()))
        assert torch.isfinite(s).all()
        assert torch.equal(s.cpu(), s_ref), (s.cpu() - s_ref).abs().max()


def check_cuda_quantize(x: torch.Tensor, granularity: str, dtype: torch.dtype) -> None:
    x_cpu = x.cpu()
    assert_same_quantized(gemmt.quantize_fp8(x, granularity, dtype),
                          gemmt.quantize_fp8(x_cpu, granularity, dtype))
    assert_same_quantized(gemmt.quantize_fp8_with_transpose(x, granularity, dtype),
                          gemmt.quantize_fp8_with_transpose(x_cpu, granularity, dtype))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_quantize_cuda_matches_cpu(granularity: str, dtype: torch.dtype, x_dtype: torch.dtype,
                                   shape: tuple[int, int]) -> None:
    check_cuda_quantize(cuda_input(shape, x_dtype), granularity, dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("m", [0, 5, 300])
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_scaled_mm_cuda_empty_contraction(m: int, activation: str) -> None:
    """K = 0 on the GPU, as on the CPU: C = act(bias) (zeros without a bias), tensorwise and
    rowwise, few rows (the decode path's range) and many."""
    a = torch.zeros(m, 0, device="cuda").to(E4M3)
    b = torch.zeros(0, 24, device="cuda").to(E4M3).t().contiguous().t()
    bias = torch.randn(24, device="cuda", dtype=torch.bfloat16)
    scales = [(torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")),
              (torch.rand(m, 1, device="cuda"), torch.rand(1, 24, device="cuda"))]
    for sa, sb in scales:
        out = torch.ops.gemmt.scaled_mm(a, b, sa, sb, bias, torch.bfloat16, activation, False)
        want = torch.nn.functional.gelu(bias.float()) if activation == "gelu" else bias.float()
        assert out.shape == (m, 24)
        torch.testing.assert_close(out.float(), want.expand(m, 24), rtol=2 ** -7, atol=0)
        out = torch.ops.gemmt.scaled_mm(a, b, sa, sb, None, torch.float32, activation, False)
        assert torch.equal(out, torch.zeros(m, 24, device="cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(4100, 8200), (2053, 16512)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_quantize_cuda_many_tiles_per_cta(granularity: str, x_dtype: torch.dtype,
                                          shape: tuple[int, int]) -> None:
    # More tiles and batches than a resident grid has CTAs (every CTA walks several, its
    # prefetch ring turning over), rows and columns both ragged, against the CPU reference;
    # then a view whose rows end in a partial chunk of 8 (read element by element beside the
    # vector loads of the whole ones).
    check_cuda_quantize(cuda_input(shape, x_dtype), granularity, E4M3)
    rows, cols = shape
    check_cuda_quantize(cuda_input((rows, cols + 8), x_dtype)[:, :cols - 5], granularity, E4M3)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_quantize_cuda_strided_inputs(granularity: str, x_dtype: torch.dtype) -> None:
    base = cuda_input((300, 1100), x_dtype)
    views = {
        "row stride, aligned": base[:, :1024],          # vector loads, stride != cols
        "row stride, offset 3": base[5:262, 3:1030],    # unaligned: element loads
        "every other row": base[::2, :515],
        "transposed": base[:260, :140].t(),              # unit row stride: made contiguous
        "one column": base[:, 7:8],
    }
    for name, x in views.items():
        try:
            for dtype in (E4M3, E5M2):
                check_cuda_quantize(x, granularity, dtype)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_quantize_cuda_special_values(granularity: str, x_dtype: torch.dtype) -> None:
    nan = float("nan")
    x = torch.randn(260, 300, dtype=torch.float64) * 10
    x[0, :5] = torch.tensor([float("inf"), -float("inf"), nan, -nan, 3.0])
    x[3] = torch.tensor(-nan)                      # negative NaN: its sign reaches the byte
    x[4] = float("inf")                            # no finite element: the all-zero scale
    x[5] = 0.0                                     # all zero
    x[6, ::2] = -0.0                               # negative zeros keep their sign
    x[7] = torch.logspace(-45, -36, 300, dtype=torch.float64)  # float32 subnormals
    x[8, :10] = 1e-30
    x[9, 100:] = 3e38                              # near float32's largest
    x[10, 3] = 1e39 if x_dtype == torch.float64 else 3e38  # beyond float32: inf once converted
    x[:, 250] = nan                                # a NaN column
    x[:, 251] = float("inf")
    x[200:260, 128:256] = 0.0                      # an all-zero 128-block region
    xc = x.to(x_dtype).cuda()
    for dtype in (E4M3, E5M2):
        check_cuda_quantize(xc, granularity, dtype)
        q, s = gemmt.quantize_fp8(xc, granularity, dtype)
        # NaN stays NaN with its sign (c10's byte 0x7f | sign), whatever the formats did to it.
        # (Row 3's column 251 is +inf, which saturates: only its NaN columns are checked. The
        # signs are read in x's own dtype: converting float16 NaNs to float32 on the CPU does
        # not keep every sign.)
        row = xc[3].cpu()
        nan_cols = torch.isnan(row)
        assert nan_cols.sum() == row.numel() - 1
        sign = torch.signbit(row[nan_cols]).to(torch.uint8) * 0x80
        assert torch.equal(q[3].cpu().view(torch.uint8)[nan_cols], sign | 0x7F)
        # The NaN column, but for rows 200-259, which the all-zero region overwrote.
        nan_rows = torch.isnan(xc[:, 250].cpu())
        assert nan_rows.sum() == 200
        assert torch.isnan(q[:, 250].cpu().float()[nan_rows]).all()


def amax_over_the_float_range() -> torch.Tensor:
    """Float32 amaxes in every binade with random significands, and the values at and either
    side of the 1e-12 floor, 0, the subnormals, the smallest normal, FLT_MAX and the formats'
    maxima."""
    g = torch.Generator().manual_seed(7)
    bits = torch.randint(0, 0x7F800000, (1 << 16,), generator=g, dtype=torch.int64)
    f32 = torch.finfo(torch.float32)
    edges = torch.tensor([1e-12, 0.0, f32.smallest_normal * 2**-23, f32.smallest_normal, f32.max,
                          1.0, 448.0, 57344.0, 2.0**-40, 3.0], dtype=torch.float32)
    top = torch.full_like(edges, f32.max)
    return torch.cat([bits.to(torch.int32).view(torch.float32), edges,
                      torch.nextafter(edges, torch.zeros_like(edges)),
                      torch.nextafter(edges, top)])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_quantize_cuda_scales_over_the_float_range(granularity: str, dtype: torch.dtype) -> None:
    # One group per row, its amax from amax_over_the_float_range: the multiplier
    # float(fp8_max / max(amax, 1e-12)) (divided in double) and its float reciprocal, bit for
    # bit, from the row and 1x128 kernels (and their transposes) as from the CPU reference.
    amax = amax_over_the_float_range()
    x = torch.stack([amax, -amax / 2, amax / 3, torch.zeros_like(amax)], dim=1)
    xc = x.cuda()
    check_cuda_quantize(xc, granularity, dtype)
    _, s = gemmt.quantize_fp8(xc, granularity, dtype)
    top = 448.0 if dtype == E4M3 else 57344.0
    mult = (top / amax.double().clamp_min(1e-12)).float()
    assert torch.equal(s.cpu().reshape(-1), mult.reciprocal())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
def test_quantize_cuda_against_the_formulas_and_torch_layouts() -> None:
    # Independently of the CPU op: the float64 formulas of ref_quantize.
    x = (torch.randn(384, 640) * torch.logspace(-2, 2, 640)).to(torch.bfloat16)
    for granularity in gemmt.FP8_GRANULARITIES:
        for dtype in (E4M3, E5M2):
            q, s = gemmt.quantize_fp8(x.cuda(), granularity, dtype)
            q_ref, s_ref = ref_quantize(x, granularity, dtype)
            assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
            assert torch.equal(s.cpu(), s_ref)
    _, s = gemmt.quantize_fp8(x.cuda(), "block")
    assert s.stride() == (1, 384)  # torch's column-major 1x128 scales
    _, _, qt, st = gemmt.quantize_fp8_with_transpose(x.cuda(), "block")
    assert qt.shape == (640, 384) and qt.is_contiguous() and st.shape == (640, 3)
    assert st.stride() == (1, 640)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
@pytest.mark.parametrize("granularity", gemmt.FP8_GRANULARITIES)
@pytest.mark.parametrize("shape", [(3000, 2500), (16, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_quantize_cuda_in_a_cuda_graph(granularity: str, shape: tuple[int, int]) -> None:
    # Captured once and replayed on new data in the same input buffer (the tensorwise kernel
    # is a cooperative launch with a grid-wide barrier whose counter is reset each replay, or,
    # decode-sized, one cluster).
    x = cuda_input(shape, torch.bfloat16)
    gemmt.quantize_fp8(x, granularity)  # loads the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = gemmt.quantize_fp8(x, granularity)
    for scale in (1.0, 1e-3, 7.0):
        x.copy_(cuda_input(shape, torch.bfloat16) * scale)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_quantized((q, s), gemmt.quantize_fp8(x.cpu(), granularity))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
def test_quantize_cuda_stream_and_device_and_repeat() -> None:
    # On a side stream, the results are the same; repeated calls (the tensor amax workspace
    # is zeroed on the stream each time) give the same bytes.
    x = cuda_input((1000, 3000), torch.bfloat16)
    ref = [gemmt.quantize_fp8_with_transpose(x.cpu(), g) for g in gemmt.FP8_GRANULARITIES]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [gemmt.quantize_fp8_with_transpose(x, g) for g in gemmt.FP8_GRANULARITIES]
        outs2 = [gemmt.quantize_fp8_with_transpose(x * 1, g) for g in gemmt.FP8_GRANULARITIES]
    side.synchronize()
    for o, o2, r in zip(outs, outs2, ref):
        assert_same_quantized(o, r)
        assert_same_quantized(o2, r)
    if torch.cuda.device_count() > 1:
        x1 = x.to("cuda:1")
        for g, r in zip(gemmt.FP8_GRANULARITIES, ref):
            out = gemmt.quantize_fp8_with_transpose(x1, g)
            assert all(t.device == x1.device for t in out)
            assert_same_quantized(out, r)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
def test_quantize_cuda_opcheck() -> None:
    x = torch.randn(136, 200, device="cuda")
    for gran in gemmt.FP8_GRANULARITIES:
        for op, args in ((torch.ops.gemmt.quantize_fp8, (x, gran, E5M2)),
                         (torch.ops.gemmt.quantize_fp8_with_transpose, (x.bfloat16(), gran))):
            result = torch.library.opcheck(op, args)
            failed = {k: v for k, v in result.items() if v != "SUCCESS"}
            assert not failed, (op, gran, failed)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of gemmt")
def test_quantize_cuda_over_2_31_elements() -> None:
    # 65537 x 32768 bfloat16 (2^31 + 32768 elements): 64-bit indexing. Rows and 1x128 blocks
    # are checked against the CPU reference on the first and last rows (beyond element 2^31);
    # the tensor amax against torch's.
    rows, cols = 65537, 32768
    need = rows * cols * 2 + rows * cols + (1 << 30)
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} free")
    x = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda").normal_()
    x[-1, -5:] = 1e4  # the tensor amax sits in the last row
    for granularity in ("row", "block"):
        q, s = gemmt.quantize_fp8(x, granularity)
        for part in (slice(0, 64), slice(rows - 64, rows)):
            q_ref, s_ref = gemmt.quantize_fp8(x[part].cpu(), granularity)
            assert torch.equal(q[part].cpu().view(torch.uint8), q_ref.view(torch.uint8))
            assert torch.equal(s[part].cpu(), s_ref)
        del q, s
    q, s = gemmt.quantize_fp8(x, "tensor")
    amax = x.abs().max().double().item()
    mult = torch.tensor(448.0 / max(amax, 1e-12), dtype=torch.float64).float()
    assert s.item() == mult.reciprocal().item()
    last = x[-64:].cpu().float()
    q_ref = (last * mult).clamp(-448.0, 448.0).to(E4M3)
    assert torch.equal(q[-64:].cpu().view(torch.uint8), q_ref.view(torch.uint8))


# ---- opcheck and torch.compile ----

def opcheck_cases(device: str) -> list[tuple[Any, tuple, dict]]:
    """Collected by test_autograd_opcheck.test_every_registered_op_is_opchecked."""
    g = torch.ops.gemmt
    cases: list[tuple[Any, tuple, dict]] = []
    for mode in MODES:
        a, b, sa, sb, _, _ = make_operands(mode, 40, 256, 136)
        cases.append((g.scaled_mm, (a, b, sa, sb), {}))
    a, b, sa, sb, _, _ = make_operands("rowwise", 16, 64, 32)
    cases.append((g.scaled_mm, (a, b, sa, sb, torch.randn(32), torch.float32, "gelu_tanh"), {}))
    x = torch.randn(136, 200)
    for gran in gemmt.FP8_GRANULARITIES:
        cases.append((g.quantize_fp8, (x, gran, E5M2), {}))
        cases.append((g.quantize_fp8_with_transpose, (x.to(torch.bfloat16), gran), {}))
    return cases


def test_fp8_opcheck() -> None:
    for op, args, kwargs in opcheck_cases("cpu"):
        opcheck_float8(op, args, kwargs, float8_inputs=op is torch.ops.gemmt.scaled_mm)


def test_scaled_mm_torch_compile_fullgraph() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xq, xs = gemmt.quantize_fp8(x, "block")
        wq, ws = gemmt.quantize_fp8(w, "block_128x128")
        return gemmt.scaled_mm(xq, wq.t(), xs, ws.t(), None, torch.float32, "silu")

    x, w = torch.randn(48, 256), torch.randn(136, 256)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, w), fn(x, w))


# ---- Float8Linear and convert_to_float8 ----

RECIPE_GRANS = {"tensorwise": ("tensor", "tensor", "tensor", E5M2),
                "rowwise": ("row", "row", "row", E4M3),
                "blockwise": ("block", "block_128x128", "block", E4M3)}


def emulate_float8_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                          g: torch.Tensor, recipe: str
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 products of the dequantised operands each of the three products should see:
    (y, grad_x, grad_w), x and g 2-D."""
    gx_, gw_, gg_, gdt = RECIPE_GRANS[recipe]

    def dq(t: torch.Tensor, gran: str, dtype: torch.dtype = E4M3) -> torch.Tensor:
        return dequant(*ref_quantize(t, gran, dtype), gran)

    y = dq(x, gx_) @ dq(w, gw_).t() + (0 if b is None else b.double())
    grad_x = dq(g, gg_, gdt) @ dq(w.t().contiguous(), gw_).t()
    grad_w = dq(g.t().contiguous(), gg_, gdt) @ dq(x.t().contiguous(), gx_).t()
    return y, grad_x, grad_w


@pytest.mark.parametrize("recipe", gemmt.nn.FLOAT8_RECIPES)
@pytest.mark.parametrize("tokens", [256, 200])  # 200: grad_W pads the tokens
def test_float8_linear_training_products(recipe: str, tokens: int) -> None:
    layer = gemmt.nn.Float8Linear(256, 384, recipe=recipe)
    x = torch.randn(tokens, 256, requires_grad=True)
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref, gx_ref, gw_ref = emulate_float8_linear(x.detach(), layer.weight.detach(),
                                                  layer.bias.detach(), g, recipe)
    assert rel_err(y, y_ref) < 2e-6
    assert rel_err(x.grad, gx_ref) < 2e-6
    assert rel_err(layer.weight.grad, gw_ref) < 2e-6
    torch.testing.assert_close(layer.bias.grad, g.sum(0), rtol=1e-6, atol=1e-5)
    # And FP8 is within its tolerance of the float64 Linear.
    x64, w64 = x.detach().double(), layer.weight.detach().double()
    assert rel_err(y, x64 @ w64.t() + layer.bias.detach().double()) < 0.06
    assert rel_err(x.grad, g.double() @ w64) < (0.1 if recipe == "tensorwise" else 0.06)
    assert rel_err(layer.weight.grad, g.double().t() @ x64) < (0.1 if recipe == "tensorwise"
                                                                else 0.06)


@pytest.mark.parametrize("recipe", gemmt.nn.FLOAT8_RECIPES)
@pytest.mark.parametrize("activation", gemmt.ACTIVATIONS)
def test_float8_linear_eager_no_grad_and_inference_agree(recipe: str, activation: str) -> None:
    torch.manual_seed(3)
    base = torch.nn.Linear(128, 256, dtype=torch.bfloat16)
    train = gemmt.nn.Float8Linear.from_linear(base, recipe, activation=activation)
    infer = gemmt.nn.Float8Linear.from_linear(base, recipe, inference=True, activation=activation)
    x = torch.randn(3, 10, 128, dtype=torch.bfloat16, requires_grad=True)
    y_train = train(x)  # recorded: the activation after the product
    with torch.no_grad():
        y_fused = train(x)  # the activation fused into scaled_mm
        y_infer = infer(x)
    assert y_train.shape == (3, 10, 256) and y_train.dtype == torch.bfloat16
    assert torch.equal(y_fused, y_infer)
    assert rel_err(y_train, y_fused) < 8e-3  # one extra bf16 rounding before the activation
    ref = activate(F.linear(x.detach().double(), base.weight.double(), base.bias.double()),
                   activation)
    assert rel_err(y_fused, ref) < 0.07


@pytest.mark.parametrize("inference", [False, True])
def test_float8_linear_batched_output_is_not_a_view(inference: bool) -> None:
    """A batched input's output is no view of the 2-D product (FSDP2 hooks module outputs for
    the backward, and an in-place op on a view, such as a residual add, would drop the hook),
    and holds the 2-D product's values; its gradient reaches the input."""
    torch.manual_seed(4)
    layer = gemmt.nn.Float8Linear(32, 48, recipe="rowwise", inference=inference)
    x = torch.randn(2, 5, 32, requires_grad=not inference)
    for grad in ((False, True) if not inference else (False,)):
        with torch.set_grad_enabled(grad):
            y = layer(x)
            flat = layer(x.reshape(10, 32))
        assert y.shape == (2, 5, 48) and not y._is_view(), grad
        assert torch.equal(y.reshape(10, 48), flat), grad
    if not inference:
        y = layer(x)
        y += 1.0  # in place on the output: allowed, and the backward still runs
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


def test_float8_linear_inference_quantises_weight_once() -> None:
    base = torch.nn.Linear(64, 32)
    layer = gemmt.nn.Float8Linear.from_linear(base, "rowwise", inference=True)
    x = torch.randn(5, 64)
    with torch.no_grad():
        y0 = layer(x)
        base.weight.mul_(2)  # shared parameter, changed in place: the cache stays
        assert torch.equal(layer(x), y0)
        layer.requantize_weight()
        y1 = layer(x)
    assert not torch.equal(y1, y0)
    layer.load_state_dict({"weight": torch.zeros(32, 64), "bias": torch.zeros(32)})
    with torch.no_grad():
        assert torch.equal(layer(x), torch.zeros(5, 32))
    with pytest.raises(RuntimeError, match="inference=True has no backward"):
        layer(x.requires_grad_())


@pytest.mark.parametrize("recipe", gemmt.nn.FLOAT8_RECIPES)
def test_float8_linear_fast_accum_defaults_and_override(recipe: str) -> None:
    # torchao's choice per recipe: the forward with the tensor cores' own accumulation for
    # tensorwise and rowwise; blockwise sums every 128-deep block in float32.
    base = torch.nn.Linear(128, 128)
    assert gemmt.nn.Float8Linear(128, 128, recipe=recipe).fast_accum == (recipe != "blockwise")
    assert not gemmt.nn.Float8Linear.from_linear(base, recipe, fast_accum=False).fast_accum
    model = gemmt.nn.convert_to_float8(torch.nn.Sequential(base), recipe, fast_accum=True)
    assert model[0].fast_accum and "fast_accum=True" in repr(model[0])
    with pytest.raises(ValueError, match="argument 'fast_accum' expected None, True or False, "
                                         "got 'yes'"):
        gemmt.nn.Float8Linear(128, 128, recipe=recipe, fast_accum="yes")  # type: ignore[arg-type]


def test_float8_linear_bad_configuration() -> None:
    with pytest.raises(ValueError, match="in_features expected a multiple of 16 for recipe "
                                         "'tensorwise', got 40"):
        gemmt.nn.Float8Linear(40, 64)
    with pytest.raises(ValueError, match="out_features expected a multiple of 128 for recipe "
                                         "'blockwise', got 64"):
        gemmt.nn.Float8Linear(128, 64, recipe="blockwise")
    with pytest.raises(ValueError, match="argument 'recipe' expected one of tensorwise, "
                                         "rowwise, blockwise, got 'mxfp8'"):
        gemmt.nn.Float8Linear(128, 128, recipe="mxfp8")
    with pytest.raises(TypeError, match="expected float32, float16 or bfloat16"):
        gemmt.nn.Float8Linear(16, 16, dtype=torch.float64)(torch.randn(2, 16, dtype=torch.float64))


def test_convert_to_float8() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        gemmt.nn.Linear(512, 256, activation="gelu"),
        torch.nn.Linear(256, 64),  # 64: not a multiple of 128, kept for blockwise
        torch.nn.Linear(64, 10),  # 10: never converted
    )
    params = {n: p for n, p in model.named_parameters()}
    keys = set(model.state_dict())
    gemmt.nn.convert_to_float8(model, recipe="blockwise")
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Float8Linear", "ReLU", "Float8Linear", "Linear", "Linear"]
    assert model[2].activation == "gelu" and model[0].recipe == "blockwise"
    assert set(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())  # shared, not copied
    gemmt.nn.convert_to_float8(model, recipe="tensorwise", include=lambda name, m: name != "4")
    assert type(model[3]).__name__ == "Float8Linear" and type(model[4]) is torch.nn.Linear
    single = gemmt.nn.convert_to_float8(torch.nn.Linear(32, 48), "rowwise", inference=True)
    assert isinstance(single, gemmt.nn.Float8Linear) and single.inference
    assert isinstance(single, torch.nn.Linear)
    with pytest.raises(ValueError, match="argument 'recipe'"):
        gemmt.nn.convert_to_float8(model, recipe="row")


@pytest.mark.parametrize("recipe", gemmt.nn.FLOAT8_RECIPES)
def test_float8_linear_torch_compile_forward_backward(recipe: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 128))
    gemmt.nn.convert_to_float8(model, recipe=recipe)
    x = torch.randn(4, 64, 128)

    def step(m: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        for p in m.parameters():
            p.grad = None
        out = m(x).square().mean()
        out.backward()
        return out.detach(), [p.grad.clone() for p in m.parameters()]

    eager_loss, eager_grads = step(model)
    compiled = torch.compile(model, backend="aot_eager")
    loss, grads = step(compiled)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()


# ---- DTensor sharding rules ----

def test_fp8_sharding_rules_without_processes() -> None:
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor import Partial, Replicate, Shard
    from conftest import RuleSpec as Spec

    R = Replicate()
    a, b, bias = Spec(64, 256), Spec(256, 384), Spec(384)

    def rules(sa: Spec, sb: Spec, activation: str = "none") -> dict[str, Any]:
        found = gemmt.distributed.rules_for("scaled_mm", a, b, sa, sb, bias, torch.bfloat16,
                                            activation, False)
        return {r.name: r for r in found}

    row = rules(Spec(64, 1), Spec(1, 384))
    assert row["row-split a"].inputs[:5] == (Shard(0), R, Shard(0), R, R)
    assert row["column-split b"].inputs[:5] == (R, Shard(1), R, Shard(1), Shard(0))
    assert row["split K"].inputs[:5] == (Shard(1), Shard(0), R, R, Partial())
    assert row["split K"].outputs == (Partial(),)
    assert "split K" not in rules(Spec(64, 1), Spec(1, 384), "relu")
    tensor = rules(Spec(), Spec())
    assert set(tensor) == {"replicated", "row-split a", "column-split b", "split K"}
    assert tensor["row-split a"].inputs[2] == R
    # Blockwise 1x128 x 128x128: a splits by rows with its scale, b's 128x128 scale not at
    # all, and K never (a shard boundary need not fall on a 128-block's).
    block = rules(Spec(64, 2), Spec(2, 3))
    assert set(block) == {"replicated", "row-split a"}
    block = rules(Spec(64, 2), Spec(2, 384))  # 1x128 x 128x1
    assert set(block) == {"replicated", "row-split a", "column-split b"}
    x = Spec(64, 256)
    for gran, split in (("tensor", False), ("row", True), ("block", True),
                        ("block_128x128", False)):
        names = {r.name for r in gemmt.distributed.rules_for("quantize_fp8", x, gran, E4M3)}
        assert ("row-split x" in names) == split, gran
        names = {r.name for r in gemmt.distributed.rules_for("quantize_fp8_with_transpose", x,
                                                             gran, E4M3)}
        assert names == {"replicated"}


def test_fp8_ops_on_dtensor_one_process(tmp_path: Any) -> None:
    # DTensor runs the ops through the registered rules (a world of one: no data moves).
    import os
    import subprocess
    import sys

    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    code = (
        "import os, torch, torch.distributed as dist, gemmt\n"
        "from torch.distributed.tensor import DTensor, DeviceMesh, Replicate, Shard\n"
        "dist.init_process_group('gloo', store=dist.FileStore(os.environ['STORE'], 1), rank=0,"
        " world_size=1)\n"
        "mesh = DeviceMesh('cpu', [0])\n"
        "d = lambda t, p: DTensor.from_local(t, mesh, [p], run_check=False)\n"
        "x, w = torch.randn(64, 128), torch.randn(96, 128)\n"
        "xq, xs = gemmt.quantize_fp8(x, 'row'); wq, ws = gemmt.quantize_fp8(w, 'row')\n"
        "ref = gemmt.scaled_mm(xq, wq.t(), xs, ws.t(), out_dtype=torch.float32)\n"
        "out = gemmt.scaled_mm(d(xq, Shard(0)), d(wq.t(), Replicate()), d(xs, Shard(0)),"
        " d(ws.t(), Replicate()), out_dtype=torch.float32)\n"
        "assert out.placements == (Shard(0),), out.placements\n"
        "assert torch.equal(out.to_local(), ref)\n"
        "q, s = gemmt.quantize_fp8(d(x, Shard(0)), 'row')\n"
        "assert q.placements == (Shard(0),) and s.placements == (Shard(0),)\n"
        "assert torch.equal(s.to_local(), xs)\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, STORE=str(tmp_path / "store"))
    env["GEMMT_LIBRARY"] = gemmt.library_path()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ---- python -m gemmt bench fp8_quant ----

def test_bench_fp8_quant_bytes_and_cli(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gemmt import bench_fp8_quant
    from gemmt.__main__ import main

    # bfloat16 in, one byte per element out, float32 scales.
    assert bench_fp8_quant.min_bytes(8192, 8192, torch.bfloat16, "row", False) == (
        8192 * 8192 * 3 + 4 * 8192)
    assert bench_fp8_quant.min_bytes(256, 384, torch.float32, "block", True) == (
        256 * 384 * 4 + 2 * 256 * 384 + 4 * 256 * 3 + 4 * 384 * 2)
    assert bench_fp8_quant.min_bytes(300, 200, torch.bfloat16, "block_128x128", False) == (
        300 * 200 * 3 + 4 * 3 * 2)
    # The summary: per granularity and transpose, the median and worst over the shapes.
    recs = [{"granularity": g, "with_transpose": t, "ratio_to_copy": v}
            for g, t, v in [("row", False, 0.9), ("row", False, 0.7), ("row", False, 1.0),
                            ("row", True, 0.5), ("block", False, 0.8)]]
    assert bench_fp8_quant.summarize(recs) == {
        "row": {"median": 0.9, "worst": 0.7, "points": 3},
        "row+transpose": {"median": 0.5, "worst": 0.5, "points": 1},
        "block": {"median": 0.8, "worst": 0.8, "points": 1}}
    out = tmp_path / "fp8.json"
    if not HAS_CUDA:
        assert main(["bench", "fp8_quant", "--out", str(out)]) == 1 and not out.exists()
        return
    monkeypatch.setattr(bench_fp8_quant, "SHAPES", [(256, 384)])
    assert main(["bench", "fp8_quant", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    records = doc["records"]
    assert doc["summary"] == bench_fp8_quant.summarize(records)
    assert len(records) == 2 * len(gemmt.FP8_GRANULARITIES)
    assert {(r["granularity"], r["with_transpose"]) for r in records} == {
        (g, t) for g in gemmt.FP8_GRANULARITIES for t in (False, True)}
    for r in records:
        assert r["ms"] > 0 and r["gbps"] > 0 and r["copy_gbps"] > 0
        assert r["ratio_to_copy"] == pytest.approx(r["gbps"] / r["copy_gbps"])


def test_convergence_script_runs_and_compares(tmp_path: Path) -> None:
    # benchmarks/fp8_convergence.py in two steps: every recipe converts the blocks' sixteen
    # products (not the head), starts from the same weights and batches as bf16, and the
    # verdict is the comparison of the losses it records.
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fp8_convergence.py"
    spec = importlib.util.spec_from_file_location("fp8_convergence", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main(["--steps", "2", "--batch", "2", "--out", str(tmp_path)])
    doc = json.loads(next(tmp_path.glob("fp8_convergence_cpu_*.json")).read_text())
    base, *fp8 = doc["runs"]
    assert [r["recipe"] for r in doc["runs"]] == ["bf16", "tensorwise", "rowwise", "blockwise"]
    assert base["converted_linears"] == 0 and all(r["converted_linears"] == 16 for r in fp8)
    for r in fp8:
        # Same start, same first batch: the first losses differ by FP8's rounding only.
        assert abs(r["losses"][0] / base["losses"][0] - 1) < 0.02, r["losses"]
    assert code == (0 if all(r["within_tolerance"] for r in fp8) else 1)
