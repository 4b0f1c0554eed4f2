"""scaled_mm's FP8 decode path on CUDA: 1-64 tokens against a K-major float8 weight
(b = W.t()), in every scaling, with bias, activations and the three output dtypes, against a
float64 product of the dequantised inputs with an elementwise error bound, against
torch._scaled_mm, on outputs whose memory was filled with NaN first. Every test runs on every
decode path: the mma.sync kernel (kernels/fp8/scaled_decode_fp8.cu, every scaling) and the
Hopper kernel (kernels/fp8/scaled_decode_fp8_sm90.cu, fp16 wgmma on widened operands,
tensorwise and rowwise scales; block scales stay on the mma.sync kernel there)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import gemmt  # noqa: F401  (registers torch.ops.gemmt)
from conftest import HAS_CUDA

pytestmark = pytest.mark.cuda

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BLOCK = 128
U32 = 2.0 ** -24  # float32 unit roundoff
# Unit roundoff of one rounding to the output dtype (half an ulp, relative: 2^-p for p
# significant bits).
OUT_U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
OUT_TINY = {torch.float32: 1e-30, torch.bfloat16: 1e-30, torch.float16: 2.0 ** -24}


def _fp8_capable() -> bool:
    return HAS_CUDA and torch.cuda.get_device_capability() >= (8, 9)


def _hopper() -> bool:
    return HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


needs_fp8 = pytest.mark.skipif(not _fp8_capable(), reason="needs an sm_89+ CUDA GPU")
needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90)")


DECODE_PATHS = ["mma", "wgmma"]
MMA_KERNEL, WGMMA_KERNEL = "mma.sync decode kernel", "wgmma decode kernel"
FAST_KERNEL = "float8-form wgmma decode kernel"


@pytest.fixture(autouse=True, params=DECODE_PATHS)
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The decode kernel under test, chosen through GEMMT_FP8_DECODE: "mma" holds the mma.sync
    kernel to its whole range (1-64 tokens, every scaling), "wgmma" sends tensorwise and
    rowwise products of up to 32 tokens to the Hopper kernel and more to the mma.sync kernel
    (test_wgmma_path_runs_the_wgmma_kernel checks that it is the one that runs for these
    tests' operands). test_decode_kernel_is_the_one_that_runs
    checks the default routing."""
    if request.param.startswith("wgmma") and HAS_CUDA and not _hopper():
        pytest.skip("the wgmma decode kernel needs a Hopper GPU (sm_90)")
    monkeypatch.setenv("GEMMT_FP8_DECODE", request.param)
    return request.param


def kernel_names(fn) -> list[str]:
    """The CUDA kernels that fn() launches, by the profiler's names."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def decode_kernels(names: list[str]) -> set[str]:
    """Which of the decode kernels appear among the kernel names."""
    found = set()
    for s in names:
        if "decode_kernel" in s and "Fp8Op" in s:
            found.add(MMA_KERNEL)
        if "fp8_decode_wgmma_kernel" in s:
            found.add(WGMMA_KERNEL)
    return found


def fast_kernels(names: list[str]) -> set[str]:
    """The decode kernels among the names, the Hopper kernel's float8 form told apart (its
    instances' last template argument, kFast, is true)."""
    found = decode_kernels(names)
    if any(re.search(r"fp8_decode_wgmma_kernel<[^>]*\btrue\b", s) for s in names):
        found = (found - {WGMMA_KERNEL}) | {FAST_KERNEL}
    return found


def routed(m: int, scaling: str = "row", fast_accum: bool = False) -> set[str]:
    """The decode kernels a bf16-out product of m tokens through a 512 x 512 weight launches
    (fast_kernels' names); skips where the profiler records no CUDA kernels."""
    case = Case(m, 512, 512, scaling)
    names = kernel_names(lambda: torch.ops.gemmt.scaled_mm(
        case.a, case.b, case.sa, case.sb, None, torch.bfloat16, "none", fast_accum))
    if not names:
        pytest.skip("the profiler recorded no CUDA kernels here")
    return fast_kernels(names)


