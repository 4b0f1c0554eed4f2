"""gemm and mm against a float64 reference: shapes, strides, alpha/beta, every variant."""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import pytest
import torch

import gemmt
from conftest import FLOAT_DTYPES, HAS_CUDA, randn, rel_err, tol_for

SHAPES = [(1, 1, 1), (1, 37, 19), (23, 1, 17), (7, 5, 1), (33, 65, 17), (64, 64, 64),
          (127, 129, 131), (5, 300, 1000)]


def reference(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float, beta: float):
    out = alpha * (a.double() @ b.double())
    if beta != 0:
        out += beta * c.double()
    return out


def operand(shape: tuple[int, int], dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    """A (rows, cols) matrix stored row-major ("n"), column-major ("t") or strided ("s")."""
    rows, cols = shape
    if layout == "n":
        return randn(rows, cols, dtype=dtype, device=device)
    if layout == "t":
        return randn(cols, rows, dtype=dtype, device=device).t()
    return randn(rows, cols * 2 + 1, dtype=dtype, device=device)[:, 1::2]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_shapes(device: str, dtype: torch.dtype, m: int, n: int, k: int) -> None:
    a = randn(m, k, dtype=dtype, device=device)
    b = randn(k, n, dtype=dtype, device=device)
    c = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # beta=0 never reads c
    gemmt.gemm(c, a, b)
    assert rel_err(c, reference(c, a, b, 1.0, 0.0)) <= tol_for(dtype)


@pytest.mark.parametrize("la", ["n", "t", "s"])
@pytest.mark.parametrize("lb", ["n", "t", "s"])
@pytest.mark.parametrize("lc", ["n", "t", "s"])
def test_gemm_strides_alpha_beta(device: str, la: str, lb: str, lc: str) -> None:
    m, n, k = 45, 38, 70
    a, b = operand((m, k), torch.float32, device, la), operand((k, n), torch.float32, device, lb)
    c = operand((m, n), torch.float32, device, lc)
    expected = reference(c, a, b, 1.5, -0.75)
    gemmt.gemm(c, a, b, 1.5, -0.75)
    assert rel_err(c, expected) <= 1e-5


def test_gemm_k_zero_scales_c(device: str) -> None:
    c = randn(6, 7, device=device)
    expected = 0.5 * c
    gemmt.gemm(c, randn(6, 0, device=device), randn(0, 7, device=device), 2.0, 0.5)
    assert torch.equal(c, expected)
    c.fill_(float("nan"))
    gemmt.gemm(c, randn(6, 0, device=device), randn(0, 7, device=device), 2.0, 0.0)
    assert torch.equal(c, torch.zeros_like(c))


def test_gemm_empty_m_n(device: str) -> None:
    gemmt.gemm(randn(0, 5, device=device), randn(0, 3, device=device), randn(3, 5, device=device))
    gemmt.gemm(randn(4, 0, device=device), randn(4, 3, device=device), randn(3, 0, device=device))


def test_mm_matches_reference(device: str) -> None:
    a, b = randn(70, 50, device=device), randn(50, 90, device=device)
    out = gemmt.mm(a, b)
    assert out.shape == (70, 90) and out.is_contiguous()
    assert rel_err(out, a.double() @ b.double()) <= 1e-5
    out_t = gemmt.mm(b.t(), a.t())
    assert rel_err(out_t, b.double().t() @ a.double().t()) <= 1e-5


def test_gemm_misaligned(device: str) -> None:
    buf = randn(1 + 33 * 17 + 17 * 9 + 33 * 9, device=device)
    a = buf[1 : 1 + 33 * 17].view(33, 17)
    b = buf[1 + 33 * 17 : 1 + 33 * 17 + 17 * 9].view(17, 9)
    c = buf[1 + 33 * 17 + 17 * 9 :].view(33, 9)
    expected = reference(c, a, b, 1.0, 1.0)
    gemmt.gemm(c, a, b, 1.0, 1.0)
    assert rel_err(c, expected) <= 1e-5


def _misaligned(rows: int, cols: int) -> torch.Tensor:
    """A float32 CUDA matrix one element past a 16-byte boundary, rows of odd length when
    cols is odd: the SIMT kernels read it element by element (their kScalar loaders)."""
    return torch.randn(rows * cols + 1, device="cuda")[1:].view(rows, cols)


@pytest.mark.cuda
@pytest.mark.parametrize("which", ["a", "b", "both"])
@pytest.mark.parametrize("m,n,k", [(33, 17, 9), (300, 500, 129), (2048, 2049, 513),
                                   (4097, 4095, 1031), (6000, 3000, 999)])
def test_gemm_float32_unaligned_operands(which: str, m: int, n: int, k: int) -> None:
    """float32 operands that are not 16-byte aligned, on shapes whose plans take the medium,
    narrow and fat tiles: the instances with element-wise loaders (a kernel group a build may
    compile on first use), against float64."""
    a = _misaligned(m, k) if which in ("a", "both") else torch.randn(m, k, device="cuda")
    b = _misaligned(k, n) if which in ("b", "both") else torch.randn(k, n, device="cuda")
    want = a.double() @ b.double()
    for variant in ("auto", "pipelined"):
        c = torch.full((m, n), float("nan"), device="cuda")
        gemmt.gemm(c, a, b, variant=variant)
        assert rel_err(c, want) <= 1e-5, (variant, which)


def test_gemm_float64_cpu() -> None:
    a, b = torch.randn(20, 30, dtype=torch.float64), torch.randn(30, 10, dtype=torch.float64)
    c = torch.empty(20, 10, dtype=torch.float64)
    gemmt.gemm(c, a, b)
    assert rel_err(c, a @ b) <= 1e-12


def test_gemm_nan_propagates(device: str) -> None:
    a, b = randn(8, 8, device=device), randn(8, 8, device=device)
    a[3, 4] = float("nan")
    c = torch.empty(8, 8, device=device)
    gemmt.gemm(c, a, b)
    assert c[3].isnan().all() and not c[:3].isnan().any()


# ---- The variant names: one list, in C++ (include/gemmt/gemm_variant.h) --------------------
# Each named kernel and the test below that runs it on CUDA. A variant added in C++ fails
# test_every_variant_has_a_cuda_test until it is listed here with its test.
VARIANT_TESTS = {
    "naive": "test_cuda_simt_variants",
    "smem_tiled": "test_cuda_simt_variants",
    "register_blocked": "test_cuda_simt_variants",
    "warp_tiled": "test_cuda_simt_variants",
    "pipelined": "test_cuda_simt_variants",
    "split_k": "test_cuda_simt_variants",
    "gemv": "test_cuda_gemv",
    "mma_sync": "test_cuda_tensor_core_variants",
    "wgmma": "test_cuda_tensor_core_variants",
    "decode": "test_cuda_decode_variant",
    "dmma": "test_cuda_float64",
    "simt_fp64": "test_cuda_float64",
}


def test_gemm_variants_come_from_the_library() -> None:
    names = gemmt.gemm_variants()
    assert names[0] == "auto" and len(set(names)) == len(names), names
    assert gemmt.GEMM_VARIANTS == names
    # The Meta kernel parses every exported name; the error for an unknown one lists exactly
    # the exported names.
    a = torch.empty(4, 4, device="meta")
    for name in names:
        gemmt.gemm(torch.empty(4, 4, device="meta"), a, a, variant=name)
    with pytest.raises(RuntimeError, match="expected one of " + ", ".join(names) + ", got"):
        gemmt.gemm(torch.empty(4, 4, device="meta"), a, a, variant="fastest")


def test_every_variant_has_a_cuda_test() -> None:
    named = set(gemmt.gemm_variants()) - {"auto"}
    assert named == set(VARIANT_TESTS), sorted(named ^ set(VARIANT_TESTS))
    for test in set(VARIANT_TESTS.values()):
        assert callable(globals().get(test)), test


# ---- CUDA: every named kernel on awkward shapes -------------------------------------------
CUDA_VARIANTS = [v for v, test in VARIANT_TESTS.items() if test == "test_cuda_simt_variants"]
AWKWARD = [(1, 1, 1), (7, 9, 5), (33, 17, 65), (127, 129, 131), (128, 256, 64), (257, 129, 1000),
           (64, 48, 4099)]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", CUDA_VARIANTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt", "ss"])
