"""A small workload for compute-sanitizer: every op and every GEMM variant on awkward
shapes, layouts and dtypes, with results checked so a silent corruption also fails.

Every input is made on the host and copied to the device: the sanitizer instruments only
gemmt's kernels, so memory written by other kernels (torch.randn on the GPU, say) would look
uninitialised to initcheck, while host-to-device copies are tracked."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import gemmt

VARIANTS = ["naive", "smem_tiled", "register_blocked", "warp_tiled", "pipelined", "split_k",
            "mma_sync", "wgmma", "auto"]
# (64, 48, 2049): wgmma's narrow tile with split-k; (2056, 24, 40): m >= 2048, so the
# pipelined kernel copies a K-major B ("tt") N-major first. (96, 136, 72): 16-byte aligned
# rows, so tf32 reads A through registers in place ("tt") and runs "nn" as C^T = B^T A^T.
SHAPES = [(1, 1, 1), (7, 9, 5), (33, 17, 65), (129, 257, 65), (64, 48, 2049), (2056, 24, 40),
          (96, 136, 72)]


ACTIVATIONS = {"none": lambda z: z, "relu": torch.relu, "gelu": F.gelu,
               "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu}
# (2048, 4096, 256): wide tiles, the epilogue in the fill (even n, aligned bias); (2048, 1030,
# 256): the same with an edge round through the post pass; (2048, 1029, 256): an odd n, the
# post pass throughout; (100, 4096, 8192): one row of narrow tiles in two k-slices, the
# reduction applying the epilogue.
LINEAR_SHAPES = [((2048, 4096, 256), tuple(ACTIVATIONS)), ((2048, 1030, 256), ("gelu_tanh",)),
                 ((2048, 1029, 256), ("silu",)), ((100, 4096, 8192), ("gelu_tanh",)),
                 ((512, 5000, 1000), ("gelu_tanh", "relu", "silu"))]


def cuda(t: torch.Tensor) -> torch.Tensor:
    """A device copy of a host tensor, with the same strides (views stay views)."""
    storage = t.untyped_storage()
    base = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.element_size(),))
    return base.to("cuda").as_strided(t.shape, t.stride(), t.storage_offset())


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of `out` (any device) against a host float64 reference."""
    out = out.cpu().double()
    return ((out - ref).norm() / max(ref.norm().item(), 1e-30)).item()


# Every check runs on the host: gemmt's outputs are copied back and compared with references
# computed from host copies of the inputs. Only gemmt's kernels are instrumented, so initcheck
# cannot see what PyTorch's own kernels write; reading a PyTorch result on the device (a
# reduction behind .item(), say) would be reported as a read of uninitialised memory.


