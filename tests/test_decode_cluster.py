"""The Hopper cluster decode GEMM (kernels/sm90/decode_cluster.cu) through ``gemmt.linear``
under ``GEMMT_DECODE_SCHEDULE=new``, against a float64 reference, and the old schedule on the
same binary. Needs a Hopper GPU (sm_90) and a CUDA build; skipped otherwise."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import gemmt
from gemmt import _native

from conftest import HAS_CUDA

pytestmark = pytest.mark.cuda

HOPPER = HAS_CUDA and torch.cuda.get_device_capability(0) == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")


def _plan(m: int, n: int, k: int, dtype: torch.dtype) -> dict[str, Any]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return dict(_native.load().plan_decode_cluster(
        str(dtype).replace("torch.", ""), m, n, k, (k, 1), (1, k), n, (0, 0, 0), sms, 9))


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
               activation: str) -> torch.Tensor:
    z = x.double() @ w.double().t()
    if bias is not None:
        z = z + bias.double()
    if activation == "relu":
        z = torch.relu(z)
    elif activation == "gelu":
        z = torch.nn.functional.gelu(z)
    elif activation == "silu":
        z = torch.nn.functional.silu(z)
    return z


def _rel_err(out: torch.Tensor, want: torch.Tensor) -> float:
    return ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


# 16-bit products over K of 4096-5120: relative errors of a few 2^-9 at most.
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 3e-3}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 8, 64, 65, 129, 200, 255, 256])
@pytest.mark.parametrize("n,k", [(2048, 4096), (5120, 5120), (4104, 1032), (200, 8200)])
def test_new_schedule_matches_float64(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                      m: int, n: int, k: int) -> None:
    """Odd token counts (1 .. 256, every token tile), odd feature counts (4104 = 32 tiles and
    8 rows; 200 = one tile and a part), k not a multiple of the 64-element k-block."""
    torch.manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype)
    want = _reference(x, w, None, "none")
    plan = _plan(m, n, k, dtype)
    assert plan["supported"]
    monkeypatch.setenv("GEMMT_DECODE_SCHEDULE", "new")
    out = gemmt.linear(x, w)
    torch.cuda.synchronize()
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert _rel_err(out, want) < TOL[dtype], plan
    # The same product under the old schedule, on the same binary.
    monkeypatch.setenv("GEMMT_DECODE_SCHEDULE", "old")
    old = gemmt.linear(x, w)
    assert _rel_err(old, want) < TOL[dtype]


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [3, 100, 200])
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_new_schedule_applies_bias_and_activation(monkeypatch: pytest.MonkeyPatch,
                                                  dtype: torch.dtype, m: int,
                                                  activation: str) -> None:
    n, k = 5120, 5120
    torch.manual_seed(m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    assert _plan(m, n, k, dtype)["wanted"]
    monkeypatch.setenv("GEMMT_DECODE_SCHEDULE", "new")
    out = gemmt.linear(x, w, bias, activation)
    want = _reference(x, w, bias, activation)
    assert torch.isfinite(out).all()
    assert _rel_err(out, want) < TOL[dtype]


@needs_hopper
@pytest.mark.parametrize("m", [2, 65, 255])
def test_new_schedule_writes_only_its_outputs(monkeypatch: pytest.MonkeyPatch, m: int) -> None:
    """gemm into a NaN-poisoned view of a wider buffer (ldc = n + 64): with beta == 0 every
    output is written and C is never read (no NaN left), nothing past the n columns of a row
    is touched; then alpha and beta on finite C."""
    n, k = 2048, 4096
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
    assert _plan(m, n, k, torch.bfloat16)["wanted"]
    big = torch.full((m, n + 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("GEMMT_DECODE_SCHEDULE", "new")
    c = big[:, :n]
    gemmt.gemm(c, x, w.t())
    want = _reference(x, w, None, "none")
    assert not torch.isnan(c).any()
    assert torch.isnan(big[:, n:]).all()
    assert _rel_err(c, want) < TOL[torch.bfloat16]
    c0 = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    c1 = c0.clone()
    gemmt.gemm(c1, x, w.t(), 0.5, 2.0)
    assert _rel_err(c1, 0.5 * want + 2.0 * c0.double()) < TOL[torch.bfloat16]


@needs_hopper
def test_new_schedule_leaves_other_products_to_the_old_plans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 256 tokens, a k that is not a multiple of 8 and the 128k vocabulary the new
    schedule does not take: they run as before and stay exact to rounding."""
    monkeypatch.setenv("GEMMT_DECODE_SCHEDULE", "new")
    for m, n, k in [(257, 2048, 4096), (8, 2048, 4100), (100, 128256, 4096)]:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
        p = _plan(m, n, k, torch.bfloat16)
        assert not p.get("wanted", False)
        out = gemmt.linear(x, w)
        assert _rel_err(out, _reference(x, w, None, "none")) < TOL[torch.bfloat16]