def test_cuda_simt_variants(variant: str, dtype: torch.dtype, layout: str) -> None:
    for m, n, k in AWKWARD:
        a = operand((m, k), dtype, "cuda", layout[0])
        b = operand((k, n), dtype, "cuda", layout[1])
        c = randn(m, n, dtype=dtype, device="cuda")
        for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
            if beta == 0.0:
                c.fill_(float("nan"))
            expected = reference(c, a, b, alpha, beta)
            gemmt.gemm(c, a, b, alpha, beta, variant=variant)
            err = rel_err(c, expected)
            assert err <= tol_for(dtype), (variant, m, n, k, alpha, beta, err)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_gemv(dtype: torch.dtype) -> None:
    for m, n, k in [(1, 4096, 4096), (4096, 1, 4096), (1, 77, 1001), (999, 1, 33), (1, 1, 5000)]:
        for la, lb in (("n", "n"), ("t", "t"), ("s", "s")):
            a, b = operand((m, k), dtype, "cuda", la), operand((k, n), dtype, "cuda", lb)
            c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            gemmt.gemm(c, a, b, variant="gemv")
            assert rel_err(c, reference(c, a, b, 1, 0)) <= tol_for(dtype), (m, n, k, la)


def _tensor_core_variants() -> list[str]:
    if not HAS_CUDA:
        return ["mma_sync"]
    major, minor = torch.cuda.get_device_capability()
    out = ["mma_sync"] if major >= 8 else []
    if (major, minor) == (9, 0) and gemmt.build_info().get("sm90a_kernels"):
        out.append("wgmma")
    return out