class Case:
    """Float8 tokens a (m, k), weight W (n, k) with b = W.t(), and their dequantisation
    scales in the layout of one scaling; full float64 scales for the reference."""

    def __init__(self, m: int, n: int, k: int, scaling: str, fa: torch.dtype = E4M3,
                 fw: torch.dtype = E4M3, pairing: str = "1x128,128x128") -> None:
        dev = "cuda"
        self.m, self.n, self.k, self.scaling = m, n, k, scaling
        # Values spread over the formats' range, quantised by a plain cast (the kernel takes
        # any float8 bytes; no quantiser is under test here).
        x = torch.randn(m, k, device=dev) * 3
        w = torch.randn(n, k, device=dev) * 3
        self.a = x.clamp(-400, 400).to(fa)
        self.w = w.clamp(-400, 400).to(fw)
        self.b = self.w.t()
        kb, nb, mb = k // BLOCK, -(-n // BLOCK), -(-m // BLOCK)

        def pos(*shape: int) -> torch.Tensor:
            return torch.rand(*shape, device=dev) * 0.03 + 0.005

        if scaling == "tensor":
            self.sa, self.sb = pos(()), pos(())
            self.SA = self.sa.double().expand(m, k)
            self.SB = self.sb.double().expand(k, n)
        elif scaling == "row":
            self.sa, self.sb = pos(m, 1), pos(1, n)
            self.SA = self.sa.double().expand(m, k)
            self.SB = self.sb.double().expand(k, n)
        else:
            a_sq = pairing.startswith("128x128")
            b_sq = pairing.endswith("128x128")
            # torch's layouts: 1x128 scales column-major, 128x128 of b the transpose of a
            # contiguous (nb, kb) tensor.
            self.sa = pos(mb, kb) if a_sq else pos(kb, m).t()
            self.sb = pos(nb, kb).t() if b_sq else pos(kb, n)
            sa_rows = self.sa.double().repeat_interleave(BLOCK, 0)[:m] if a_sq else self.sa.double()
            sb_cols = (self.sb.double().repeat_interleave(BLOCK, 1)[:, :n] if b_sq
                       else self.sb.double())
            self.SA = sa_rows.repeat_interleave(BLOCK, 1)
            self.SB = sb_cols.repeat_interleave(BLOCK, 0)

    def dot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 product of the dequantised operands and the same of their magnitudes
        (the scale of a float32 sum's rounding error)."""
        A = self.a.double() * self.SA
        B = self.b.double() * self.SB
        return A @ B, A.abs() @ B.abs()


def act_ref(z: torch.Tensor, act: str) -> torch.Tensor:
    return {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act](z)


def poisoned_run(fn, m: int, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """fn() after a freed NaN tensor of the output's size: the caching allocator hands its
    block to the output, so an element the kernel never writes stays NaN."""
    junk = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    del junk
    return fn()


def check(case: Case, out: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None = None,
          act: str = "none", slice_u: float = 0.0) -> None:
    """Every element within a float32 accumulation's bound plus one rounding to out_dtype;
    slice_u adds that fraction of the magnitudes for sums of slices taken in fewer bits."""
    assert out.shape == (case.m, case.n) and out.dtype == out_dtype
    assert torch.isfinite(out).all(), "an output element is NaN / inf (unwritten or wrong)"
    z, mag = case.dot()
    bound_z = (slice_u + (case.k + 16) * U32) * mag
    if bias is not None:
        z = z + bias.double()
        bound_z = bound_z + 4 * U32 * z.abs()
    ref = act_ref(z, act)
    # The activations' slopes are at most 1.13 (GELU) in magnitude.
    bound = 1.2 * bound_z + (OUT_U[out_dtype] + 8 * U32) * ref.abs() + OUT_TINY[out_dtype]
    err = (out.double() - ref).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} elements outside the bound; worst excess "
        f"{float((err / bound.clamp_min(1e-300)).max()):.3g} x bound")


def run(case: Case, out_dtype: torch.dtype = torch.float32, bias: torch.Tensor | None = None,
        act: str = "none") -> torch.Tensor:
    return poisoned_run(lambda: torch.ops.gemmt.scaled_mm(
        case.a, case.b, case.sa, case.sb, bias, out_dtype, act, False), case.m, case.n, out_dtype)


TOKENS = [1, 3, 5, 8, 9, 15, 17, 31, 33, 47, 63, 64]
# (n, k): n tails (not a multiple of 16 or 128), k tails (not a multiple of 64 or 128).
SHAPES = [(256, 512), (1000, 1040), (24, 16), (130, 208), (7, 4096), (4096, 1024)]


