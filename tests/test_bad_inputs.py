"""The bad-input matrix: every op x every argument x every kind of awkward input.

Each case must either give the right answer or raise RuntimeError naming the op and the
argument. The outcomes are written to docs/bad_input_matrix_<device>.md by this test run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

import gemmt
from conftest import HAS_CUDA, REPO_ROOT, divide_ref

Thunk = Callable[[], object]


@dataclass
class Case:
    op: str
    arg: str
    kind: str
    run: Thunk
    # None: must raise RuntimeError naming op and arg; otherwise returns (result, expected).
    expect_error: bool
    check: Callable[[object], bool] | None = None


def misaligned(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    flat[1:] = t.reshape(-1)
    return flat[1:].view(t.shape)


def strided(t: torch.Tensor) -> torch.Tensor:
    big = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
    view = big[..., ::2]
    view.copy_(t)
    return view


def same(out: object, ref: torch.Tensor, tol: float = 0.0) -> bool:
    assert isinstance(out, torch.Tensor)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return False
    if tol == 0.0:
        return torch.equal(out.nan_to_num(), ref.nan_to_num()) and torch.equal(
            out.isnan(), ref.isnan())
    return torch.allclose(out.double().nan_to_num(), ref.double().nan_to_num(), rtol=tol,
                          atol=tol) and torch.equal(out.isnan(), ref.isnan())


def gemm_result(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    gemmt.gemm(c, a, b)
    return c


def gemm_fresh_c(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gemm into a new c of the shape a @ b would have (9 x 5 where a or b is malformed)."""
    rows = a.shape[0] if a.dim() == 2 else 9
    cols = b.shape[1] if b.dim() == 2 else 5
    return gemm_result(torch.empty(rows, cols, dtype=a.dtype, device=a.device), a, b)


def float_ref_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).to(a.dtype)