TC_SHAPES = [(128, 256, 64), (129, 257, 65), (1000, 1000, 1000), (127, 8192, 511), (8192, 64, 1024),
             (64, 4096, 4096), (256, 256, 16384)]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", _tensor_core_variants())
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_cuda_tensor_core_variants(variant: str, dtype: torch.dtype, layout: str) -> None:
    tf32 = dtype == torch.float32
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        for m, n, k in TC_SHAPES:
            a = operand((m, k), dtype, "cuda", layout[0])
            b = operand((k, n), dtype, "cuda", layout[1])
            c = randn(m, n, dtype=dtype, device="cuda")
            for alpha, beta in ((1.0, 0.0), (1.5, 0.5)):
                if beta == 0.0:
                    c.fill_(float("nan"))
                expected = reference(c, a, b, alpha, beta)
                try:
                    gemmt.gemm(c, a, b, alpha, beta, variant=variant)
                except RuntimeError as exc:
                    # mma_sync may refuse a layout (its 16-byte copies need 16-byte row
                    # strides); the refusal must say so, and auto must still handle the
                    # problem. wgmma copies any operand TMA cannot read in place into its
                    # workspace first, so it never refuses.
                    assert variant != "wgmma", (m, n, k, layout, str(exc))
                    assert "cannot run this problem" in str(exc)
                    gemmt.gemm(c, a, b, alpha, beta)
                err = rel_err(c, expected)
                assert err <= tol_for(dtype, allow_tf32=tf32), (variant, m, n, k, layout, err)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.cuda
def test_cuda_fp32_accuracy_long_k() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = randn(512, 8192, device="cuda"), randn(8192, 512, device="cuda")
    c = torch.full((512, 512), float("nan"), device="cuda")
    gemmt.gemm(c, a, b)
    assert rel_err(c, a.double() @ b.double()) <= 1e-5


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("m,n,k", [(2048, 2048, 16), (2048, 2048, 80), (256, 256, 8192)])
def test_cuda_fp32_whole_tile_problems(layout: str, m: int, n: int, k: int) -> None:
    # Whole-tile float32 problems run the pipelined kernel's interior instances (branch-free
    # copies, the tile index clamped past the last k-tile): one k-tile (fewer than the
    # pipeline's stages), five, and split-k slices of whole tiles, with alpha and beta.
    torch.backends.cuda.matmul.allow_tf32 = False
    a = operand((m, k), torch.float32, "cuda", layout[0])
    b = operand((k, n), torch.float32, "cuda", layout[1])
    c = randn(m, n, device="cuda")
    ref = reference(c, a, b, 0.75, -0.5)
    gemmt.gemm(c, a, b, 0.75, -0.5)
    assert rel_err(c, ref) <= 1e-5


def _cuda_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels that fn() launches."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (4000, 4000, 4000), (1024, 1024, 1024)])
def test_cuda_fp32_stream_k_last_wave(layout: str, m: int, n: int, k: int) -> None:
    # On an H100's 132 SMs, 512 tiles of 128x256 leave a last wave of 116 tiles: those run as
    # stream-k (runs of k-tiles that start and end inside tiles, finished through the
    # workspace), whole tiles (interior instance) and edge tiles (general instance) alike.
    # At 1024^3 all 128 tiles of 64x128 are shared out to 396 blocks (three per SM).
    torch.backends.cuda.matmul.allow_tf32 = False
    a = operand((m, k), torch.float32, "cuda", layout[0])
    b = operand((k, n), torch.float32, "cuda", layout[1])
    c0 = randn(m, n, device="cuda")
    ref = reference(c0, a, b, 0.75, -0.5)
    outs = []
    for _ in range(3):
        c = c0.clone()
        gemmt.gemm(c, a, b, 0.75, -0.5)
        outs.append(c)
    assert rel_err(outs[0], ref) <= 1e-5
    # Partial sums are added in a fixed order whichever block finishes a tile.
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        # The pipelined kernel's last template argument says which form ran (STREAMK): both.
        names = _cuda_kernel_names(lambda: gemmt.gemm(c0.clone(), a, b, 0.75, -0.5))
        forms = [n.split(">(")[0].endswith(", true") for n in names
                 if "gemm_pipelined_kernel<" in n]
        expected = [True] if m == 1024 else [False, True]
        assert sorted(forms) == expected, [n[-120:] for n in names]


@pytest.mark.cuda
@pytest.mark.parametrize("x_layout", ["n", "t"])
@pytest.mark.parametrize("m,n,k", [(64, 1000, 520), (200, 1030, 333), (384, 3000, 777)])
def test_cuda_fp32_x_at_w_t_runs_transposed(x_layout: str, m: int, n: int, k: int) -> None:
    # Float32 x @ W.T with fewer rows than outputs runs as C^T = W @ x^T and stores C
    # column-major (tests/test_plan.py checks that these shapes plan that way): alpha and beta,
    # a poisoned C with beta == 0, C with a row pitch past n (its 16-byte column runs), odd n.
    torch.backends.cuda.matmul.allow_tf32 = False
    a = operand((m, k), torch.float32, "cuda", x_layout)
    b = operand((k, n), torch.float32, "cuda", "t")
    for pitch in (n, n + 4):
        c = randn(m, pitch, device="cuda")[:, :n]
        ref = reference(c, a, b, 0.75, -0.5)
        gemmt.gemm(c, a, b, 0.75, -0.5)
        assert rel_err(c, ref) <= 1e-5, (pitch, "beta")
        c.fill_(float("nan"))
        gemmt.gemm(c, a, b)
        assert rel_err(c, a.double() @ b.double()) <= 1e-5, (pitch, "beta 0")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_single_token_products(dtype: torch.dtype) -> None:
    """x @ W.T with one token, through `auto`: on an H100 the 14336-row weight goes to the
    Hopper GEMM's narrow tile and the others to gemv (gemm_sm90_streams_single_row), the
    8192 x 8192 one with gemv's L2 prefetch (a 128 MiB matrix of 16 KB rows); each against
    float64, with C poisoned first."""
    props = torch.cuda.get_device_properties(0)
    hopper = (props.major, props.minor) == (9, 0) and props.multi_processor_count == 132
    for n, k, narrow in [(14336, 4096, True), (4096, 4096, False), (18944, 3584, False),
                         (8192, 8192, False)]:
        w = randn(n, k, device="cuda").to(dtype)
        x = randn(1, k, device="cuda").to(dtype)
        c = torch.full((1, n), float("nan"), device="cuda", dtype=dtype)
        gemmt.gemm(c, x, w.t())
        assert rel_err(c, x.double() @ w.double().t()) <= tol_for(dtype), (n, k)
        assert rel_err(gemmt.linear(x, w), c.double()) <= tol_for(dtype), (n, k)
        if hopper and gemmt.build_info()["sm90a_kernels"]:
            names = _cuda_kernel_names(lambda: gemmt.gemm(c, x, w.t()))
            ran_gemv = any("gemv" in name for name in names)
            assert ran_gemv != narrow, (n, k, names)


