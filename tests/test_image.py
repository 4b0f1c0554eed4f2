"""rgb_to_gray and normalize_volume against exact references."""

from __future__ import annotations

import pytest
import torch

import gemmt
from conftest import divide_ref


def gray_reference(img: torch.Tensor, bgr: bool) -> torch.Tensor:
    """Exact: floor((299 R + 587 G + 114 B + 500) / 1000) in int64."""
    px = img.to(torch.int64)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]
    if bgr:
        r, b = b, r
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).to(torch.uint8)


# (300, 257, 3): more pixels than one chunk of the CPU loops' parallel split.
@pytest.mark.parametrize("shape", [(1, 1, 3), (7, 13, 3), (2, 64, 48, 3), (3, 2, 5, 17, 3),
                                   (300, 257, 3)])
@pytest.mark.parametrize("bgr", [False, True])
def test_rgb_to_gray_exact(device: str, shape, bgr: bool) -> None:
    img = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    out = gemmt.rgb_to_gray(img, bgr=bgr)
    assert out.dtype == torch.uint8 and out.shape == shape[:-1]
    assert torch.equal(out, gray_reference(img, bgr))
    # Same as the float formula except on exact halves (which the integer form rounds up).
    f = img.double()
    r, g, b = (f[..., 2], f[..., 1], f[..., 0]) if bgr else (f[..., 0], f[..., 1], f[..., 2])
    approx = 0.299 * r + 0.587 * g + 0.114 * b
    assert (out.double() - approx).abs().max().item() <= 0.5 + 1e-9


def test_rgb_to_gray_layouts(device: str) -> None:
    img = torch.randint(0, 256, (33, 47, 3), dtype=torch.uint8, device=device)
    ref = gray_reference(img, False)
    flat = torch.empty(img.numel() + 1, dtype=torch.uint8, device=device)
    flat[1:] = img.reshape(-1)
    assert torch.equal(gemmt.rgb_to_gray(flat[1:].view(img.shape)), ref)  # misaligned
    chw = img.permute(2, 0, 1).contiguous()  # planar storage, HWC view
    assert torch.equal(gemmt.rgb_to_gray(chw.permute(1, 2, 0)), ref)
    assert torch.equal(gemmt.rgb_to_gray(img[:, ::2]), ref[:, ::2])


def test_rgb_to_gray_bgr_is_channel_flip(device: str) -> None:
    img = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, device=device)
    assert torch.equal(gemmt.rgb_to_gray(img, bgr=True), gemmt.rgb_to_gray(img.flip(-1)))


def test_rgb_to_gray_empty(device: str) -> None:
    out = gemmt.rgb_to_gray(torch.empty(0, 4, 3, dtype=torch.uint8, device=device))
    assert out.shape == (0, 4)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint8])
@pytest.mark.parametrize("shape", [(1,), (5, 7), (16, 32, 33), (2, 3, 4, 5)])
def test_normalize_volume_exact(device: str, dtype: torch.dtype, shape) -> None:
    high = 65536 if dtype == torch.uint16 else 256
    vol = torch.randint(0, high, shape, dtype=torch.int32, device=device).to(dtype)
    for m in (4095.0, 65535.0, 1.0, 0.37):
        out = gemmt.normalize_volume(vol, m)
        assert out.dtype == torch.float32 and out.shape == vol.shape
        assert torch.equal(out, divide_ref(vol, m))


def test_normalize_volume_layouts(device: str) -> None:
    vol = torch.randint(0, 4096, (20, 30, 40), dtype=torch.int32, device=device).to(torch.uint16)
    ref = divide_ref(vol, 4095.0)
    assert torch.equal(gemmt.normalize_volume(vol.transpose(0, 2), 4095.0), ref.transpose(0, 2))
    flat = torch.empty(vol.numel() + 1, dtype=torch.uint16, device=device)
    flat[1:] = vol.reshape(-1)
    assert torch.equal(gemmt.normalize_volume(flat[1:].view(vol.shape), 4095.0), ref)
    assert gemmt.normalize_volume(vol[:0], 2.0).shape == (0, 30, 40)