def main() -> int:
    torch.manual_seed(0)
    bad = 0
    cases = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False),
             (torch.float16, False)]
    for dtype, tf32 in cases:
        # tf32 reaches the tensor-core paths in float32 (and wgmma's register-sourced form).
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for variant in VARIANTS:
            for m, n, k in SHAPES:
                for lay in ("nn", "tt"):
                    ha = torch.randn(m, k).to(dtype)
                    hb = torch.randn(k, n).to(dtype)
                    if lay[0] == "t":
                        ha = ha.t().contiguous().t()
                    if lay[1] == "t":
                        hb = hb.t().contiguous().t()
                    hc = torch.randn(m, n).to(dtype)
                    a, b, c = cuda(ha), cuda(hb), cuda(hc)
                    ref = 0.5 * (ha.double() @ hb.double()) + 0.25 * hc.double()
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
    # Whole-tile float32 problems run the pipelined kernel's interior instances: one k-tile
    # (fewer than the pipeline's stages) and five, A row-major and column-major. On an H100
    # 1024^3 runs as stream-k (each of 128 tiles shared by ~3 blocks through the workspace).
    for m, n, k in ((2048, 2048, 16), (2048, 2048, 80), (1024, 1024, 1024)):
        for a_t in (False, True):
            ha, hb, hc = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
            if a_t:
                ha = ha.t().contiguous().t()
            c = cuda(hc)
            gemmt.gemm(c, cuda(ha), cuda(hb), 0.5, 0.25)
            err = rel(c, 0.5 * (ha.double() @ hb.double()) + 0.25 * hc.double())
            if err > 1e-5:
                print(f"BAD interior {m}x{n}x{k} a_t={a_t}: {err:.2e}")
                bad += 1
    for v in ((1, 777, 333), (555, 1, 129)):
        ha, hb = torch.randn(v[0], v[2]), torch.randn(v[2], v[1])
        c = torch.empty(v[0], v[1], device="cuda")
        gemmt.gemm(c, cuda(ha), cuda(hb), variant="gemv")
        bad += rel(c, ha.double() @ hb.double()) > 1e-5
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 7, 4099, 100003):
            hbuf = torch.randn(n + 1).to(dtype)
            buf = cuda(hbuf)
            for x, hx in ((buf[1:], hbuf[1:]), (buf[:n], hbuf[:n])):
                bad += not torch.equal(gemmt.add(x, x).cpu(), hx + hx)
                bad += not torch.equal(gemmt.square(x).cpu(), hx * hx)
                bad += not torch.equal(gemmt.scale(x, 1.5).cpu(), hx * 1.5)
                hg = torch.randn(hx.shape).to(dtype)
                sb = torch.ops.gemmt.square_backward(cuda(hg), x)
                bad += rel(sb, 2 * hx.double() * hg.double()) > 1e-2
        hx2 = torch.randn(64, 96).to(dtype).t()
        x2 = cuda(hx2)
        bad += not torch.equal(gemmt.add(x2, x2).cpu(), hx2 + hx2)
    for h, w in ((1, 1), (7, 13), (37, 129)):
        hraw = torch.randint(0, 256, (h * w * 3 + 1,), dtype=torch.uint8)
        raw = cuda(hraw)
        for img, himg in ((raw[1:].view(h, w, 3), hraw[1:].view(h, w, 3)),
                          (raw[:-1].view(h, w, 3), hraw[:-1].view(h, w, 3))):
            ref = gemmt.rgb_to_gray(himg, bgr=True)
            bad += not torch.equal(gemmt.rgb_to_gray(img, bgr=True).cpu(), ref)
        hvol = torch.randint(0, 65536, (h * w + 1,), dtype=torch.int32).to(torch.uint16)
        vol = cuda(hvol)[1:].view(h, w)
        ref = (hvol[1:].view(h, w).double() / 4095.0).float()
        bad += not torch.equal(gemmt.normalize_volume(vol, 4095.0).cpu(), ref)
    bad += linear_workload()
    torch.cuda.synchronize()
    print(f"sanitize workload finished, {bad} wrong results")
    return 1 if bad else 0


def linear_workload() -> int:
    """The Linear op's fused forward (with and without the pre-activation output) and its
    backward's activation pass, in bf16 and fp16; returns the number of wrong results."""
    bad = 0
    for dtype in (torch.bfloat16, torch.float16):
        for (m, n, k), acts in LINEAR_SHAPES:
            hx, hw, hb = (torch.randn(*s).to(dtype) for s in ((m, k), (n, k), (n,)))
            x, w, b = cuda(hx), cuda(hw), cuda(hb)
            pre = hx.double() @ hw.double().t() + hb.double()
            for act in acts:
                err = rel(gemmt.linear(x, w, b, act), ACTIVATIONS[act](pre))
                if err > 1e-2:
                    print(f"BAD linear {dtype} {m}x{n}x{k} {act}: {err:.2e}")
                    bad += 1
            y, saved = torch.ops.gemmt.linear_with_preact(x, w, b, acts[0])
            err = max(rel(y, ACTIVATIONS[acts[0]](pre)), rel(saved, pre))
            if err > 1e-2:
                print(f"BAD linear_with_preact {dtype} {m}x{n}x{k} {acts[0]}: {err:.2e}")
                bad += 1
        hg, hz = torch.randn(2048, 1030).to(dtype), torch.randn(2048, 1030).to(dtype)
        for act in ("gelu_tanh", "silu"):
            z = hz.double().requires_grad_()
            ACTIVATIONS[act](z).backward(hg.double())
            gp, gb = torch.ops.gemmt.linear_activation_backward(cuda(hg), cuda(hz), act, True)
            err = max(rel(gp, z.grad), rel(gb, z.grad.sum(0)))
            if err > 1e-2:
                print(f"BAD linear_activation_backward {dtype} {act}: {err:.2e}")
                bad += 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