def _column_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Each column's relative error against ref (float64)."""
    out64, ref64 = out.double(), ref.double()
    return (out64 - ref64).norm(dim=0) / ref64.norm(dim=0).clamp_min(1e-30)


def _forced_plan_runs(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, plans: list[str]
                      ) -> Iterator[str]:
    """Runs gemmt.gemm(c, a, b) once under each Hopper plan string (the tuner's forced
    schedules, through its cache in memory), yielding the plan after each run."""
    from gemmt import _native
    native = _native.load()
    mode, path = native.tuning_state()
    try:
        native.tuning_clear()
        native.tuning_configure("tune", "")
        gemmt.gemm(c, a, b)
        torch.cuda.synchronize()
        entry = gemmt.tuning_entries()[0]
        for plan in plans:
            native.tuning_clear()
            native.tuning_insert(entry["device"], entry["problem"], plan, 1.0, 1.0)
            native.tuning_configure("cached", os.path.join(tempfile.gettempdir(), "gemmt-none"))
            c.fill_(float("nan"))
            gemmt.gemm(c, a, b)
            torch.cuda.synchronize()
            yield plan
    finally:
        native.tuning_clear()
        native.tuning_configure(mode, path)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_layout", ["n", "t"])
@pytest.mark.parametrize("w_layout", ["n", "t"])
def test_cuda_trimmed_tiles(dtype: torch.dtype, x_layout: str, w_layout: str) -> None:
    """The 16-bit wide and three-quarter tiles compute only the columns their last column of
    tiles has (kernels/plan/sm90_plan.h: trimmed_tile_width): batched decode runs swapped
    with the tokens as those columns (swap_for_batched_decode), and products as given trim
    their last column. Token counts off every width step (72: a multiple of 8, not 16),
    both operand layouts (an MN-major B trims by 64), through `auto` and, on sm_90, forced
    onto each trimmed tile swapped: every output column within 4x torch's own error against
    float64 (and the worst column within 4x torch's worst), C poisoned first."""
    props = torch.cuda.get_device_properties(0)
    hopper = (props.major, props.minor) == (9, 0) and gemmt.build_info()["sm90a_kernels"]
    k = 1024
    cases = [(m, 4096) for m in (65, 72, 100, 128, 129, 144, 176, 191, 200, 241, 256)]
    cases += [(1000, 200), (1000, 1000), (300, 4096 + 200)]
    for m, n in cases:
        x = randn(m, k, device="cuda").to(dtype)
        if x_layout == "t":
            x = x.t().contiguous().t()
        w = randn(n, k, device="cuda").to(dtype)  # the weight, out_features x in_features
        b = w.t() if w_layout == "t" else w.t().contiguous()  # K-major or N-major (k, n)
        ref = x.double() @ b.double()
        theirs = _column_errors(torch.matmul(x, b), ref)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)

        def check(what: str) -> None:
            ours = _column_errors(c, ref)
            assert torch.isfinite(ours).all(), (m, n, what)
            worst = (ours / theirs.clamp_min(1e-4)).max().item()
            assert worst <= 4.0 and ours.max() <= 4 * theirs.max(), (m, n, what, worst)

        gemmt.gemm(c, x, b)
        check("auto")
        if hopper and m <= 256:
            plans = [f"wgmma:bn={bn}:splits={s}:orient=swapped" for bn in (192, 256)
                     for s in (0, 1)]
            for plan in _forced_plan_runs(c, x, b, plans):
                check(plan)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_layout", ["n", "t"])