@needs_fp8
@pytest.mark.parametrize("m", TOKENS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_decode_against_float64(m: int, shape: tuple[int, int], scaling: str) -> None:
    n, k = shape
    case = Case(m, n, k, scaling)
    check(case, run(case), torch.float32)


@needs_fp8
@pytest.mark.parametrize("m", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("shape", [(256, 512), (1000, 1024), (130, 128), (4096, 2048)])
@pytest.mark.parametrize("pairing", ["1x128,128x128", "1x128,128x1", "128x128,128x1"])
def test_decode_blockwise_against_float64(m: int, shape: tuple[int, int], pairing: str) -> None:
    n, k = shape
    case = Case(m, n, k, "block", pairing=pairing)
    check(case, run(case), torch.float32)


@needs_fp8
@pytest.mark.parametrize("m", [1, 4, 16, 32, 64])
@pytest.mark.parametrize("shape", [(14336, 4096), (4096, 14336)])
@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
def test_decode_model_sizes(m: int, shape: tuple[int, int], scaling: str) -> None:
    """The layer sizes of a 7-8B model: the widest cluster splits and the longest K."""
    n, k = shape
    case = Case(m, n, k, scaling)
    check(case, run(case, torch.bfloat16), torch.bfloat16)


@needs_fp8
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
def test_decode_epilogue(out_dtype: torch.dtype, bias_dtype: torch.dtype | None, act: str,
                         scaling: str) -> None:
    case = Case(13, 520, 640 if scaling != "block" else 768, scaling)
    bias = None if bias_dtype is None else (torch.randn(case.n, device="cuda") * 20).to(bias_dtype)
    check(case, run(case, out_dtype, bias, act), out_dtype, bias, act)


@needs_fp8
@pytest.mark.parametrize("pair", [(E4M3, E5M2), (E5M2, E4M3)])
@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
@pytest.mark.parametrize("m", [1, 9, 64])
def test_decode_mixed_formats(pair: tuple[torch.dtype, torch.dtype], scaling: str, m: int) -> None:
    case = Case(m, 384, 1024, scaling, fa=pair[0], fw=pair[1])
    check(case, run(case, torch.float32), torch.float32)


@needs_fp8
def test_decode_refuses_two_e5m2_operands_as_before() -> None:
    case = Case(4, 64, 128, "tensor", fa=E5M2, fw=E5M2)
    with pytest.raises(RuntimeError, match=r"gemmt::scaled_mm.*at most one Float8_e5m2"):
        torch.ops.gemmt.scaled_mm(case.a, case.b, case.sa, case.sb, None, torch.float32, "none",
                                  False)


def strided_views(case: Case) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(a, b) operands of case read through strides: the tokens' and the weight's rows inside
    wider matrices (16-byte aligned strides, read in place) and the tokens' rows at an odd
    byte stride (the op copies them)."""
    m, n, k = case.m, case.n, case.k
    a_wide = torch.zeros(m, k + 48, device="cuda").to(E4M3)
    a_wide[:, :k] = case.a
    w_wide = torch.zeros(n, k + 32, device="cuda").to(E4M3)
    w_wide[:, :k] = case.w
    a_odd = torch.zeros(m, k + 3, device="cuda").to(E4M3)
    a_odd[:, :k] = case.a
    return {"a in a wider matrix": (a_wide[:, :k], case.b),
            "W in a wider matrix": (case.a, w_wide[:, :k].t()),
            "a at an odd stride": (a_odd[:, :k], case.b)}


@needs_fp8
def test_decode_strided_operands_and_bias() -> None:
    """Token rows that are not aligned (copied), aligned views read in place (tokens and the
    weight), a weight that is not K-major (copied into that layout once), a strided bias."""
    m, n, k = 5, 200, 320
    case = Case(m, n, k, "row")
    bias_full = torch.randn(2 * n, device="cuda")
    bias = bias_full[::2]
    variants = {"plain": (case.a, case.b), **strided_views(case),
                "b not K-major": (case.a, case.b.contiguous())}
    for name, (a, b) in variants.items():
        out = poisoned_run(lambda: torch.ops.gemmt.scaled_mm(
            a, b, case.sa, case.sb, bias, torch.float32, "none", False), m, n, torch.float32)
        try:
            check(case, out, torch.float32, bias)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


@needs_fp8
def test_decode_is_deterministic() -> None:
    case = Case(33, 4096, 4096, "row")
    first = run(case)
    for _ in range(3):
        assert torch.equal(run(case), first)


@needs_fp8
def test_decode_nan_and_zero_propagation() -> None:
    """A NaN weight byte poisons its output column only, a NaN token byte its row only."""
    case = Case(6, 300, 512, "row")
    w = case.w.cpu().clone()
    w[17, 100] = float("nan")
    a = case.a.cpu().clone()
    a[4, 3] = float("nan")
    out = torch.ops.gemmt.scaled_mm(a.to(case.a.device), w.to(case.a.device).t(), case.sa,
                                    case.sb, None, torch.float32, "none", False)
    nan = torch.isnan(out).cpu()
    expect = torch.zeros_like(nan)
    expect[:, 17] = True
    expect[4, :] = True
    assert torch.equal(nan, expect)
    zeros = torch.ops.gemmt.scaled_mm(torch.zeros_like(case.a), case.b, case.sa, case.sb, None,
                                      torch.float32, "none", False)
    assert torch.equal(zeros, torch.zeros_like(zeros))


@needs_fp8
@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_decode_long_k_accumulates_in_float32(scaling: str) -> None:
    """K = 16384: float32-grade sums (relative error ~1e-6), where a sum kept in fewer bits
    (the tensor cores' own accumulator over a long chain, or bf16) would be at 1e-4 or more."""
    case = Case(16, 512, 16384, scaling)
    out = run(case)
    z, _ = case.dot()
    err = ((out.double() - z).norm() / z.norm()).item()
    assert err < 1e-5, err


@needs_fp8
@pytest.mark.parametrize("k", [32, 128, 4096])
def test_decode_small_products_beside_a_large_one(k: int) -> None:
    """448 + (k - 1) * 2^-6 is exact in float32: a sum whose small terms are aligned to the
    largest one and cut to a few bits (a float8 tensor-core sum of one instruction) returns
    448 or a little more instead. Every product here is exact."""
    m, n = 3, 24
    a = torch.full((m, k), 2.0 ** -6, device="cuda")
    a[:, 0] = 448.0
    w = torch.ones(n, k, device="cuda")
    a8, w8 = a.to(E4M3), w.to(E4M3)
    one = torch.ones((), device="cuda")
    out = torch.ops.gemmt.scaled_mm(a8, w8.t(), one, one, None, torch.float32, "none", False)
    expect = torch.full((m, n), 448.0 + (k - 1) * 2.0 ** -6, device="cuda")
    assert torch.equal(out, expect), (out[0, 0].item(), expect[0, 0].item())


@needs_fp8
@pytest.mark.parametrize("m", [1, 5, 16, 17, 40, 64])
@pytest.mark.parametrize("shape", [(200, 512), (1000, 4096), (24, 4752)])
@pytest.mark.parametrize("w_format", [E4M3, E5M2])
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_decode_sums_are_float32_exact_where_float32_is(m: int, shape: tuple[int, int],
                                                        w_format: torch.dtype,
                                                        scaling: str) -> None:
    """Every token holds 448 at its own K position (a different lane, step and k-block for each)
    among small multiples of 2^-6, against weights of +-1/2, +-1, +-2, with power-of-two scales:
    every partial sum is a multiple of 2^-7 below 2^11, so every float32 sum in any order is
    exact and the output must equal the float64 product bit for bit. A float8 tensor-core sum
    (the small products of an instruction aligned to its largest one and cut to a few bits)
    misses by up to a few 2^-6 an instruction. Covers each token-column width of the Hopper kernel,
    split K and a K tail (4752 = 37 k-blocks + 16)."""
    n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(1000 * m + k)
    a = torch.randint(-3, 4, (m, k), generator=gen).double() * 2.0 ** -6
    pos = (torch.arange(m) * 97 + 13) % k
    a[torch.arange(m), pos] = 448.0
    w = (torch.randint(0, 2, (n, k), generator=gen) * 2 - 1).double()
    w = w * 2.0 ** torch.randint(-1, 2, (n, k), generator=gen).double()
    a8, w8 = a.to(E4M3), w.to(w_format)
    assert torch.equal(a8.double(), a) and torch.equal(w8.double(), w)  # exact operands
    if scaling == "tensor":
        sa, sb = torch.tensor(0.5), torch.tensor(4.0)
    else:
        sa = 2.0 ** torch.randint(-2, 3, (m, 1), generator=gen).float()
        sb = 2.0 ** torch.randint(-2, 3, (1, n), generator=gen).float()
    expect = (a @ w.t()) * sa.double() * sb.double()
    assert torch.equal(expect.float().double(), expect)  # exact in float32
    out = poisoned_run(lambda: torch.ops.gemmt.scaled_mm(
        a8.cuda(), w8.cuda().t(), sa.cuda(), sb.cuda(), None, torch.float32, "none", False),
        m, n, torch.float32)
    diff = (out.cpu().double() - expect).abs()
    assert not (diff > 0).any(), (
        f"{int((diff > 0).sum())} of {diff.numel()} sums not exact; worst off by "
        f"{float(diff.max()):.3g}")


@needs_fp8
@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("m", [1, 16, 31, 64])
@pytest.mark.parametrize("shape", [(4096, 4096), (1024, 2048)])
def test_decode_agrees_with_torch_scaled_mm(scaling: str, m: int, shape: tuple[int, int]) -> None:
    n, k = shape
    case = Case(m, n, k, scaling)
    theirs = None
    for out_dtype in (torch.float32, torch.bfloat16):  # torch's rowwise may want bf16
        try:
            theirs = torch._scaled_mm(case.a, case.b, case.sa, case.sb, out_dtype=out_dtype)
            break
        except (RuntimeError, NotImplementedError) as e:
            why = str(e)
    if theirs is None:
        pytest.skip(f"torch._scaled_mm does not take this case here: {why}")
    mine = run(case, out_dtype)
    check(case, mine, out_dtype)
    z, mag = case.dot()
    # Both are float32 sums of the same exact products, rounded once to out_dtype: within a
    # few float32 sum bounds and two roundings of each other.
    bound = (4 * (k + 16) * U32 * mag + 2 * OUT_U[out_dtype] * z.abs()
             + OUT_TINY[out_dtype])
    diff = (mine.double() - theirs.double()).abs()
    assert (diff <= bound).all(), float((diff / bound).max())


@needs_fp8
def test_decode_kernel_is_the_one_that_runs(decode_path: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """By default (auto), on a Hopper GPU the Hopper kernel takes tensorwise and rowwise
    products of 1-32 tokens (33-64 go to the scaled GEMM) and the mma.sync kernel block scales
    up to 64; elsewhere the mma.sync kernel takes tensorwise and rowwise products of up to 16
    tokens (more go to the scaled GEMM). GEMMT_FP8_DECODE=mma (and its alias always) holds the
    mma.sync kernel to 64 tokens in every scaling, =wgmma asks for the Hopper kernel (the
    mma.sync kernel where it cannot run, up to 64 tokens), =off takes neither; 65 tokens never
    take a decode kernel."""
    if decode_path != DECODE_PATHS[0]:
        pytest.skip("the routing is checked once, with its own settings")

    def ran(m: int, scaling: str = "row") -> set[str]:
        return routed(m, scaling)

    MMA, WG = {MMA_KERNEL}, {WGMMA_KERNEL}
    for mode in ("auto", None):  # unset is auto
        if mode is None:
            monkeypatch.delenv("GEMMT_FP8_DECODE")
        else:
            monkeypatch.setenv("GEMMT_FP8_DECODE", mode)
        assert ran(64, "block") == MMA and ran(1, "block") == MMA
        assert ran(65) == set() and ran(65, "block") == set()
        if _hopper():
            for m in (1, 16, 17, 32):  # each token-column width of the Hopper kernel
                assert ran(m, "tensor") == WG and ran(m, "row") == WG, (m, mode)
            assert ran(33, "tensor") == set() and ran(64) == set(), mode
        else:
            assert ran(8) == MMA and ran(16, "tensor") == MMA
            assert ran(17) == set() and ran(64, "tensor") == set()
    for mode in ("mma", "always"):
        monkeypatch.setenv("GEMMT_FP8_DECODE", mode)
        assert ran(1) == MMA and ran(64) == MMA and ran(64, "tensor") == MMA, mode
        assert ran(64, "block") == MMA and ran(65) == set(), mode
    if _hopper():
        monkeypatch.setenv("GEMMT_FP8_DECODE", "wgmma")
        assert ran(1, "tensor") == WG and ran(32) == WG and ran(33) == MMA and ran(64) == MMA
        assert ran(64, "block") == MMA
        assert ran(65) == set()
    monkeypatch.setenv("GEMMT_FP8_DECODE", "off")
    assert ran(8) == set() and ran(8, "block") == set()
    monkeypatch.setenv("GEMMT_FP8_DECODE", "sometimes")
    case = Case(4, 256, 256, "row")
    with pytest.raises(RuntimeError,
                       match=r"GEMMT_FP8_DECODE expected auto, wgmma, mma, always or off"):
        torch.ops.gemmt.scaled_mm(case.a, case.b, case.sa, case.sb, None, torch.bfloat16,
                                  "none", False)


# Shapes whose K is split over clusters of 2-8 CTAs on the wgmma kernel (132 SMs), evenly
# and not, with tails in N (not a multiple of 64 or 128) and in K (a multiple of 16, not of
# 128).
SPLIT_SHAPES = [(1000, 4096), (300, 4752), (4096, 1040), (520, 2064), (136, 640), (64, 16)]


@needs_fp8
@pytest.mark.parametrize("m", [1, 7, 8, 9, 33, 64])
@pytest.mark.parametrize("shape", SPLIT_SHAPES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_decode_split_k_and_tails(m: int, shape: tuple[int, int], scaling: str) -> None:
    n, k = shape
    case = Case(m, n, k, scaling)
    check(case, run(case), torch.float32)
    out = run(case, torch.bfloat16)
    check(case, out, torch.bfloat16)


@needs_fp8
@pytest.mark.parametrize("split", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("m", [1, 9, 32])
def test_decode_every_forced_split(split: int, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMMT_FP8_DECODE_SPLIT fixes the Hopper kernel's CTAs along K (clamped to its k-blocks):
    every split, even or not, gives a float32-grade product (the other path ignores it)."""
    monkeypatch.setenv("GEMMT_FP8_DECODE_SPLIT", str(split))
    for n, k in [(1000, 4096), (300, 4752), (136, 640), (20000, 1024)]:
        case = Case(m, n, k, "row")
        check(case, run(case), torch.float32)


@needs_fp8
@pytest.mark.parametrize("name, value, expected", [
    ("GEMMT_FP8_DECODE_SPLIT", "9", "an integer from 0 to 8"),
    ("GEMMT_FP8_DECODE_SPLIT", "-1", "an integer from 0 to 8"),
    ("GEMMT_FP8_DECODE_SPLIT", "two", "an integer from 0 to 8"),
    ("GEMMT_FP8_DECODE_SPLIT", "2x", "an integer from 0 to 8")])
def test_decode_settings_refuse_bad_values(name: str, value: str, expected: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    case = Case(4, 256, 256, "row")
    with pytest.raises(RuntimeError, match=f"{name} expected {expected}, got '{value}'"):
        torch.ops.gemmt.scaled_mm(case.a, case.b, case.sa, case.sb, None, torch.bfloat16,
                                  "none", False)


@needs_hopper
def test_wgmma_path_runs_the_wgmma_kernel(decode_path: str) -> None:
    """With GEMMT_FP8_DECODE=wgmma, the operands of this file's tensorwise / rowwise tests of
    up to 32 tokens run the Hopper kernel, not the mma.sync kernel it would fall back to where
    it cannot run."""
    if decode_path != "wgmma":
        pytest.skip("checks the wgmma path")
    expect = {WGMMA_KERNEL}

    def only_wgmma(fn, what: str) -> None:
        names = kernel_names(fn)
        if not names:
            pytest.skip("the profiler recorded no CUDA kernels here")
        assert decode_kernels(names) == expect, (what, names)

    shapes = SHAPES + SPLIT_SHAPES + [(14336, 4096), (4096, 14336), (512, 16384)]
    for n, k in shapes:
        for m in (1, 7, 17, 32):
            for scaling in ("tensor", "row"):
                case = Case(m, n, k, scaling)
                only_wgmma(lambda: run(case), f"{m} x {n} x {k} {scaling}")
    case = Case(13, 520, 640, "row")
    bias = torch.randn(case.n, device="cuda").to(torch.bfloat16)
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        only_wgmma(lambda: run(case, out_dtype, bias, "gelu"), f"epilogue {out_dtype}")
    for pair in [(E4M3, E5M2), (E5M2, E4M3)]:
        mixed = Case(9, 384, 1024, "tensor", fa=pair[0], fw=pair[1])
        only_wgmma(lambda: run(mixed), f"formats {pair}")
    case = Case(5, 200, 320, "row")
    for name, (a, b) in strided_views(case).items():
        only_wgmma(lambda: torch.ops.gemmt.scaled_mm(a, b, case.sa, case.sb, None, torch.float32,
                                                     "none", False), name)


# ---- The Hopper kernel's float8 form (use_fast_accum) ------------------------------------
# With use_fast_accum the caller accepts the tensor cores' float8 sums, and on Hopper the
# decode kernel then runs float8 wgmma on the stages as they landed (1-16 tokens). Each
# 128-deep slice is summed on the tensor cores from zero and joins a float32 total, so the
# error of an element is bounded by a few of the tensor cores' roundings per slice (they keep
# about 13 fractional bits of the largest product: at most 2^-13 of the slice's magnitudes an
# instruction, four instructions a slice), not by K.
FAST_U = 2.0 ** -10  # four instructions' worth of 2^-13, with a factor 2 to spare


def run_fast(case: Case, out_dtype: torch.dtype = torch.float32,
             bias: torch.Tensor | None = None, act: str = "none") -> torch.Tensor:
    return poisoned_run(lambda: torch.ops.gemmt.scaled_mm(
        case.a, case.b, case.sa, case.sb, bias, out_dtype, act, True), case.m, case.n, out_dtype)


def check_fast(case: Case, out: torch.Tensor, out_dtype: torch.dtype,
               bias: torch.Tensor | None = None, act: str = "none") -> None:
    """Every element within the float8 form's bound (FAST_U of the magnitudes, plus the float32
    total's and one rounding to out_dtype), and the whole within 1e-3 of the float64 product
    relative to its norm."""
    check(case, out, out_dtype, bias, act, slice_u=FAST_U)
    if act == "none" and bias is None:
        z, _ = case.dot()
        rel = ((out.double() - z).norm() / z.norm().clamp_min(1e-300)).item()
        assert rel < 1e-3 + 2 * OUT_U[out_dtype], rel


@pytest.fixture
def fast_form(decode_path: str) -> None:
    """The float8 form runs on Hopper under the default and wgmma routes; the mma route (the
    decode_path fixture's other value) holds the float32-grade kernel, checked elsewhere."""
    if not _hopper():
        pytest.skip("the float8 form is the Hopper kernel's")
    if decode_path == "mma":
        pytest.skip("GEMMT_FP8_DECODE=mma keeps the float32-grade kernel")


FAST_TOKENS = [1, 2, 5, 8, 9, 15, 16]


@needs_hopper
@pytest.mark.parametrize("m", FAST_TOKENS)
@pytest.mark.parametrize("shape", SHAPES + SPLIT_SHAPES + [(14336, 4096), (4096, 14336)])
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_fast_decode_against_float64(fast_form: None, m: int, shape: tuple[int, int],
                                     scaling: str) -> None:
    n, k = shape
    case = Case(m, n, k, scaling)
    check_fast(case, run_fast(case), torch.float32)
    check_fast(case, run_fast(case, torch.bfloat16), torch.bfloat16)


@needs_hopper
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("m", [3, 13])
def test_fast_decode_epilogue(fast_form: None, out_dtype: torch.dtype,
                              bias_dtype: torch.dtype | None, act: str, m: int) -> None:
    case = Case(m, 520, 640, "row")
    bias = None if bias_dtype is None else (torch.randn(case.n, device="cuda") * 20).to(bias_dtype)
    check_fast(case, run_fast(case, out_dtype, bias, act), out_dtype, bias, act)


@needs_hopper
@pytest.mark.parametrize("pair", [(E4M3, E5M2), (E5M2, E4M3)])
@pytest.mark.parametrize("m", [1, 9, 16])
def test_fast_decode_mixed_formats(fast_form: None, pair: tuple[torch.dtype, torch.dtype],
                                   m: int) -> None:
    case = Case(m, 384, 1024, "row", fa=pair[0], fw=pair[1])
    check_fast(case, run_fast(case), torch.float32)


@needs_hopper
def test_fast_decode_strided_operands_nan_and_zeros(fast_form: None) -> None:
    """Views read in place or copied as on the float32-grade kernels; a NaN weight byte poisons
    its output column only and a NaN token byte its row only; zero tokens give zeros."""
    m, n, k = 16, 200, 320
    case = Case(m, n, k, "row")
    for name, (a, b) in strided_views(case).items():
        out = poisoned_run(lambda: torch.ops.gemmt.scaled_mm(
            a, b, case.sa, case.sb, None, torch.float32, "none", True), m, n, torch.float32)
        try:
            check_fast(case, out, torch.float32)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
    w = case.w.clone()
    w[17, 100] = float("nan")
    a = case.a.clone()
    a[11, 3] = float("nan")
    out = torch.ops.gemmt.scaled_mm(a, w.t(), case.sa, case.sb, None, torch.float32, "none", True)
    expect = torch.zeros(m, n, dtype=torch.bool)
    expect[:, 17] = True
    expect[11, :] = True
    assert torch.equal(torch.isnan(out).cpu(), expect)
    zeros = torch.ops.gemmt.scaled_mm(torch.zeros_like(case.a), case.b, case.sa, case.sb, None,
                                      torch.float32, "none", True)
    assert torch.equal(zeros, torch.zeros_like(zeros))


@needs_hopper
@pytest.mark.parametrize("m", [1, 9, 16])
def test_fast_decode_every_forced_split(fast_form: None, m: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forced split of K, even or not, stays within the bound, and runs repeat bit for
    bit."""
    for n, k in [(1000, 4096), (300, 4752), (136, 640), (20000, 1024)]:
        case = Case(m, n, k, "row")
        for split in (1, 2, 3, 5, 8):
            monkeypatch.setenv("GEMMT_FP8_DECODE_SPLIT", str(split))
            first = run_fast(case)
            check_fast(case, first, torch.float32)
            assert torch.equal(run_fast(case), first), (n, k, split)


@needs_hopper
@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("m", [1, 8, 16])
def test_fast_decode_agrees_with_torch_fast_accum(fast_form: None, scaling: str, m: int) -> None:
    """Against torch._scaled_mm(use_fast_accum=True) (cuBLASLt's float8 sums): both within
    their float8 sums' bounds of each other."""
    n, k = 4096, 4096
    case = Case(m, n, k, scaling)
    try:
        theirs = torch._scaled_mm(case.a, case.b, case.sa, case.sb, out_dtype=torch.bfloat16,
                                  use_fast_accum=True)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm does not take this case here: {e}")
    mine = run_fast(case, torch.bfloat16)
    check_fast(case, mine, torch.bfloat16)
    z, mag = case.dot()
    # cuBLASLt may keep the whole K in the tensor cores' accumulator: its bound grows with
    # the k-blocks, each adding a few of those roundings.
    bound = (FAST_U * (1 + k // BLOCK) + 4 * (k + 16) * U32) * mag \
        + 2 * OUT_U[torch.bfloat16] * z.abs() + OUT_TINY[torch.bfloat16]
    diff = (mine.double() - theirs.double()).abs()
    assert (diff <= bound).all(), float((diff / bound).max())


@needs_hopper
def test_fast_decode_kernel_routing(decode_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With use_fast_accum, auto and wgmma send tensorwise / rowwise products of 1-16 tokens to
    the float8 form; auto sends 17-64 to the scaled GEMM, wgmma keeps them on the widened form
    (up to 32) and the mma.sync kernel; GEMMT_FP8_DECODE_FAST=0 routes them as without
    use_fast_accum; block scales stay on the mma.sync kernel; mma keeps its kernel; a bad
    value is refused."""
    if decode_path != DECODE_PATHS[0]:
        pytest.skip("the routing is checked once, with its own settings")

    def ran(m: int, scaling: str = "row") -> set[str]:
        return routed(m, scaling, fast_accum=True)

    FAST, WG, MMA = {FAST_KERNEL}, {WGMMA_KERNEL}, {MMA_KERNEL}
    for mode in ("auto", "wgmma"):
        monkeypatch.setenv("GEMMT_FP8_DECODE", mode)
        for m in (1, 9, 16):
            assert ran(m, "tensor") == FAST and ran(m) == FAST, (mode, m)
        if mode == "auto":
            assert ran(17) == set() and ran(32, "tensor") == set() and ran(64) == set()
        else:
            assert ran(17) == WG and ran(32, "tensor") == WG and ran(64) == MMA
        assert ran(65) == set() and ran(64, "block") == MMA and ran(1, "block") == MMA, mode
        monkeypatch.setenv("GEMMT_FP8_DECODE_FAST", "0")
        assert ran(1) == WG and ran(32, "tensor") == WG, mode
        assert ran(64) == (set() if mode == "auto" else MMA), mode
        monkeypatch.delenv("GEMMT_FP8_DECODE_FAST")
    monkeypatch.setenv("GEMMT_FP8_DECODE", "mma")
    assert ran(1) == MMA and ran(64) == MMA
    monkeypatch.setenv("GEMMT_FP8_DECODE", "auto")
    monkeypatch.setenv("GEMMT_FP8_DECODE_FAST", "yes")
    case = Case(4, 256, 256, "row")
    with pytest.raises(RuntimeError, match="GEMMT_FP8_DECODE_FAST expected 0 or 1, got 'yes'"):
        torch.ops.gemmt.scaled_mm(case.a, case.b, case.sa, case.sb, None, torch.bfloat16,
                                  "none", True)
