"""scaled_grouped_mm: float8 grouped products with row scales (torch._scaled_grouped_mm's
layouts) or 1x128 / 128x128 block scales against a float64 definition, every layout, bias,
activation and out_dtype, empty groups and rows of no group, opcheck, sharding rules, bad input;
on a Hopper GPU the FP8 kernel against the same definition, torch's own product and the CPU
kernel."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gemmt
from conftest import HAS_CUDA, opcheck_float8, rel_err
from gemmt.ops import scaled_grouped_mm

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def offsets(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)


def fp8(*shape: int, dtype: torch.dtype = E4M3, device: str = "cpu") -> torch.Tensor:
    """Random float8 values spread over a few binades (never all zero)."""
    return (torch.randn(*shape, device=device) * 4).to(dtype)


def col_major(t: torch.Tensor) -> torch.Tensor:
    """t's values with its last two dimensions column-major (K-major for b)."""
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


def scales(*shape: int, device: str = "cpu") -> torch.Tensor:
    return torch.rand(*shape, device=device) * 0.5 + 0.05


def act_ref(z: torch.Tensor, activation: str) -> torch.Tensor:
    f = torch.nn.functional
    return {"none": z, "relu": torch.relu(z), "gelu": f.gelu(z),
            "gelu_tanh": f.gelu(z, approximate="tanh"), "silu": f.silu(z)}[activation]