def test_cuda_last_tile_moved_up(dtype: torch.dtype, x_layout: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows not a multiple of 128 run the last 128-row tile moved up to end at row m
    (kernels/plan/sm90_plan.h: last_tile_row), so that two tiles write the rows they share:
    C poisoned first, every column within 4x torch's error against float64, bit for bit the
    tiles left in place (GEMMT_SM90_LAST_TILE=0), through gemm, linear with bias and gelu
    (the staged epilogue writes the shared rows twice) and split plans; beta != 0 keeps the
    tiles in place and reads C once."""
    k = 1024
    for m, n in [(129, 4096), (200, 4096), (255, 2048), (300, 4096), (200, 14336), (1000, 1000)]:
        x = randn(m, k, device="cuda").to(dtype)
        if x_layout == "t":
            x = x.t().contiguous().t()
        w = randn(n, k, device="cuda").to(dtype)
        bias = randn(n, device="cuda").to(dtype)
        ref = x.double() @ w.double().t()
        theirs = _column_errors(torch.matmul(x, w.t()), ref)
        outs = {}
        for shift in ("0", "1"):
            monkeypatch.setenv("GEMMT_SM90_LAST_TILE", shift)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            gemmt.gemm(c, x, w.t())
            ours = _column_errors(c, ref)
            assert torch.isfinite(ours).all(), (m, n, shift)
            assert (ours / theirs.clamp_min(1e-4)).max().item() <= 4.0, (m, n, shift)
            outs[shift] = (c, gemmt.linear(x, w, bias, "gelu"))
        assert torch.equal(outs["0"][0], outs["1"][0]), (m, n)
        assert torch.equal(outs["0"][1], outs["1"][1]), (m, n)
        torch.testing.assert_close(outs["1"][1].float(),
                                   torch.nn.functional.gelu(ref + bias.double()).float(),
                                   rtol=2e-2, atol=2e-2)
        # beta reads C: c = 0.5 * c0 + x @ w^T, each element of C read once.
        c0 = randn(m, n, device="cuda").to(dtype)
        c = c0.clone()
        gemmt.gemm(c, x, w.t(), 1.0, 0.5)
        want = ref + 0.5 * c0.double()
        assert rel_err(c, want) < 4 * rel_err(torch.matmul(x, w.t()) + 0.5 * c0, want) + 1e-3


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_second_b_box_moved_back(dtype: torch.dtype) -> None:
    """A K-major B tile's second box, where it would cross the end of B, starts earlier and
    rewrites rows of the first (kernels/sm90/scheduler.cuh: second_b_box): last columns of
    tiles half to fully used on each two-box width (256, 192, 128), given and swapped, split
    and not, columns a multiple of 8 or not; every output column within 4x torch's error
    against float64, C poisoned first."""
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor) != (9, 0) or not gemmt.build_info()["sm90a_kernels"]:
        pytest.skip("needs the sm_90a kernels on an sm_90 GPU")
    if dtype == torch.float32:
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        k = 512
        for m, n, bn in [(256, 3 * 256 + 200, 256), (256, 3 * 256 + 129, 256),
                         (256, 2 * 192 + 100, 192), (256, 2 * 192 + 190, 192),
                         (256, 4 * 128 + 72, 128), (256, 4 * 128 + 65, 128), (136, 4096, 192),
                         (150, 4096, 192)]:
            if dtype == torch.float32 and bn == 192:
                continue  # the 128 x 192 tile is 16-bit only
            x = randn(m, k, device="cuda").to(dtype)
            w = randn(n, k, device="cuda").to(dtype)
            b = w.t()  # K-major B
            ref = x.double() @ b.double()
            theirs = _column_errors(torch.matmul(x, b), ref)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            orient = "swapped" if m < 256 else "given"
            plans = [f"wgmma:bn={bn}:splits={s}:orient={orient}" for s in (1, 2)]
            for plan in _forced_plan_runs(c, x, b, plans):
                ours = _column_errors(c, ref)
                assert torch.isfinite(ours).all(), (m, n, plan)
                worst = (ours / theirs.clamp_min(1e-4)).max().item()
                assert worst <= 4.0, (m, n, plan, worst)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_cuda_float32_few_rows_on_the_32_row_tile(layout: str) -> None:
    """float32 products of at most 32 rows against a long weight run split-k on the 32 x 256
    tile (kernels/plan/simt_plan.h: kSkinny), through `auto` and named: against float64,
    with C poisoned first, with alpha and beta, bit for bit on a repeat, and with n not a
    multiple of the tile; the kernel that ran is the 32-row one."""
    # 8 x 28672 x 4096: unsplit under `auto`, W read in place when K-major. The last three: A
    # or B rows not 16-byte multiples in some layouts (scalar loads, the 64-row tiles), and a
    # weight of one 256-wide tile (the 64 x 128 tile fills more SMs).
    for m, n, k, skinny in [(1, 4096, 4096, True), (8, 4096, 4100, True),
                            (16, 4096, 8192, True), (32, 4096, 4096, True),
                            (8, 28672, 4096, True),
                            (5, 2000, 4100, False), (32, 4097, 4096, False),
                            (32, 256, 4096, False)]:
        a = operand((m, k), torch.float32, "cuda", layout[0])
        b = operand((k, n), torch.float32, "cuda", layout[1])
        for variant in ("auto", "split_k"):
            c = torch.full((m, n), float("nan"), device="cuda")
            gemmt.gemm(c, a, b, variant=variant)
            assert rel_err(c, a.double() @ b.double()) <= 1e-5, (m, n, k, variant)
            again = torch.full_like(c, float("nan"))
            gemmt.gemm(again, a, b, variant=variant)
            assert torch.equal(c, again), (m, n, k, variant)
        c = randn(m, n, device="cuda")
        expected = reference(c, a, b, 0.5, 2.0)
        gemmt.gemm(c, a, b, 0.5, 2.0, variant="split_k")
        assert rel_err(c, expected) <= 1e-5, (m, n, k, "alpha beta")
        if skinny:
            names = _cuda_kernel_names(lambda: gemmt.gemm(c, a, b, variant="split_k"))
            assert any("PipeConfig<32, 256" in name for name in names), (m, n, k, names)


@pytest.mark.cuda
@pytest.mark.parametrize("weight", ["k_major", "n_major"])
def test_cuda_gemv_two_to_four_rows(weight: str) -> None:
    """float32 x @ W.T (W K-major: the row-dot kernel) and a @ W (N-major: the column sweep)
    with 2-4 rows run gemv for all rows at once, named (and through `auto` for 2-4 rows of
    x @ W.T, 2 of a @ W; `auto`'s other paths are checked too): against float64
    with C poisoned, alpha and beta, a split dot product (few outputs, long rows), rows of x
    not 16-byte aligned (scalar path), an odd width (the sweep's tail), and a strided C."""
    sweep = weight == "n_major"
    for m, n, k in [(3, 1001, 4099), (4, 256, 65536), (4, 11008, 4096), (2, 4096, 4096)]:
        w = randn(k, n, device="cuda") if sweep else randn(n, k, device="cuda").t()
        for x in (randn(m, k, device="cuda"), randn(m, k + 1, device="cuda")[:, 1:]):
            for variant in ("auto", "gemv"):
                c = torch.full((m, n), float("nan"), device="cuda")
                gemmt.gemm(c, x, w, variant=variant)
                assert rel_err(c, x.double() @ w.double()) <= 1e-5, (m, n, k, variant)
            c = randn(m, n, device="cuda")
            expected = reference(c, x, w, 0.5, 2.0)
            gemmt.gemm(c, x, w, 0.5, 2.0)
            assert rel_err(c, expected) <= 1e-5, (m, n, k, "alpha beta")
            wide = torch.full((m, 2 * n), float("nan"), device="cuda")
            gemmt.gemm(wide[:, ::2], x, w)
            assert rel_err(wide[:, ::2], x.double() @ w.double()) <= 1e-5, (m, n, k)
            assert wide[:, 1::2].isnan().all()
        kernel = "gemv_colsweep_kernel<float, %s, %d>" % ("true" if n % 4 == 0 else "false", m)
        if not sweep:
            kernel = "gemv_rowdot_kernel<float, %d>" % m
        names = _cuda_kernel_names(lambda: gemmt.gemm(c, x, w, variant="gemv"))
        assert any(kernel in name for name in names), (kernel, names)
        # `auto` takes the column sweep for 2 rows only (more ran slower than split-k on the
        # 32-row tile), the row-dot kernel for 2-4.
        auto = _cuda_kernel_names(lambda: gemmt.gemm(c, x, w))
        assert any(kernel in name for name in auto) == (not sweep or m == 2), (m, auto)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_split_k_deterministic(dtype: torch.dtype) -> None:
    # float32: the SIMT split-k; bfloat16: the tensor-core split-k. Both add their k-slices
    # in a fixed order, so repeated runs agree bit for bit.
    a = randn(256, 65536, device="cuda").to(dtype)
    b = randn(65536, 256, device="cuda").to(dtype)
    outs = [gemmt.mm(a, b) for _ in range(3)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert rel_err(outs[0], a.double() @ b.double()) <= tol_for(dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1024, 11008, 4096), (2048, 5120, 13824), (2048, 11008, 4096),
                                   (8192, 4096, 11008)])
def test_cuda_tensor_core_stream_k(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    # x @ W.T products that the Hopper planner runs as stream-k on 132 SMs (tests/test_plan.py):
    # the first two spread the partial last wave alone (2.6 and 2.4 waves of wide tiles), the
    # third the last two waves (5.2), the fourth the last alone again (7.8 waves, 172 k-blocks
    # a tile). Checked with alpha and beta, repeated bit for bit (a
    # tile's pieces are added in a fixed order), and with beta 0 on a NaN-poisoned C.
    a = operand((m, k), dtype, "cuda", "n")
    b = operand((k, n), dtype, "cuda", "t")
    c0 = randn(m, n, dtype=dtype, device="cuda")
    outs = []
    for _ in range(3):
        c = c0.clone()
        gemmt.gemm(c, a, b, 0.75, -0.5)
        outs.append(c)
    assert rel_err(outs[0], reference(c0, a, b, 0.75, -0.5)) <= tol_for(dtype)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    gemmt.gemm(c, a, b)
    assert bool(torch.isfinite(c).all())
    assert rel_err(c, reference(c, a, b, 1.0, 0.0)) <= tol_for(dtype)


@pytest.mark.cuda
def test_cuda_unknown_or_unsupported_variant_is_refused() -> None:
    a = randn(8, 8, device="cuda")
    c = torch.empty(8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="variant"):
        gemmt.gemm(c, a, a, variant="fastest")
    with pytest.raises(RuntimeError, match="gemv"):
        gemmt.gemm(c, a, a, variant="gemv")


DECODE_SHAPES = [(1, 4096, 4096), (2, 11008, 4096), (3, 17, 40), (7, 128, 1024), (8, 4096, 11008),
                 (9, 1, 8), (16, 1000, 4104), (31, 333, 64), (33, 4096, 512), (64, 2048, 2048),
                 (64, 16, 16384), (5, 65, 96)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_decode_variant(dtype: torch.dtype) -> None:
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("the decode kernel needs sm_80 or newer")
    for m, n, k in DECODE_SHAPES:
        a = operand((m, k), dtype, "cuda", "n")
        b = torch.randn(n, k, device="cuda").to(dtype).t()  # K-major B, as x @ W.T reads it
        for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
            c = torch.randn(m, n, device="cuda").to(dtype)
            if beta == 0.0:
                c.fill_(float("nan"))  # beta == 0 never reads C; every element is written
            expected = reference(c, a, b, alpha, beta)
            gemmt.gemm(c, a, b, alpha, beta, variant="decode")
            assert rel_err(c, expected) <= tol_for(dtype), (m, n, k, alpha, beta)
    # What the decode kernel does not take is refused by name, never computed wrongly.
    a, b = operand((4, 36), dtype, "cuda", "n"), torch.randn(64, 36, device="cuda").to(dtype).t()
    with pytest.raises(RuntimeError, match="'decode' cannot run this problem"):
        gemmt.gemm(torch.empty(4, 64, device="cuda", dtype=dtype), a, b, variant="decode")
    # auto picks it for decode-sized products; the result is the same function.
    a, b = operand((12, 4096), dtype, "cuda", "n"), torch.randn(4096, 4096, device="cuda").to(dtype).t()
    assert rel_err(gemmt.mm(a, b), a.double() @ b.double()) <= tol_for(dtype)


# ---- float64 on CUDA: the dmma (FP64 tensor cores) and simt_fp64 kernels -----------------------
FP64_SHAPES = [(1, 1, 1), (7, 9, 5), (33, 17, 65), (127, 129, 131), (128, 128, 16), (1, 300, 77),
               (300, 1, 77), (257, 129, 1000), (64, 48, 4099), (513, 1000, 257),
               # every CTA tile and k-tile in range: only the kernels' unchecked copy path
               (256, 384, 160),
               # interior tiles with K not a multiple of 16 (a checked last k-tile), and more
               # output tiles than an H100 or H200 has SMs (the dmma CTAs walk several tiles)
               (384, 256, 40), (2100, 1300, 24)]


def fp64_operand(shape: tuple[int, int], layout: str) -> torch.Tensor:
    """A float64 CUDA matrix: "n", "t", "s" as operand(); "m" misaligned (a storage offset of
    one element: 8-byte but not 16-byte aligned); "o" rows of odd length (a view of a wider
    matrix whose row stride is odd); "p" the transposed view of such a matrix (column stride
    odd)."""
    rows, cols = shape
    if layout == "p":
        wide = torch.randn(cols, rows + 1 + rows % 2, dtype=torch.float64, device="cuda")
        return wide[:, :rows].t()
    if layout == "m":
        return torch.randn(rows * cols + 1, dtype=torch.float64, device="cuda")[1:].view(rows, cols)
    if layout == "o":
        return torch.randn(rows, cols + 1 + cols % 2, dtype=torch.float64, device="cuda")[:, :cols]
    return operand(shape, torch.float64, "cuda", layout)


def fp64_variants() -> list[str]:
    out = ["auto", "simt_fp64"]
    if HAS_CUDA and torch.cuda.get_device_capability()[0] >= 8:
        out.append("dmma")
    return out


def cpu_reference64(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
                    beta: float) -> torch.Tensor:
    """alpha * a @ b + beta * c computed on the CPU in float64 (c read only when beta != 0)."""
    out = alpha * (a.cpu() @ b.cpu())
    if beta != 0:
        out += beta * c.cpu()
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("variant", fp64_variants())
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt", "ss", "mn", "nm", "oo", "to", "op",
                                    "po", "pp", "mt", "tm"])
def test_cuda_float64(variant: str, layout: str) -> None:
    for m, n, k in FP64_SHAPES:
        a = fp64_operand((m, k), layout[0])
        b = fp64_operand((k, n), layout[1])
        for alpha, beta in ((1.0, 0.0), (0.3, -1.7), (-2.5, 1.0)):
            c = torch.randn(m, n, dtype=torch.float64, device="cuda")
            if beta == 0.0:
                c.fill_(float("nan"))  # beta == 0 never reads C
            expected = cpu_reference64(c, a, b, alpha, beta)
            gemmt.gemm(c, a, b, alpha, beta, variant=variant)
            err = rel_err(c, expected)
            assert err <= 1e-12, (variant, m, n, k, layout, alpha, beta, err)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability()[0] < 8,
                    reason="FP64 tensor cores")
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt", "mn", "oo", "pp", "ss"])
def test_cuda_float64_dmma_ctas_agree(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The dmma kernel's two CTA shapes (128 x 128, one an SM; 128 x 64, two an SM) add every
    # output's k-steps in the same order: the same bits, each within float64 rounding.
    for m, n, k in FP64_SHAPES:
        a = fp64_operand((m, k), layout[0])
        b = fp64_operand((k, n), layout[1])
        c0 = torch.randn(m, n, dtype=torch.float64, device="cuda")
        expected = cpu_reference64(c0, a, b, 0.5, -1.5)
        outs = {}
        for tile in ("128", "64"):
            monkeypatch.setenv("GEMMT_FP64_TILE", tile)
            c = c0.clone()
            gemmt.gemm(c, a, b, 0.5, -1.5, variant="dmma")
            assert rel_err(c, expected) <= 1e-12, (tile, m, n, k, layout)
            outs[tile] = c
        assert torch.equal(outs["128"], outs["64"]), (m, n, k, layout)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", fp64_variants())
def test_cuda_float64_output_layouts_and_edges(variant: str) -> None:
    a = torch.randn(70, 45, dtype=torch.float64, device="cuda")
    b = torch.randn(45, 33, dtype=torch.float64, device="cuda")
    # C transposed, strided (no unit stride) and misaligned; beta != 0 reads each in place.
    c_views = {
        "t": torch.randn(33, 70, dtype=torch.float64, device="cuda").t(),
        "s": torch.randn(70, 66, dtype=torch.float64, device="cuda")[:, ::2],
        "m": torch.randn(70 * 33 + 1, dtype=torch.float64, device="cuda")[1:].view(70, 33),
    }
    for name, c in c_views.items():
        expected = cpu_reference64(c, a, b, 1.25, 0.5)
        gemmt.gemm(c, a, b, 1.25, 0.5, variant=variant)
        assert rel_err(c, expected) <= 1e-12, (variant, name)
    # k == 0: C = beta * C (and a NaN-poisoned C with beta == 0 becomes zero).
    c = torch.randn(6, 5, dtype=torch.float64, device="cuda")
    expected = 3.0 * c.cpu()
    gemmt.gemm(c, a[:6, :0], b[:0, :5], 2.0, 3.0, variant=variant)
    assert torch.equal(c.cpu(), expected)
    c.fill_(float("nan"))
    gemmt.gemm(c, a[:6, :0], b[:0, :5], 2.0, 0.0, variant=variant)
    assert torch.equal(c.cpu(), torch.zeros(6, 5, dtype=torch.float64))
    # Empty outputs launch nothing and return.
    empty = torch.empty(0, 5, dtype=torch.float64, device="cuda")
    gemmt.gemm(empty, a[:0], b[:, :5], variant=variant)
    assert gemmt.mm(a[:0], b).shape == (0, 33)
    # NaN in A reaches exactly its row of C; the rest stays finite.
    a_nan = a.clone()
    a_nan[3, 4] = float("nan")
    c = torch.empty(70, 33, dtype=torch.float64, device="cuda")
    gemmt.gemm(c, a_nan, b, variant=variant)
    assert c[3].isnan().all() and not c[:3].isnan().any() and not c[4:].isnan().any()


@pytest.mark.cuda
@pytest.mark.parametrize("layout",
                         ["nn", "nt", "tn", "tt", "oo", "op", "po", "pp", "pt", "mm", "ss"])
def test_cuda_float64_multi_tile_walk(layout: str) -> None:
    """More output tiles than twice the SM count, with edges in M, N and K: each CTA of the
    persistent dmma grid walks several tiles (8-byte copies for the odd leading dimensions,
    L2 256-byte fetches for K-major ones), and the result matches the CPU's."""
    if "dmma" not in fp64_variants():
        pytest.skip("needs FP64 tensor cores (sm_80+)")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # 5 x tiles_n output tiles, more than twice the SM count, edges in M, N and K.
    tiles_n = (2 * sms) // 5 + 2
    m, n, k = 5 * 128 - 7, tiles_n * 128 - 3, 72
    a = fp64_operand((m, k), layout[0])
    b = fp64_operand((k, n), layout[1])
    c0 = torch.randn(m, n, dtype=torch.float64, device="cuda")
    expected = cpu_reference64(c0, a, b, 0.75, -0.5)
    c = c0.clone()
    gemmt.gemm(c, a, b, 0.75, -0.5, variant="dmma")
    assert rel_err(c, expected) <= 1e-12, layout


@pytest.mark.cuda
def test_cuda_float64_auto_uses_the_float64_kernels() -> None:
    a = torch.randn(300, 200, dtype=torch.float64, device="cuda")
    b = torch.randn(200, 100, dtype=torch.float64, device="cuda")
    # mm and gemm(auto) agree with the named float64 kernels to rounding, and with the CPU.
    expected = a.cpu() @ b.cpu()
    assert rel_err(gemmt.mm(a, b), expected) <= 1e-12
    for variant in fp64_variants():
        c = torch.empty(300, 100, dtype=torch.float64, device="cuda")
        gemmt.gemm(c, a, b, variant=variant)
        assert rel_err(c, expected) <= 1e-12, variant


@pytest.mark.cuda
def test_cuda_float64_variant_refusals() -> None:
    a64 = torch.randn(16, 16, dtype=torch.float64, device="cuda")
    c64 = torch.empty(16, 16, dtype=torch.float64, device="cuda")
    # Kernels of float32 accumulation refuse float64, naming the variant and the dtype.
    for variant in ("pipelined", "mma_sync", "gemv"):
        with pytest.raises(RuntimeError, match=f"'{variant}' cannot run this problem.*float64"):
            gemmt.gemm(c64, a64, a64, variant=variant)
    # The float64 kernels refuse the other dtypes.
    a32 = a64.float()
    for variant in ("dmma", "simt_fp64"):
        with pytest.raises(RuntimeError, match=f"'{variant}' cannot run this problem.*float32"):
            gemmt.gemm(a32.clone(), a32, a32, variant=variant)
    # Mixed dtypes stay an error.
    with pytest.raises(RuntimeError, match="expected the same dtype"):
        gemmt.mm(a64, a32)
