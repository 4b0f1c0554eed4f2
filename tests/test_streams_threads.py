"""Streams, CUDA graphs, threads and determinism: the ops must be safe to use in a real
training job (current stream, no hidden syncs, graph capture, no shared mutable state)."""

from __future__ import annotations

import threading

import pytest
import torch

import gemmt
from conftest import randn, rel_err

pytestmark = pytest.mark.cuda


def all_ops(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, img: torch.Tensor,
            vol: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    gemmt.gemm(c, a, b, 1.0, 0.0)
    return [c, gemmt.mm(a, b), gemmt.add(x, x), gemmt.square(x), gemmt.scale(x, 3.0),
            gemmt.rgb_to_gray(img), gemmt.normalize_volume(vol, 4095.0)]


def inputs(device: str = "cuda") -> tuple[torch.Tensor, ...]:
    a, b = randn(256, 128, device=device), randn(128, 192, device=device)
    x = randn(1 << 20, device=device)
    img = torch.randint(0, 256, (64, 64, 3), dtype=torch.uint8, device=device)
    vol = torch.randint(0, 4096, (16, 64, 64), dtype=torch.int32, device=device).to(torch.uint16)
    c = torch.empty(256, 192, device=device)
    return a, b, x, img, vol, c


def references(a, b, x, img, vol, c) -> list[torch.Tensor]:
    cpu = [t.cpu() for t in (a, b, x, img, vol, c)]
    return [r.cpu() for r in all_ops(*cpu)]


def check(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> None:
    for out, ref in zip(outs, refs):
        if out.is_floating_point():
            assert rel_err(out, ref) <= 1e-5
        else:
            assert torch.equal(out.cpu(), ref)


def test_side_stream_no_implicit_sync() -> None:
    args = inputs()
    refs = references(*args)
    # First calls initialise lazily (kernel attributes, occupancy queries), which can take
    # longer than the sleep below; the property under test is the steady state.
    all_ops(*args)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps `side` busy for a while
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside the ops raises
        try:
            outs = all_ops(*args)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # The work queued behind the sleep on `side`; the default stream was not made to wait.
    assert not side.query()
    assert torch.cuda.default_stream().query()
    side.synchronize()
    check(outs, refs)


def test_cuda_graph_capture_and_replay() -> None:
    args = inputs()
    a, b, x, img, vol, c = args
    all_ops(*args)  # warm-up outside capture (lazy initialisation)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = all_ops(*args)
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        x.copy_(torch.randn_like(x))
        img.copy_(torch.randint_like(img, 0, 256))
        graph.replay()
        torch.cuda.synchronize()
        check(outs, references(*args))


def test_cuda_graph_split_k_and_gemv() -> None:
    a, b = randn(128, 32768, device="cuda"), randn(32768, 128, device="cuda")
    v = randn(1, 4096, device="cuda")
    w = randn(4096, 4096, device="cuda")
    gemmt.mm(a, b), gemmt.mm(v, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_split, out_gemv = gemmt.mm(a, b), gemmt.mm(v, w)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out_split, a.double() @ b.double()) <= 1e-5
    assert rel_err(out_gemv, v.double() @ w.double()) <= 1e-5


def test_threads_on_their_own_streams() -> None:
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(10):
                    a = torch.randn(96, 80, generator=gen).cuda(non_blocking=False)
                    b = torch.randn(80, 72, generator=gen).cuda()
                    out = gemmt.mm(a, b)
                    y = gemmt.scale(gemmt.add(a, a), 0.5)
                    stream.synchronize()
                    assert rel_err(out, a.double() @ b.double()) <= 1e-5
                    assert torch.equal(y, a)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("variant", ["auto", "pipelined", "split_k", "warp_tiled", "mma_sync",
                                     "wgmma"])
def test_deterministic_gemm(variant: str) -> None:
    if variant in ("mma_sync", "wgmma"):
        a, b = randn(512, 3000, dtype=torch.bfloat16, device="cuda"), randn(
            3000, 384, dtype=torch.bfloat16, device="cuda")
    else:
        a, b = randn(300, 9000, device="cuda"), randn(9000, 200, device="cuda")
    c1 = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="cuda")
    c2 = torch.empty_like(c1)
    try:
        gemmt.gemm(c1, a, b, variant=variant)
    except RuntimeError as exc:
        pytest.skip(str(exc).splitlines()[0])
    gemmt.gemm(c2, a, b, variant=variant)
    assert torch.equal(c1, c2)


def test_deterministic_elementwise() -> None:
    args = inputs()
    first = all_ops(*args)
    first = [t.clone() for t in first]
    second = all_ops(*args)
    for f, s in zip(first, second):
        assert torch.equal(f, s)


def test_deterministic_algorithms_mode() -> None:
    torch.use_deterministic_algorithms(True)
    try:
        a, b = randn(256, 65536, device="cuda"), randn(65536, 256, device="cuda")
        assert torch.equal(gemmt.mm(a, b), gemmt.mm(a, b))
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device() -> None:
    with torch.cuda.device(0):
        args = inputs("cuda:1")
        outs = all_ops(*args)
        assert all(o.device == torch.device("cuda:1") for o in outs)
        check(outs, references(*args))


def _tensor_core_work(device: str, dtype: torch.dtype) -> list[tuple[str, torch.Tensor,
                                                                       torch.Tensor]]:
    """Products that take every per-device path of the 16-bit GEMMs, as (name, result,
    float64 reference): wide tiles with stream-k (workspace and flags), a 512-token product
    (medium tiles), a decode product, and a Linear layer with bias and activation, forward
    and backward."""
    gen = torch.Generator(device=device).manual_seed(7)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

    work = []
    for m, n, k in ((1024, 11008, 4096), (512, 4096, 2048), (8, 4096, 4096)):
        a, b = rnd(m, k), rnd(n, k, scale=k**-0.5)
        work.append((f"mm {m}x{n}x{k}", gemmt.mm(a, b.t()), a.double() @ b.double().t()))
    x = rnd(4, 128, 1024).requires_grad_()
    w = rnd(2048, 1024, scale=1024**-0.5).requires_grad_()
    bias = rnd(2048).requires_grad_()
    y = gemmt.linear(x, w, bias, "gelu_tanh")
    g = rnd(4, 128, 2048)
    y.backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    y64 = torch.nn.functional.gelu(x64 @ w64.t() + b64, approximate="tanh")
    y64.backward(g.double())
    work += [("linear forward", y, y64), ("linear grad x", x.grad, x64.grad),
             ("linear grad weight", w.grad, w64.grad), ("linear grad bias", bias.grad, b64.grad)]
    return work


def _check_tensor_core_work(device: str, dtype: torch.dtype) -> list[str]:
    failures = []
    for name, out, ref in _tensor_core_work(device, dtype):
        if out.device != torch.device(device):
            failures.append(f"{name} on {device}: result on {out.device}")
        elif not rel_err(out, ref.to(out.device)) < 1e-2:
            failures.append(f"{name} on {device}: rel err {rel_err(out, ref)}")
    return failures


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_second_device_tensor_cores(dtype: torch.dtype) -> None:
    """The 16-bit paths keep per-device state (tensor maps encoded in the device's context,
    occupancy answers, stream-k workspaces): each device's tensors must be served with its
    own, whichever device is current and whichever ran first, also from two threads at once."""
    failures = []
    for device, current in (("cuda:1", 0), ("cuda:0", 0), ("cuda:1", 1), ("cuda:0", 1)):
        with torch.cuda.device(current):
            failures += _check_tensor_core_work(device, dtype)
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")

    def on(device: str) -> None:
        try:
            with torch.cuda.device(device):
                failures.extend(_check_tensor_core_work(device, dtype))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"thread on {device}: {exc!r}")

    threads = [threading.Thread(target=on, args=(d,)) for d in ("cuda:0", "cuda:1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n".join(failures)


needs_carveout = pytest.mark.skipif(not hasattr(torch._C, "_set_sm_carveout_experimental"),
                                    reason="this torch has no SM carve-out setting")


@needs_carveout
@pytest.mark.parametrize("carveout", [0, 8, 66, 131])
def test_sm_carveout(carveout: int) -> None:
    """torch's SM carve-out (which cuBLASLt honours too) leaves SMs to kernels that run beside
    a GEMM, such as NCCL's: gemmt's persistent grids (stream-k with its workspace, CTA pairs,
    the decode split, the Linear backward pass) are sized for the SMs left, and every path
    still computes the right product, down to a single SM."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    carveout = min(carveout, sms - 1)
    before = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(carveout)
    try:
        failures = []
        for dtype in (torch.bfloat16, torch.float16):
            failures += _check_tensor_core_work("cuda:0", dtype)
        a, b = randn(1024, 4096, device="cuda"), randn(4096, 2048, device="cuda")
        err = rel_err(gemmt.mm(a, b), a.double() @ b.double())
        if not err < 1e-4:
            failures.append(f"fp32 mm: rel err {err}")
        torch.cuda.synchronize()
    finally:
        torch._C._set_sm_carveout_experimental(before)
    assert not failures, "\n".join(failures)


@needs_carveout
def test_sm_carveout_of_every_sm_is_refused() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = randn(256, 256, device="cuda").bfloat16()
    before = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms)
    try:
        with pytest.raises(RuntimeError, match=r"gemmt::mm: torch's SM carve-out .* got "
                                               rf"{sms}"):
            gemmt.mm(a, a)
    finally:
        torch._C._set_sm_carveout_experimental(before)


# A thread whose first CUDA work is a tensor-core product: the Hopper path encodes its TMA
# descriptors through the driver, which needs a context current on the calling thread. Run
# in a fresh interpreter so that no earlier test has already bound one to the threads in it
# (the autograd engine's worker is created once per process).
_NEW_THREAD_SCRIPT = r"""
import sys, threading, torch, gemmt
dtype = getattr(torch, sys.argv[1])
dev = "cuda"
a = torch.randn(2048, 4096, device=dev).to(dtype)
b = torch.randn(4096, 4096, device=dev).to(dtype)
ref = (a.double() @ b.double())
failures = []

def check(name, out):
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        failures.append(f"{name}: rel err {err}")

def in_thread(name, fn):
    def run():
        try:
            check(name, fn())
        except Exception as exc:
            failures.append(f"{name}: {exc}")
    t = threading.Thread(target=run)
    t.start()
    t.join()

def gemm_into():
    c = torch.empty(2048, 4096, device=dev, dtype=dtype)
    gemmt.gemm(c, a, b)
    return c

in_thread("first thread mm", lambda: gemmt.mm(a, b))
check("main thread mm", gemmt.mm(a, b))
in_thread("later thread mm", lambda: gemmt.mm(a, b))
in_thread("later thread gemm", gemm_into)
in_thread("later thread torch.ops", lambda: torch.ops.gemmt.mm(a, b))
torch.cuda.synchronize()

# A training step whose backward runs on the autograd engine's own thread.
x = torch.randn(2048, 4096, device=dev).to(dtype).requires_grad_()
w = torch.randn(11008, 4096, device=dev).to(dtype).div_(64).requires_grad_()
c = torch.empty(2048, 11008, device=dev, dtype=dtype)
gemmt.gemm(c, x.detach(), w.detach().t())
g = torch.randn(2048, 11008, device=dev).to(dtype)
try:
    gemmt.mm(x, w.t()).backward(g)
    gx_ref = g.double() @ w.detach().double()
    gw_ref = g.double().t() @ x.detach().double()
    for name, got, want in (("grad x", x.grad, gx_ref), ("grad w", w.grad, gw_ref)):
        err = ((got.double() - want).norm() / want.norm()).item()
        if not err < 1e-2:
            failures.append(f"backward {name}: rel err {err}")
except Exception as exc:
    failures.append(f"backward: {exc}")
print("\n".join(failures) if failures else "ok")
sys.exit(1 if failures else 0)
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tensor_core_gemm_from_new_threads_and_autograd(dtype: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _NEW_THREAD_SCRIPT, dtype],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Kernels that follow one another in a stream are launched programmatically on Hopper (their
# blocks placed while the previous kernel finishes; gemmt/launch.cuh) unless GEMMT_PDL=0. A
# chain whose every step reads the previous step's output at once, or overwrites a buffer the
# previous step read, must come out the same either way, eagerly and replayed from a graph.
_CHAIN_SCRIPT = r"""
import sys, torch, gemmt
import torch.nn.functional as F
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
r = lambda *s: torch.randn(*s, device=dev).to(dt)
x = r(512, 4096)
w1, b1 = r(11008, 4096).div_(64), r(11008)
w2 = r(4096, 11008).div_(105)
w3 = r(4096, 4096).div_(64)
g = r(512, 4096)
buf = torch.empty(512, 4096, device=dev, dtype=dt)

def chain():
    h = gemmt.linear(x, w1, b1, "silu")            # wide tiles with the fused epilogue
    y = gemmt.mm(h, w2.t())                          # reads h at once (long k)
    gemmt.gemm(buf, y, w3)                           # reads y at once
    t = gemmt.linear(buf[:8], w3)                    # decode kernel, reads buf at once
    xg = x.detach().requires_grad_()
    wg = w1.detach().requires_grad_()
    out = gemmt.linear(xg, wg, b1, "gelu_tanh")      # backward: act pass, sums, two products
    gx, gw = torch.autograd.grad(out, (xg, wg), torch.cat([g, g, g[:, :2816]], 1))
    gemmt.gemm(y, buf, w3)                           # overwrites y, which an earlier step read
    return [h, buf, t, gx, gw, y]

eager = chain()
torch.cuda.synchronize()
refs = []
xd, w1d, b1d, w2d, w3d, gd = (t.double() for t in (x, w1, b1, w2, w3, g))
h = F.silu(xd @ w1d.t() + b1d); y1 = h @ w2d.t(); b = y1 @ w3d
z = xd @ w1d.t() + b1d; gz = torch.cat([gd, gd, gd[:, :2816]], 1)
zz = z.detach().requires_grad_()
dz, = torch.autograd.grad(F.gelu(zz, approximate="tanh"), zz, gz)
refs = [h, b, b[:8] @ w3d.t(), dz @ w1d, dz.t() @ xd, b @ w3d]
fails = []
for i, (o, ref) in enumerate(zip(eager, refs)):
    err = ((o.double() - ref).norm() / ref.norm()).item()
    if not err < 2e-2:
        fails.append(f"step {i}: rel err {err}")
# The same chain captured once and replayed over poisoned outputs.
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    chain()
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    outs = chain()
for o in outs:
    o.fill_(float("nan"))
graph.replay()
torch.cuda.synchronize()
for i, (o, e) in enumerate(zip(outs, eager)):
    if not torch.equal(o, e):
        fails.append(f"step {i}: graph replay differs from the eager run")
torch.save([t.cpu() for t in eager], sys.argv[1])
print("\n".join(fails) if fails else "ok")
sys.exit(1 if fails else 0)
"""


def test_programmatic_launch_chain(tmp_path) -> None:
    import os
    import subprocess
    import sys

    results = {}
    for pdl in ("1", "0"):
        path = tmp_path / f"chain_pdl{pdl}.pt"
        env = dict(os.environ, GEMMT_PDL=pdl)
        proc = subprocess.run([sys.executable, "-c", _CHAIN_SCRIPT, str(path)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"GEMMT_PDL={pdl}: " + proc.stdout + proc.stderr
        results[pdl] = torch.load(path)
    for i, (on, off) in enumerate(zip(results["1"], results["0"])):
        assert torch.equal(on, off), f"step {i}: programmatic launch changed the result"