def definition(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               activation: str = "none") -> torch.Tensor:
    """Each group's dequantised product in float64, written out group by group."""
    a, b = a.double().cpu(), b.double().cpu()
    sa, sb = scale_a.double().cpu(), scale_b.double().cpu()
    bias = None if bias is None else bias.double().cpu()
    ends = [] if offs is None else offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 3 and b.dim() == 3:
        out = (a * sa.unsqueeze(2)) @ (b * sb.unsqueeze(1))
        if bias is not None:
            out = out + bias.unsqueeze(1)
    elif a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = (a[s:e] * sa[s:e, None]) @ (b[g] * sb[g][None, :])
            if bias is not None:
                out[s:e] += bias[g]
    elif a.dim() == 2 and b.dim() == 2:
        m, n = a.shape[0], b.shape[1]
        out = torch.zeros(len(ends), m, n, dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[g] = (a[:, s:e] * sa[g * m:(g + 1) * m, None]) @ (b[s:e] * sb[g * n:(g + 1) * n])
    else:
        out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = (a[g] * sa[g][:, None]) @ (b[:, s:e] * sb[None, s:e])
    return act_ref(out, activation)


def case(layout: str, device: str = "cpu", dtype_a: torch.dtype = E4M3,
         dtype_b: torch.dtype = E4M3, sizes: tuple[int, ...] = (5, 0, 9, 3),
         m: int = 6, k: int = 48, n: int = 24) -> dict[str, Any]:
    """Operands of one layout in torch._scaled_grouped_mm's form (a row-major, b
    column-major), rows / columns past the last offset included where the layout has them."""
    g = len(sizes)
    total = sum(sizes)
    if layout == "2d3d":
        a, b = fp8(total + 2, k, dtype=dtype_a), col_major(fp8(g, k, n, dtype=dtype_b))
        sa, sb, offs = scales(total + 2), scales(g, n), offsets(list(sizes))
    elif layout == "3d3d":
        a, b = fp8(g, m, k, dtype=dtype_a), col_major(fp8(g, k, n, dtype=dtype_b))
        sa, sb, offs = scales(g, m), scales(g, n), None
    elif layout == "2d2d":
        depth = [16 * s for s in sizes]
        a, b = fp8(m, sum(depth) + 16, dtype=dtype_a), col_major(fp8(sum(depth) + 16, n, dtype=dtype_b))
        sa, sb, offs = scales(g * m), scales(g * n), offsets(depth)
    else:  # 3d2d
        a, b = fp8(g, m, k, dtype=dtype_a), col_major(fp8(k, total + 3, dtype=dtype_b))
        sa, sb, offs = scales(g, m), scales(total + 3), offsets(list(sizes))
    out = {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "offs": offs}
    return {key: None if v is None else v.to(device) for key, v in out.items()}


LAYOUTS = ["2d3d", "3d3d", "2d2d", "3d2d"]


# ---- CPU: the definition ----

@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_definition(layout: str) -> None:
    c = case(layout)
    out = scaled_grouped_mm(**c, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert rel_err(out, definition(**c)) < 1e-6


@pytest.mark.parametrize("layout", ["2d3d", "3d3d"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_bias_and_activation(layout: str, activation: str) -> None:
    c = case(layout)
    g, n = c["b"].shape[0], c["b"].shape[2]
    bias = torch.randn(g, n)
    out = scaled_grouped_mm(**c, bias=bias, out_dtype=torch.float32, activation=activation)
    assert rel_err(out, definition(**c, bias=bias, activation=activation)) < 1e-6


def test_rows_of_no_group_and_empty_groups_are_zero() -> None:
    c = case("2d3d", sizes=(0, 4, 0, 3))
    bias = torch.randn(4, c["b"].shape[2])
    out = scaled_grouped_mm(**c, bias=bias, out_dtype=torch.float32)
    assert torch.all(out[7:] == 0) and out[:7].abs().sum() > 0
    empty = scaled_grouped_mm(**case("2d2d", sizes=(0, 2)), out_dtype=torch.float32)
    assert torch.all(empty[0] == 0) and empty[1].abs().sum() > 0


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16, torch.float32])
def test_out_dtype(out_dtype: torch.dtype | None) -> None:
    c = case("2d3d")
    out = scaled_grouped_mm(**c, out_dtype=out_dtype)
    want = out_dtype or torch.bfloat16
    assert out.dtype == want
    assert rel_err(out, definition(**c)) < {torch.float32: 1e-6}.get(want, 4e-3)


def test_mixed_formats() -> None:
    for da, db in [(E5M2, E4M3), (E4M3, E5M2)]:
        c = case("2d3d", dtype_a=da, dtype_b=db)
        assert rel_err(scaled_grouped_mm(**c, out_dtype=torch.float32), definition(**c)) < 1e-6


def test_meta_shapes() -> None:
    for layout, want in [("2d3d", (19, 24)), ("3d3d", (4, 6, 24)), ("2d2d", (4, 6, 24)),
                         ("3d2d", (6, 20))]:
        c = {k: None if v is None else v.to("meta") for k, v in case(layout).items()}
        out = torch.ops.gemmt.scaled_grouped_mm(**c)
        assert tuple(out.shape) == want and out.dtype == torch.bfloat16


# ---- block scales: 1x128 of a, 128x128 of each group's b ----

def block_case(layout: str, device: str = "cpu", dtype_a: torch.dtype = E4M3,
               dtype_b: torch.dtype = E4M3, sizes: tuple[int, ...] = (5, 0, 9, 3),
               m: int = 6, k: int = 256, n: int = 200) -> dict[str, Any]:
    """A 2-D x 3-D or 3-D x 3-D case with block scales: scale_a (rows, K/128) or
    (G, M, K/128), column-major as torch._scaled_mm takes 1x128 scales; scale_b
    (G, K/128, ceil(N/128)), the transpose of each group's (N/128, K/128) block grid."""
    c = case(layout, dtype_a=dtype_a, dtype_b=dtype_b, sizes=sizes, m=m, k=k, n=n)
    g, kb, nb = c["b"].shape[0], k // 128, (n + 127) // 128
    c["scale_a"] = col_major(scales(*c["a"].shape[:-1], kb))
    c["scale_b"] = scales(g, nb, kb).transpose(1, 2)
    return {key: None if v is None else v.to(device) for key, v in c.items()}


def block_definition(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                     scale_b: torch.Tensor, offs: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    """The float64 product of the operands dequantised block by block."""
    n = b.shape[2]
    a64 = a.double().cpu() * scale_a.double().cpu().repeat_interleave(128, -1)
    sb = scale_b.double().cpu().repeat_interleave(128, 1).repeat_interleave(128, 2)[..., :n]
    b64 = b.double().cpu() * sb
    ones_a = torch.ones(a.shape[:-1], dtype=torch.float64)
    ones_b = torch.ones(b.shape[0], n, dtype=torch.float64)
    return definition(a64, b64, ones_a, ones_b, offs, bias, activation)


@pytest.mark.parametrize("layout", ["2d3d", "3d3d"])
def test_block_scales_match_definition(layout: str) -> None:
    c = block_case(layout)
    out = scaled_grouped_mm(**c, out_dtype=torch.float32)
    assert rel_err(out, block_definition(**c)) < 1e-6
    # One scale changed moves only its block's rows / columns.
    c["scale_b"] = c["scale_b"].clone()
    c["scale_b"][2, 1, 1] *= 2
    moved = scaled_grouped_mm(**c, out_dtype=torch.float32)
    assert rel_err(moved, block_definition(**c)) < 1e-6 and not torch.equal(moved, out)


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_block_scales_bias_activation_and_empty_groups(activation: str) -> None:
    c = block_case("2d3d", sizes=(0, 4, 0, 3))
    bias = torch.randn(4, 200)
    out = scaled_grouped_mm(**c, bias=bias, activation=activation, out_dtype=torch.float32)
    assert torch.all(out[7:] == 0) and out[:7].abs().sum() > 0
    assert rel_err(out, block_definition(**c, bias=bias, activation=activation)) < 1e-6
    for da, db in [(E5M2, E4M3), (E4M3, E5M2)]:
        c = block_case("3d3d", dtype_a=da, dtype_b=db)
        out = scaled_grouped_mm(**c, out_dtype=torch.float32)
        assert rel_err(out, block_definition(**c)) < 1e-6


def test_block_scales_error_flat_in_k() -> None:
    """Each 128-deep block is summed in float32 with its scales, the blocks in float64: the
    reference's own error does not grow with K."""
    errs = []
    for k in (1024, 4096, 16384):
        torch.manual_seed(0)
        c = block_case("2d3d", sizes=(8, 8), k=k, n=128)
        errs.append(rel_err(scaled_grouped_mm(**c, out_dtype=torch.float32), block_definition(**c)))
    assert max(errs) < 1e-6 and errs[-1] < 4 * errs[0] + 1e-8


def test_block_scales_bad_input_is_refused_clearly() -> None:
    c = block_case("2d3d")
    with pytest.raises(RuntimeError, match=r"'scale_b' expected 128x128 block scales of shape "
                                           r"\[4, 2, 2\]"):
        scaled_grouped_mm(**{**c, "scale_b": c["scale_b"][:, :, :1]})
    with pytest.raises(RuntimeError, match=r"'scale_a' expected 1x128 block scales of shape "
                                           r"\[19, 2\]"):
        scaled_grouped_mm(**{**c, "scale_a": c["scale_a"][:, :1]})
    with pytest.raises(RuntimeError, match="block scales expected the contraction dimension"):
        scaled_grouped_mm(**{**c, "a": c["a"][:, :192], "b": c["b"][:, :192],
                             "scale_a": c["scale_a"][:, :1], "scale_b": c["scale_b"][:, :1]})
    r = case("3d2d")
    with pytest.raises(RuntimeError, match="block scales .* expected a 2-D x 3-D or 3-D x 3-D"):
        scaled_grouped_mm(**{**r, "scale_a": scales(4, 6, 1)})
    with pytest.raises(RuntimeError, match="finite, positive dequantisation scales"):
        scaled_grouped_mm(**{**c, "scale_b": torch.zeros_like(c["scale_b"])})


# ---- bad input ----

def test_bad_input_is_refused_clearly() -> None:
    c = case("2d3d")
    with pytest.raises(RuntimeError, match=r"gemmt::scaled_grouped_mm: argument 'a'.*Float8"):
        scaled_grouped_mm(**{**c, "a": c["a"].float()})
    with pytest.raises(RuntimeError, match=r"'scale_b' expected a float32 tensor of shape \[4, 24\]"):
        scaled_grouped_mm(**{**c, "scale_b": c["scale_b"][:, :3]})
    with pytest.raises(RuntimeError, match=r"'scale_a' expected a 1-D float32 tensor of 19"):
        scaled_grouped_mm(**{**c, "scale_a": c["scale_a"][:5]})
    with pytest.raises(RuntimeError, match="at most one Float8_e5m2"):
        scaled_grouped_mm(**{**c, "a": c["a"].to(E5M2), "b": c["b"].to(E5M2)})
    with pytest.raises(RuntimeError, match="multiple of 16"):
        scaled_grouped_mm(**{**c, "a": c["a"][:, :40], "b": c["b"][:, :40]})
    with pytest.raises(RuntimeError, match="'offs' expected a 1-D int32"):
        scaled_grouped_mm(**{**c, "offs": None})
    with pytest.raises(RuntimeError, match="'out_dtype' expected"):
        scaled_grouped_mm(**c, out_dtype=torch.float64)
    with pytest.raises(RuntimeError, match="finite, positive dequantisation scales"):
        scaled_grouped_mm(**{**c, "scale_a": torch.zeros_like(c["scale_a"])})
    with pytest.raises(RuntimeError, match="is not differentiable, but argument 'scale_b'"):
        scaled_grouped_mm(**{**c, "scale_b": c["scale_b"].clone().requires_grad_()})


# ---- opcheck and sharding rules ----

def opcheck_cases(device: str) -> list[tuple[Any, tuple, dict]]:
    """Collected by test_autograd_opcheck.test_every_registered_op_is_opchecked."""
    g = torch.ops.gemmt.scaled_grouped_mm
    cases = []
    for layout in LAYOUTS:
        c = case(layout, device=device)
        cases.append((g, (c["a"], c["b"], c["scale_a"], c["scale_b"], c["offs"]), {}))
    c = case("2d3d", device=device)
    bias = torch.randn(4, 24, device=device)
    cases.append((g, (c["a"], c["b"], c["scale_a"], c["scale_b"], c["offs"], bias),
                  {"activation": "silu", "out_dtype": torch.float32}))
    for layout in ("2d3d", "3d3d"):
        c = block_case(layout, device=device)
        cases.append((g, (c["a"], c["b"], c["scale_a"], c["scale_b"], c["offs"]), {}))
    cases.append((torch.ops.gemmt.moe_experts_float8,
                  tuple(float8_experts_case(device).values()), {}))
    return cases


def test_opcheck() -> None:
    for op, args, kwargs in opcheck_cases("cpu"):
        opcheck_float8(op, args, kwargs, float8_inputs=True)


def test_torch_compile_fullgraph() -> None:
    c = case("2d3d")
    fn = torch.compile(lambda a, b, sa, sb, o: torch.ops.gemmt.scaled_grouped_mm(a, b, sa, sb, o),
                       fullgraph=True, backend="aot_eager")
    out = fn(c["a"], c["b"], c["scale_a"], c["scale_b"], c["offs"])
    assert torch.equal(out, scaled_grouped_mm(**c))


def test_sharding_rules_place_each_scale() -> None:
    class Spec:
        def __init__(self, ndim: int) -> None:
            self.placements = ()
            self.tensor_meta = type("Meta", (), {"shape": (1,) * ndim})()

    rules = gemmt.distributed.rules_for("scaled_grouped_mm", Spec(3), Spec(3), Spec(2), Spec(2),
                                        None, Spec(2), None, "none", False)
    by_name = {r.name: r for r in rules}
    assert set(by_name) == {"replicated", "column-wise", "by group", "split K"}
    Shard = torch.distributed.tensor.Shard
    assert by_name["column-wise"].inputs[2:4] == (torch.distributed.tensor.Replicate(), Shard(1))
    assert by_name["by group"].inputs[:4] == (Shard(0),) * 4
    both_2d = gemmt.distributed.rules_for("scaled_grouped_mm", Spec(2), Spec(2), Spec(1),
                                          Spec(1), Spec(1), None, None, "none", False)
    assert [r.name for r in both_2d] == ["replicated"]
    block = gemmt.distributed.rules_for("scaled_grouped_mm", Spec(3), Spec(3), Spec(3), Spec(3),
                                        None, None, None, "none", False)
    assert [r.name for r in block] == ["replicated", "by group"]


# ---- CUDA: the FP8 Hopper kernel ----

def hopper() -> bool:
    return HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_cuda_matches_definition(layout: str, out_dtype: torch.dtype, fast_accum: bool) -> None:
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    sizes = (130, 0, 77, 256, 1, 64)
    c = case(layout, device="cuda", sizes=sizes, m=200, k=512, n=320)
    out = scaled_grouped_mm(**c, out_dtype=out_dtype, use_fast_accum=fast_accum)
    ref = definition(**c)
    # float8 products are exact; the tensor cores add them with about 14 bits of mantissa
    # within each 128-deep block (torch's FP8 kernels too), whose sums join a float32 total
    # (or, with fast_accum, the whole K stays in the tensor cores' accumulator); then one
    # rounding to out_dtype. A wrong scale or group is off by 1e-2 or more.
    bound = 4e-3 if out_dtype == torch.bfloat16 else (1e-3 if fast_accum else 5e-4)
    assert rel_err(out, ref) < bound
    cpu = scaled_grouped_mm(**{k: None if v is None else v.cpu() for k, v in c.items()},
                            out_dtype=out_dtype)
    assert rel_err(out, cpu) < bound


@pytest.mark.cuda
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_cuda_bias_activation_mixed_formats(activation: str) -> None:
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    for layout in ("2d3d", "3d3d"):
        for da, db in [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)]:
            c = case(layout, device="cuda", dtype_a=da, dtype_b=db, sizes=(33, 0, 150, 7),
                     m=70, k=256, n=200)
            bias = torch.randn(4, 200, device="cuda")
            out = scaled_grouped_mm(**c, bias=bias, activation=activation,
                                    out_dtype=torch.float32)
            assert rel_err(out, definition(**c, bias=bias, activation=activation)) < 5e-4


@pytest.mark.cuda
def test_cuda_rows_of_no_group_and_graph_capture() -> None:
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    c = case("2d3d", device="cuda", sizes=(0, 40, 0, 90), k=128, n=256)
    out = torch.full((c["a"].shape[0], 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    scaled_grouped_mm(**c)  # compiled and planned outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out.copy_(scaled_grouped_mm(**c))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.all(out[130:] == 0)
    assert rel_err(out, definition(**c)) < 4e-3
    # New routing in the same buffers: the graph reads the offsets on the GPU.
    c["offs"].copy_(offsets([10, 30, 50, 40]).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, definition(**c)) < 4e-3


@pytest.mark.cuda
def test_cuda_against_torch_scaled_grouped_mm() -> None:
    if not hopper() or not hasattr(torch, "_scaled_grouped_mm"):
        pytest.skip("needs a Hopper GPU and torch._scaled_grouped_mm")
    c = case("2d3d", device="cuda", sizes=(128, 0, 304, 64, 208), k=1024, n=512)
    ref = definition(**c)
    ours = scaled_grouped_mm(**c)
    theirs = torch._scaled_grouped_mm(c["a"], c["b"], c["scale_a"], c["scale_b"], offs=c["offs"],
                                      out_dtype=torch.bfloat16)
    valid = int(c["offs"][-1])
    assert rel_err(ours[:valid], ref[:valid]) <= 1.05 * rel_err(theirs[:valid], ref[:valid]) + 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["2d3d", "3d3d"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cuda_block_scales_match_definition(layout: str, out_dtype: torch.dtype) -> None:
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    c = block_case(layout, device="cuda", sizes=(130, 0, 77, 256, 1, 64), m=200, k=1024, n=328)
    ref = block_definition(**c)
    bound = 4e-3 if out_dtype == torch.bfloat16 else 5e-4
    for fast_accum in (False, True):  # block scales are always applied a k-block at a time
        out = scaled_grouped_mm(**c, out_dtype=out_dtype, use_fast_accum=fast_accum)
        assert rel_err(out, ref) < bound
    cpu = scaled_grouped_mm(**{k: None if v is None else v.cpu() for k, v in c.items()},
                            out_dtype=out_dtype)
    assert rel_err(out, cpu) < bound
    if layout == "2d3d":
        assert torch.all(out[528:] == 0)


@pytest.mark.cuda
@pytest.mark.parametrize("scaling", ["row", "block"])
@pytest.mark.parametrize("layout", ["2d3d", "3d3d"])
@pytest.mark.parametrize("tile", ["128", "192"])
def test_cuda_groups_on_either_promoted_tile(scaling: str, layout: str, tile: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups run on lone CTAs 128 or 192 wide (GEMMT_FP8_TILE forces the width the planner
    weighs): uneven and empty groups, a column count that ends inside a 192-wide tile and a
    128-column scale block, row or 128x128 block scales (a 192-wide tile's columns split
    between two of each group's scale blocks), C staged (bf16) or from registers (float32);
    against the float64 definition, the output poisoned first."""
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    monkeypatch.setenv("GEMMT_FP8_TILE", tile)
    sizes = (300, 0, 77, 512, 1, 640)
    if scaling == "row":
        c = case(layout, device="cuda", sizes=sizes, m=520, k=512, n=648)
        ref = definition(**c)
    else:
        c = block_case(layout, device="cuda", sizes=sizes, m=520, k=512, n=648)
        ref = block_definition(**c)
    for out_dtype, bound in ((torch.bfloat16, 4e-3), (torch.float32, 5e-4)):
        torch.full((4 * ref.numel(),), float("nan"), device="cuda")
        out = scaled_grouped_mm(**c, out_dtype=out_dtype)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) < bound


@pytest.mark.cuda
def test_cuda_block_scales_bias_formats_layouts_and_graphs() -> None:
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    for da, db in [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)]:
        c = block_case("2d3d", device="cuda", dtype_a=da, dtype_b=db, sizes=(33, 0, 150, 7),
                       k=512, n=384)
        bias = torch.randn(4, 384, device="cuda")
        out = scaled_grouped_mm(**c, bias=bias, activation="silu", out_dtype=torch.float32)
        assert rel_err(out, block_definition(**c, bias=bias, activation="silu")) < 5e-4
    # Contiguous scales and a b that needs its K-major copy (the input gradient's layout).
    c = block_case("2d3d", device="cuda", sizes=(64, 200), k=384, n=256)
    c["scale_a"], c["scale_b"] = c["scale_a"].contiguous(), c["scale_b"].contiguous()
    c["b"] = c["b"].contiguous()
    assert rel_err(scaled_grouped_mm(**c, out_dtype=torch.float32), block_definition(**c)) < 5e-4
    c = block_case("2d3d", device="cuda", sizes=(0, 40, 0, 90), k=256, n=256)
    out = torch.full((c["a"].shape[0], 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    scaled_grouped_mm(**c)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(scaled_grouped_mm(**c))
    c["offs"].copy_(offsets([10, 30, 50, 40]).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, block_definition(**c)) < 4e-3


@pytest.mark.cuda
def test_cuda_block_scales_against_torch_scaled_mm_per_group() -> None:
    """Against torch._scaled_mm's blockwise product (cuBLASLt) group by group: no larger an
    error against the float64 definition."""
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    sizes = (128, 256, 384, 512)
    c = block_case("2d3d", device="cuda", sizes=sizes, k=2048, n=512)
    ref = block_definition(**c)
    ours = scaled_grouped_mm(**c)
    theirs = torch.zeros_like(ours)
    start = 0
    try:
        for g, rows in enumerate(sizes):
            end = start + rows
            theirs[start:end] = torch._scaled_mm(
                c["a"][start:end], c["b"][g], scale_a=c["scale_a"][start:end].t().contiguous().t(),
                scale_b=c["scale_b"][g], out_dtype=torch.bfloat16)
            start = end
    except RuntimeError as exc:
        pytest.skip(f"torch._scaled_mm has no blockwise product here: {exc}")
    valid = sum(sizes)
    assert rel_err(ours[:valid], ref[:valid]) <= 1.05 * rel_err(theirs[:valid], ref[:valid]) + 1e-4


# ---- Float8MoE: the FP8 expert layer for inference ----

def emulate_float8_moe(moe: gemmt.nn.MoE, x: torch.Tensor) -> torch.Tensor:
    """Float8MoE's arithmetic in float64 slot by slot: the tokens and expert weights quantised
    as its quantize_fp8 calls do, the gate/up product rounded to the layer's dtype, swiglu,
    the rows quantised again, the down product, the weighted sum per token."""
    from gemmt.moe import quantize_experts
    from gemmt.nn import _route

    flat = x.reshape(-1, moe.hidden_size)
    routing, weights = _route(moe, flat)
    xq, xs = gemmt.quantize_fp8(flat, "row")
    gu_q, gu_s = quantize_experts(moe.gate_up_proj.detach())
    dn_q, dn_s = quantize_experts(moe.down_proj.detach())
    inter = moe.intermediate_size
    out = torch.zeros(flat.shape, dtype=torch.float64, device=x.device)
    for t in range(flat.shape[0]):
        for j in range(moe.top_k):
            e = int(routing.expert_ids[t, j])
            h = (xq[t].double() * xs[t].double()) @ (gu_q[e].double() * gu_s[e, :, None].double()).t()
            h = h.to(x.dtype)
            act = gemmt.swiglu(h[None, :inter], h[None, inter:])
            aq, a_s = gemmt.quantize_fp8(act, "row")
            o = (aq.double() * a_s.double()) @ (dn_q[e].double() * dn_s[e, :, None].double()).t()
            out[t] += float(weights[t, j]) * o[0]
    return out.reshape(x.shape)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_float8_moe_matches_its_emulation(device: str) -> None:
    if device == "cuda" and not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    moe = gemmt.nn.MoE(256, 128, 8, 2, device=device, dtype=torch.bfloat16)
    layer = gemmt.nn.Float8MoE.from_moe(moe)
    x = torch.randn(3, 17, 256, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        out = layer(x)
        ref = emulate_float8_moe(moe, x)
        bf16 = moe(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    # A value near a float8 rounding boundary may round the other way on either side (the
    # products' own float32 / tensor-core sums differ in the last bits): a few 1e-3. A wrong
    # expert, scale or weight is off by tens of percent.
    assert rel_err(out, ref) < 1e-2
    assert rel_err(out, bf16) < 0.1  # float8's own error against the bf16 layer
    assert "gate_up_proj_fp8" in dict(layer.named_buffers())
    assert layer.gate_up_proj_fp8.shape == (8, 256, 256)
    assert layer.gate_up_proj_fp8.dtype == E4M3 and layer.down_proj_scale.shape == (8, 256)


def test_float8_moe_is_not_differentiable() -> None:
    layer = gemmt.nn.Float8MoE.from_moe(gemmt.nn.MoE(64, 32, 4, 2))
    x = torch.randn(5, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="gemmt.nn.Float8MoE: inference only"):
        layer(x)
    with torch.no_grad():
        assert layer(x).shape == x.shape


def float8_experts_case(device: str = "cpu", tokens: int = 37, hidden: int = 64,
                        inter: int = 48, experts: int = 6, top_k: int = 2) -> dict[str, Any]:
    """moe_experts_float8's arguments: quantised random experts and a softmax routing."""
    from gemmt.moe import quantize_experts

    torch.manual_seed(1)
    gu = torch.randn(experts, 2 * inter, hidden, device=device) / hidden ** 0.5
    dn = torch.randn(experts, hidden, inter, device=device) / inter ** 0.5
    gu_q, gu_s = quantize_experts(gu)
    dn_q, dn_s = quantize_experts(dn)
    x = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    r = gemmt.moe_route(torch.randn(tokens, experts, device=device), top_k)
    return {"x": x, "w_gate_up": gu_q, "w_gate_up_scale": gu_s, "w_down": dn_q,
            "w_down_scale": dn_s, "weights": r.weights, "expert_ids": r.expert_ids,
            "token_order": r.token_order, "offsets": r.offsets}


def test_moe_experts_float8_op_bad_input_and_no_gradient() -> None:
    op = torch.ops.gemmt.moe_experts_float8
    c = float8_experts_case()
    with pytest.raises(RuntimeError, match=r"moe_experts_float8: argument 'w_gate_up' expected.*"
                                           r"Float8"):
        op(**{**c, "w_gate_up": c["w_gate_up"].float()})
    with pytest.raises(RuntimeError, match=r"'w_down_scale' expected a float32 scale an output "
                                           r"row of each expert, shape \[6, 64\]"):
        op(**{**c, "w_down_scale": c["w_down_scale"][:, :5]})
    with pytest.raises(RuntimeError, match=r"'offsets' expected one offset per expert \(6\)"):
        op(**{**c, "offsets": c["offsets"][:5]})
    with pytest.raises(RuntimeError, match="multiples of 16"):
        op(**{**c, "x": c["x"][:, :40], "w_gate_up": c["w_gate_up"][:, :, :40],
              "w_down": c["w_down"][:, :40], "w_down_scale": c["w_down_scale"][:, :40]})
    with pytest.raises(RuntimeError, match="'token_order' expected a permutation"):
        op(**{**c, "token_order": torch.zeros_like(c["token_order"])})
    with pytest.raises(RuntimeError, match="is for inference .* argument 'x' requires grad"):
        op(**{**c, "x": c["x"].float().requires_grad_()})
    out = op(**c)
    assert out.shape == c["x"].shape and out.dtype == torch.bfloat16
    meta = op(**{k: v.to("meta") for k, v in c.items()})
    assert meta.shape == c["x"].shape and meta.device.type == "meta"


def test_moe_experts_float8_op_rules() -> None:
    # (Its opcheck runs with opcheck_cases above.)
    assert gemmt.distributed.rules_for("moe_experts_float8", *([None] * 9))[0].name == "replicated"


@pytest.mark.cuda
def test_cuda_moe_experts_float8_matches_the_cpu_op() -> None:
    """gemmt's gather and combine kernels against the CPU op's ATen steps, on the same
    quantised experts and routing. The products' own sums differ in their last bits, and the
    intermediate rows are quantised again (3 mantissa bits): where a value sits on a float8
    rounding boundary the two sides round it apart (12% of that value), which leaves 1-2%
    between them (H200: 1.4e-2); a wrong row, expert, scale or weight is off by tens of
    percent."""
    if not hopper():
        pytest.skip("the FP8 kernel needs a Hopper GPU")
    c = float8_experts_case("cpu", tokens=300, hidden=256, inter=128, experts=16, top_k=4)
    ours = torch.ops.gemmt.moe_experts_float8(**{k: v.cuda() for k, v in c.items()})
    ref = torch.ops.gemmt.moe_experts_float8(**c)
    assert rel_err(ours, ref) < 3e-2
    c = float8_experts_case("cuda", tokens=0)
    assert torch.ops.gemmt.moe_experts_float8(**c).shape == (0, 64)
