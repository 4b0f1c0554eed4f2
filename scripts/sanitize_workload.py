"""A small workload for compute-sanitizer: every op and every GEMM variant on awkward
shapes, layouts and dtypes, with results checked so a silent corruption also fails.

Every input is made on the host and copied to the device: the sanitizer instruments only
gemmt's kernels, so memory written by other kernels (torch.randn on the GPU, say) would look
uninitialised to initcheck, while host-to-device copies are tracked."""

from __future__ import annotations

import sys

import torch

import gemmt

VARIANTS = ["naive", "smem_tiled", "register_blocked", "warptiled", "pipelined", "split_k",
            "mma_sync", "wgmma", "auto"]
# (64, 48, 2049): wgmma's narrow tile with split-k; (2056, 24, 40): m >= 2048, so the
# pipelined kernel copies a K-major B ("tt") N-major first.
SHAPES = [(1, 1, 1), (7, 9, 5), (33, 17, 65), (129, 257, 65), (64, 48, 2049), (2056, 24, 40)]


def cuda(t: torch.Tensor) -> torch.Tensor:
    """A device copy of a host tensor, with the same strides (views stay views)."""
    storage = t.untyped_storage()
    base = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.element_size(),))
    return base.to("cuda").as_strided(t.shape, t.stride(), t.storage_offset())


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def main() -> int:
    torch.manual_seed(0)
    bad = 0
    cases = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False),
             (torch.float16, False)]
    for dtype, tf32 in cases:
        # tf32 reaches the tensor-core paths in float32 (and wgmma's K-major staging pass).
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for variant in VARIANTS:
            for m, n, k in SHAPES:
                for lay in ("nn", "tt"):
                    a = torch.randn(m, k).to(dtype)
                    b = torch.randn(k, n).to(dtype)
                    if lay[0] == "t":
                        a = a.t().contiguous().t()
                    if lay[1] == "t":
                        b = b.t().contiguous().t()
                    a, b, c = cuda(a), cuda(b), cuda(torch.randn(m, n).to(dtype))
                    ref = 0.5 * (a.double() @ b.double()) + 0.25 * c.double()
                    try:
                        gemmt.gemm(c, a, b, 0.5, 0.25, variant=variant)
                    except RuntimeError as exc:
                        if "cannot run this problem" in str(exc):
                            continue
                        raise
                    err = rel(c, ref)
                    tol = 5e-3 if tf32 else 1e-5 if dtype == torch.float32 else 1e-2
                    if err > tol:
                        print(f"BAD {variant} {dtype} tf32={tf32} {m}x{n}x{k} {lay}: {err:.2e}")
                        bad += 1
    torch.backends.cuda.matmul.allow_tf32 = False
    for v in ((1, 777, 333), (555, 1, 129)):
        a, b = cuda(torch.randn(v[0], v[2])), cuda(torch.randn(v[2], v[1]))
        c = torch.empty(v[0], v[1], device="cuda")
        gemmt.gemm(c, a, b, variant="gemv")
        bad += rel(c, a.double() @ b.double()) > 1e-5
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 7, 4099, 100003):
            buf = cuda(torch.randn(n + 1).to(dtype))
            for x in (buf[1:], buf[:n]):
                bad += not torch.equal(gemmt.add(x, x), x + x)
                bad += not torch.equal(gemmt.square(x), x * x)
                bad += not torch.equal(gemmt.scale(x, 1.5), x * 1.5)
                g = cuda(torch.randn(x.shape).to(dtype))
                sb = torch.ops.gemmt.square_backward(g, x)
                bad += rel(sb.float(), (2 * x.double() * g.double())) > 1e-2
        x2 = cuda(torch.randn(64, 96).to(dtype)).t()
        bad += not torch.equal(gemmt.add(x2, x2), x2 + x2)
    for h, w in ((1, 1), (7, 13), (37, 129)):
        raw = cuda(torch.randint(0, 256, (h * w * 3 + 1,), dtype=torch.uint8))
        for img in (raw[1:].view(h, w, 3), raw[:-1].view(h, w, 3)):
            ref = gemmt.rgb_to_gray(img.cpu(), bgr=True)
            bad += not torch.equal(gemmt.rgb_to_gray(img, bgr=True).cpu(), ref)
        vol = cuda(torch.randint(0, 65536, (h * w + 1,), dtype=torch.int32).to(
            torch.uint16))[1:].view(h, w)
        bad += not torch.equal(gemmt.normalize_volume(vol, 4095.0), (vol.double() / 4095.0).float())
    torch.cuda.synchronize()
    print(f"sanitize workload finished, {bad} wrong results")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
