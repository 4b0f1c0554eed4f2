"""Property-based tests: random shapes, strides, storage offsets, dtypes and alpha/beta for
every op, against float64 or exact references, on every device present."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemmt
from conftest import DEVICES, divide_ref, rel_err, tol_for

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])


def view(draw, rows: int, cols: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A rows x cols matrix with a random layout: transposed or not, a column step, an offset."""
    transposed = draw(st.booleans())
    step = draw(st.integers(1, 3))
    offset = draw(st.integers(0, 3))
    r, c = (cols, rows) if transposed else (rows, cols)
    base = torch.randn(offset + r * c * step, device=device).to(dtype)
    t = base[offset:].view(r, c * step)[:, ::step]
    return t.t() if transposed else t


@st.composite
def gemm_problem(draw, device: str):
    dtype = draw(DTYPES)
    m, n, k = (draw(st.integers(0, 70)) for _ in range(3))
    a, b, c = view(draw, m, k, dtype, device), view(draw, k, n, dtype, device), view(
        draw, m, n, dtype, device)
    alpha = draw(st.sampled_from([1.0, -0.5, 2.0]))
    beta = draw(st.sampled_from([0.0, 1.0, 0.25]))
    return a, b, c, alpha, beta


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_random(device: str) -> None:
    @SETTINGS
    @given(gemm_problem(device))
    def check(problem) -> None:
        a, b, c, alpha, beta = problem
        expected = alpha * (a.double() @ b.double()) + (beta * c.double() if beta else 0)
        gemmt.gemm(c, a, b, alpha, beta)
        if c.numel():
            assert rel_err(c, expected) <= tol_for(a.dtype) * 2

    check()


@st.composite
def elementwise_problem(draw, device: str):
    dtype = draw(DTYPES)
    rows, cols = draw(st.integers(0, 40)), draw(st.integers(1, 40))
    return view(draw, rows, cols, dtype, device), view(draw, rows, cols, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_random(device: str) -> None:
    @SETTINGS
    @given(elementwise_problem(device), st.floats(-4, 4, allow_nan=False))
    def check(problem, factor: float) -> None:
        x, y = problem
        assert torch.equal(gemmt.add(x, y), x + y)
        assert torch.equal(gemmt.square(x), x * x)
        assert torch.equal(gemmt.scale(x, factor), x * factor)

    check()


@pytest.mark.parametrize("device", DEVICES)
def test_image_random(device: str) -> None:
    @SETTINGS
    @given(st.integers(0, 20), st.integers(1, 20), st.integers(0, 3), st.booleans(),
           st.floats(0.5, 70000))
    def check(h: int, w: int, offset: int, bgr: bool, max_val: float) -> None:
        raw = torch.randint(0, 256, (offset + h * w * 3,), dtype=torch.uint8, device=device)
        img = raw[offset:].view(h, w, 3)
        px = img.long()
        r, g, b = (px[..., 2], px[..., 1], px[..., 0]) if bgr else (px[..., 0], px[..., 1],
                                                                     px[..., 2])
        ref = ((299 * r + 587 * g + 114 * b + 500) // 1000).to(torch.uint8)
        assert torch.equal(gemmt.rgb_to_gray(img, bgr=bgr), ref)
        vol = torch.randint(0, 65536, (offset + h * w,), dtype=torch.int32,
                            device=device).to(torch.uint16)[offset:].view(h, w)
        assert torch.equal(gemmt.normalize_volume(vol, max_val), divide_ref(vol, max_val))

    check()