def cases_for(dev: str) -> list[Case]:
    other = "cpu" if dev == "cuda" else None
    f32 = dict(device=dev)
    out: list[Case] = []

    def add(op: str, arg: str, kind: str, run: Thunk, check: Callable[[object], bool] | None = None):
        out.append(Case(op, arg, kind, run, expect_error=check is None, check=check))

    # ---- gemm / mm: a (m, k), b (k, n), c (m, n) ----
    a, b, c = torch.randn(9, 7, **f32), torch.randn(7, 5, **f32), torch.empty(9, 5, **f32)
    ref = a.double() @ b.double()
    close = lambda r: same(r, ref.float(), 1e-5)  # noqa: E731
    for op in ("gemm", "mm"):
        call = gemm_fresh_c if op == "gemm" else gemmt.mm
        add(op, "a", "wrong dtype", lambda call=call: call(a.to(torch.int32), b))
        add(op, "b", "wrong dtype", lambda call=call: call(a, b.double() if dev == "cuda" else b.half()))
        add(op, "a", "wrong rank", lambda call=call: call(a[None], b))
        add(op, "b", "wrong rank", lambda call=call: call(a, b[0]))
        add(op, "b", "wrong shape", lambda call=call: call(a, torch.randn(6, 5, **f32)))
        add(op, "a", "non-contiguous", lambda call=call: call(a.t().contiguous().t(), b), close)
        add(op, "b", "non-contiguous", lambda call=call: call(a, strided(b)), close)
        add(op, "a", "misaligned", lambda call=call: call(misaligned(a), b), close)
        add(op, "b", "misaligned", lambda call=call: call(a, misaligned(b)), close)
        add(op, "a", "zero-size", lambda call=call: call(a[:0], b),
            lambda r: isinstance(r, torch.Tensor) and r.shape == (0, 5))
        add(op, "b", "zero-size (k=0)", lambda call=call: call(a[:, :0], b[:0]),
            lambda r: isinstance(r, torch.Tensor) and bool((r == 0).all()))
        nan_a = a.clone()
        nan_a[2, 3], nan_a[4, 0] = float("nan"), float("inf")
        add(op, "a", "NaN and Inf", lambda call=call, nan_a=nan_a: call(nan_a, b),
            lambda r, nan_a=nan_a: bool(r[2].isnan().all()) and bool(r[4].isinf().any() or r[4].isnan().any()))
        if other:
            add(op, "b", "other device", lambda call=call: call(a, b.to(other)))
    add("gemm", "c", "wrong dtype", lambda: gemmt.gemm(c.half(), a, b))
    add("gemm", "c", "wrong shape", lambda: gemmt.gemm(torch.empty(5, 9, **f32), a, b))
    add("gemm", "c", "wrong rank", lambda: gemmt.gemm(c[None], a, b))
    sq = torch.randn(8, 8, **f32)
    add("gemm", "c", "aliases a", lambda: gemmt.gemm(sq, sq, torch.randn(8, 8, **f32)))
    add("gemm", "c", "aliases b", lambda: gemmt.gemm(sq, torch.randn(8, 8, **f32), sq))
    add("gemm", "c", "overlaps a (partial)", lambda: gemmt.gemm(sq[2:7, :5], sq[:5, :3],
                                                                torch.randn(3, 5, **f32)))
    add("gemm", "c", "expanded (internal overlap)",
        lambda: gemmt.gemm(torch.empty(1, 5, **f32).expand(9, 5), a, b))
    add("gemm", "c", "non-contiguous", lambda: gemm_result(strided(torch.empty(9, 5, **f32)), a, b),
        close)
    add("gemm", "c", "transposed", lambda: gemm_result(torch.empty(5, 9, **f32).t(), a, b), close)
    add("gemm", "c", "misaligned", lambda: gemm_result(misaligned(torch.empty(9, 5, **f32)), a, b),
        close)
    add("gemm", "variant", "unknown name", lambda: gemmt.gemm(c, a, b, variant="fastest"))
    if other:
        add("gemm", "c", "other device", lambda: gemmt.gemm(c.to(other), a, b))

    # ---- add / square / scale ----
    x, y = torch.randn(33, 17, **f32), torch.randn(33, 17, **f32)
    xn = x.clone()
    xn[0, 0], xn[1, 1], xn[2, 2] = float("nan"), float("inf"), -float("inf")
    unary = {"square": (gemmt.square, lambda t: t * t), "scale": (lambda t: gemmt.scale(t, 3.0),
                                                                  lambda t: t * 3.0)}
    add("add", "a", "wrong dtype", lambda: gemmt.add(x.to(torch.int64), y))
    add("add", "b", "wrong dtype", lambda: gemmt.add(x, y.half()))
    add("add", "b", "wrong shape", lambda: gemmt.add(x, y[:, :16]))
    add("add", "b", "wrong rank", lambda: gemmt.add(x, y[None]))
    add("add", "a", "non-contiguous", lambda: gemmt.add(strided(x), y), lambda r: same(r, x + y))
    add("add", "b", "transposed", lambda: gemmt.add(x, y.t().contiguous().t()),
        lambda r: same(r, x + y))
    add("add", "a", "misaligned", lambda: gemmt.add(misaligned(x), y), lambda r: same(r, x + y))
    add("add", "a", "zero-size", lambda: gemmt.add(x[:0], y[:0]), lambda r: r.shape == (0, 17))
    add("add", "a", "NaN and Inf", lambda: gemmt.add(xn, y), lambda r: same(r, xn + y))
    if other:
        add("add", "b", "other device", lambda: gemmt.add(x, y.to(other)))
    for name, (fn, reference) in unary.items():
        add(name, "x", "wrong dtype", lambda fn=fn: fn(x.to(torch.int32)))
        add(name, "x", "bool dtype", lambda fn=fn: fn(x > 0))
        add(name, "x", "non-contiguous", lambda fn=fn: fn(strided(x)),
            lambda r, reference=reference: same(r, reference(x)))
        add(name, "x", "misaligned", lambda fn=fn: fn(misaligned(x)),
            lambda r, reference=reference: same(r, reference(x)))
        add(name, "x", "zero-size", lambda fn=fn: fn(x[:0]), lambda r: r.shape == (0, 17))
        add(name, "x", "NaN and Inf", lambda fn=fn: fn(xn),
            lambda r, reference=reference: same(r, reference(xn)))
        add(name, "x", "rank 0", lambda fn=fn: fn(x[0, 0]),
            lambda r, reference=reference: same(r, reference(x[0, 0])))

    # ---- rgb_to_gray ----
    img = torch.randint(0, 256, (6, 10, 3), dtype=torch.uint8, device=dev)
    gref = gemmt.rgb_to_gray(img.cpu()).to(dev)
    add("rgb_to_gray", "img", "wrong dtype", lambda: gemmt.rgb_to_gray(img.float()))
    add("rgb_to_gray", "img", "wrong rank", lambda: gemmt.rgb_to_gray(img[0]))
    add("rgb_to_gray", "img", "last dim 4", lambda: gemmt.rgb_to_gray(
        torch.zeros(6, 10, 4, dtype=torch.uint8, device=dev)))
    add("rgb_to_gray", "img", "channels first", lambda: gemmt.rgb_to_gray(img.permute(2, 0, 1)))
    add("rgb_to_gray", "img", "non-contiguous", lambda: gemmt.rgb_to_gray(img[:, ::2]),
        lambda r: same(r, gref[:, ::2]))
    add("rgb_to_gray", "img", "misaligned", lambda: gemmt.rgb_to_gray(misaligned(img)),
        lambda r: same(r, gref))
    add("rgb_to_gray", "img", "zero-size", lambda: gemmt.rgb_to_gray(img[:0]),
        lambda r: r.shape == (0, 10))

    # ---- normalize_volume ----
    vol = torch.randint(0, 4096, (4, 6, 8), dtype=torch.int32, device=dev).to(torch.uint16)
    vref = divide_ref(vol, 4095.0)
    add("normalize_volume", "vol", "wrong dtype", lambda: gemmt.normalize_volume(vol.float(), 1.0))
    add("normalize_volume", "vol", "int16 dtype", lambda: gemmt.normalize_volume(
        vol.to(torch.int16), 1.0))
    add("normalize_volume", "max_val", "zero", lambda: gemmt.normalize_volume(vol, 0.0))
    add("normalize_volume", "max_val", "negative", lambda: gemmt.normalize_volume(vol, -3.0))
    add("normalize_volume", "max_val", "NaN", lambda: gemmt.normalize_volume(vol, float("nan")))
    add("normalize_volume", "vol", "non-contiguous",
        lambda: gemmt.normalize_volume(vol.transpose(0, 2), 4095.0),
        lambda r: same(r, vref.transpose(0, 2)))
    add("normalize_volume", "vol", "misaligned", lambda: gemmt.normalize_volume(misaligned(vol), 4095.0),
        lambda r: same(r, vref))
    add("normalize_volume", "vol", "zero-size", lambda: gemmt.normalize_volume(vol[:0], 2.0),
        lambda r: r.shape == (0, 6, 8))
    add("normalize_volume", "vol", "rank 0", lambda: gemmt.normalize_volume(vol[0, 0, 0], 4095.0),
        lambda r: same(r, vref[0, 0, 0]))
    return out


