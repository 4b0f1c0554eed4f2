"""add, square, scale: exact against PyTorch in every dtype, every layout, every device."""

from __future__ import annotations

import pytest
import torch

import gemmt
from conftest import FLOAT_DTYPES, randn

SHAPES = [(1,), (7,), (37,), (1000,), (33, 65), (4, 5, 6, 7), (33, 64), (3, 5, 16)]


def layouts(base: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same values as contiguous, misaligned (storage offset 1) and strided tensors."""
    flat = torch.empty(base.numel() + 1, dtype=base.dtype, device=base.device)
    flat[1:] = base.reshape(-1)
    misaligned = flat[1:].view(base.shape)
    strided = torch.empty(
        (*base.shape[:-1], base.shape[-1] * 2), dtype=base.dtype, device=base.device
    )[..., ::2]
    strided.copy_(base)
    out = {"contiguous": base, "offset1": misaligned, "strided": strided}
    if base.dim() >= 2:
        out["transposed"] = base.transpose(0, 1).contiguous().transpose(0, 1)
        # Dense rows spaced wider than the row (a column slice): the row-view path on CUDA
        # when rows are whole 16-byte packs.
        wide = torch.empty((*base.shape[:-1], base.shape[-1] + 16), dtype=base.dtype,
                           device=base.device)
        out["column_slice"] = wide[..., : base.shape[-1]]
        out["column_slice"].copy_(base)
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_square_scale_match_torch_bitwise(device: str, dtype: torch.dtype, shape) -> None:
    a = randn(*shape, dtype=dtype, device=device)
    b = randn(*shape, dtype=dtype, device=device)
    for name, la in layouts(a).items():
        lb = layouts(b)[name]
        assert torch.equal(gemmt.add(la, lb), a + b), name
        assert torch.equal(gemmt.square(la), a * a), name
        assert torch.equal(gemmt.scale(la, 2.0), a * 2.0), name
        assert torch.equal(gemmt.scale(la, -0.3), a * -0.3), name
        assert gemmt.add(la, lb).is_contiguous()


def test_mixed_layouts(device: str) -> None:
    a = randn(64, 48, device=device)
    b = randn(48, 64, device=device).t()
    assert torch.equal(gemmt.add(a, b), a + b)


@pytest.mark.parametrize("op", ["add", "square", "scale"])
def test_empty(device: str, op: str) -> None:
    x = torch.empty(0, 5, device=device)
    out = gemmt.add(x, x) if op == "add" else getattr(gemmt, op)(x)
    assert out.shape == (0, 5)


@pytest.mark.cuda
def test_cuda_empty_inputs_launch_no_kernel() -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.empty(0, 7, device="cuda")
    img = torch.empty(0, 4, 3, dtype=torch.uint8, device="cuda")
    vol = torch.empty(0, 5, dtype=torch.uint16, device="cuda")
    calls = [lambda: gemmt.add(x, x), lambda: gemmt.square(x), lambda: gemmt.scale(x, 2.0),
             lambda: gemmt.rgb_to_gray(img), lambda: gemmt.normalize_volume(vol, 7.0)]

    def kernels_of(fns) -> list[str]:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            outs = [fn() for fn in fns]
            torch.cuda.synchronize()
        del outs
        return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]

    kernels_of(calls)  # warm-up: first calls may load modules
    assert kernels_of(calls) == []
    # The same profiler does see gemmt's kernels when there is work.
    one = torch.ones(8, device="cuda")
    assert kernels_of([lambda: gemmt.add(one, one)])


def test_nan_inf_propagate(device: str) -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0], device=device)
    assert torch.equal(gemmt.add(x, x).isnan(), (x + x).isnan())
    assert torch.equal(gemmt.square(x).nan_to_num(), (x * x).nan_to_num())
    assert torch.equal(gemmt.scale(x, 0.0).isnan(), (x * 0.0).isnan())


def test_float64_on_cpu() -> None:
    x = torch.randn(100, dtype=torch.float64)
    assert torch.equal(gemmt.square(x), x * x)


@pytest.mark.parametrize("numel", [1, 7, 1000, 1 << 20])
def test_float64_matches_torch(device: str, numel: int) -> None:
    # Computed in double, each op rounds once: bit-equal to torch's float64 results, on the
    # vector path, the misaligned (storage offset 1) path and the strided path.
    base = torch.randn(2 * numel + 1, dtype=torch.float64, device=device)
    other = torch.randn(2 * numel + 1, dtype=torch.float64, device=device)
    for name, x, y in (("contiguous", base[:numel], other[:numel]),
                       ("misaligned", base[1:numel + 1], other[1:numel + 1]),
                       ("strided", base[::2][:numel], other[::2][:numel])):
        assert torch.equal(gemmt.add(x, y), x + y), name
        assert torch.equal(gemmt.square(x), x * x), name
        assert torch.equal(gemmt.scale(x, 0.1), x * 0.1), name
        assert torch.equal(torch.ops.gemmt.square_backward(y, x), y * (2 * x)), name