RESULTS: dict[str, list[tuple[Case, str]]] = {}


def run_case(case: Case) -> str:
    try:
        result = case.run()
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0]
        assert case.expect_error, f"{case.op}/{case.arg}/{case.kind}: unexpected error {msg}"
        assert f"gemmt::{case.op}" in msg, f"error does not name the op: {msg}"
        assert f"'{case.arg}'" in msg, f"error does not name the argument '{case.arg}': {msg}"
        return "RuntimeError: " + msg
    assert not case.expect_error, f"{case.op}/{case.arg}/{case.kind}: accepted bad input"
    assert case.check is not None and case.check(result), f"{case.op}/{case.arg}/{case.kind}: wrong"
    return "correct result"


def write_matrix(dev: str, rows: list[tuple[Case, str]]) -> None:
    path = REPO_ROOT / "docs" / f"bad_input_matrix_{dev}.md"
    lines = [f"# Bad-input matrix ({dev})", "",
             "Generated by `pytest tests/test_bad_inputs.py`; do not edit by hand. Each case "
             "gives the right answer or an error naming the op and the argument.", "",
             "| op | argument | input | outcome |", "| --- | --- | --- | --- |"]
    for case, outcome in rows:
        lines.append(f"| {case.op} | {case.arg} | {case.kind} | {outcome.replace('|', '/')} |")
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    except OSError:
        pass  # read-only checkout: the assertions above are what count


@pytest.mark.parametrize("dev", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_bad_input_matrix(dev: str) -> None:
    rows = [(case, run_case(case)) for case in cases_for(dev)]
    write_matrix(dev, rows)
    assert len(rows) > 60


@pytest.mark.cuda
def test_huge_tensors_over_2_31_elements() -> None:
    n = 2**31 + 17
    free, _ = torch.cuda.mem_get_info()
    if free < 14 * 2**30:
        pytest.skip("needs 14 GiB of free GPU memory")
    x = torch.empty(n, dtype=torch.float16, device="cuda")
    x[: 1 << 20].normal_()
    x[-(1 << 20):].normal_()
    x[(1 << 20): -(1 << 20)] = 0.5
    for out, ref in ((gemmt.scale(x, 2.0), None), (gemmt.square(x), None)):
        assert out.shape == x.shape
        del out
    y = gemmt.add(x, x)
    assert torch.equal(y[-(1 << 20):], x[-(1 << 20):] + x[-(1 << 20):])
    assert torch.equal(y[: 1 << 20], x[: 1 << 20] * 2)
    assert bool((y[(1 << 20): -(1 << 20)] == 1.0).all())
    del y
    s = gemmt.scale(x, 3.0)
    assert torch.equal(s[-1000:], x[-1000:] * 3.0)
    del s, x
    torch.cuda.empty_cache()
    img = torch.randint(0, 256, (n // 2**16 + 1, 2**16, 3), dtype=torch.uint8, device="cuda")
    gray = gemmt.rgb_to_gray(img)
    assert gray.numel() > 2**31
    tail = img[-2:].cpu()
    assert torch.equal(gray[-2:].cpu(), gemmt.rgb_to_gray(tail))
    del img, gray
    torch.cuda.empty_cache()
    vol = torch.randint(0, 4096, (n,), dtype=torch.int32, device="cuda").to(torch.uint16)
    nv = gemmt.normalize_volume(vol, 4095.0)
    assert torch.equal(nv[-4096:], divide_ref(vol[-4096:], 4095.0))
    del vol, nv
    torch.cuda.empty_cache()
    # A GEMM whose C has more than 2^31 elements.
    m, n_cols, k = 2**16 + 3, 2**15 + 5, 16
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n_cols, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n_cols), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemmt.gemm(c, a, b)
    rows = torch.tensor([0, 1, m // 2, m - 2, m - 1], device="cuda")
    ref = a[rows].double() @ b.double()
    err = ((c[rows].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2 and not c[-1].isnan().any()
