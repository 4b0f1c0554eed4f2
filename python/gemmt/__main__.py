"""``python -m gemmt``: the main job, and the benchmark entry points.

    python -m gemmt                 run every op on the best device, compare with PyTorch
    python -m gemmt info            print build_info() as JSON
    python -m gemmt bench gemm      GEMM ladder and tensor-core benchmark (JSON + PNG)
    python -m gemmt bench gemm_fp64 float64 cases of the GEMM benchmark only (vs cuBLAS DGEMM)
    python -m gemmt bench memory    memory-bound ops against the copy bandwidth
    python -m gemmt bench linear    Linear layers (training products, decode, fused
                                    epilogues, a whole model) against PyTorch
    python -m gemmt bench mm        mm / gemm under autograd (every operand layout) and
                                    single held-out products against PyTorch
    python -m gemmt bench tune      the GEMM tuner: tuned vs untuned vs cuBLAS on decode
                                    and prefill Linear products, and what tuning costs
    python -m gemmt bench fp8       scaled_mm vs torch._scaled_mm per scaling mode, the
                                    quantisation ops, FP8 decode, an FP8 training step and
                                    a Llama-shaped model converted to FP8 vs bf16 torch
    python -m gemmt bench moe       grouped_mm vs torch._grouped_mm and a loop of mm, with
                                    the roofline; the MoE layer; transformers MoE models
    python -m gemmt bench fp8_quant the FP8 quantisation kernels (every granularity, with
                                    and without the transpose) against the copy bandwidth
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Union

import torch
import torch.nn.functional as F

import gemmt
from gemmt._timing import paired_median_ms

# An op's result: one tensor, or several (a backward's gradients).
Result = Union[torch.Tensor, tuple[torch.Tensor, ...]]


def _parts(t: Result) -> tuple[torch.Tensor, ...]:
    return t if isinstance(t, tuple) else (t,)


def _rel_err(out: Result, ref: Result) -> float:
    """The largest relative Frobenius error over the result's tensors."""
    worst = 0.0
    for o, r in zip(_parts(out), _parts(ref)):
        out64, ref64 = o.double(), r.double()
        denom = ref64.norm().item()
        worst = max(worst, (out64 - ref64).norm().item() / (denom if denom > 0 else 1.0))
    return worst


def _max_abs(out: Result, ref: Result) -> float:
    return max(((o.double() - r.double()).abs().max().item() if o.numel() else 0.0)
               for o, r in zip(_parts(out), _parts(ref)))


def _same_shapes(out: Result, ref: Result) -> bool:
    return len(_parts(out)) == len(_parts(ref)) and all(
        o.shape == r.shape for o, r in zip(_parts(out), _parts(ref)))


def _cases(dev: str) -> list[tuple[str, Callable[[], Result], Callable[[], Result], Result, float]]:
    """(name, ours, torch equivalent, float64 reference, error bound) for every op."""
    big = dev == "cuda"
    n = 4096 if big else 384
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    ah, bh = a.to(torch.bfloat16), b.to(torch.bfloat16)
    c = torch.empty(n, n, device=dev)
    x = torch.randn(1 << (26 if big else 20), device=dev)
    y = torch.randn_like(x)
    img = torch.randint(0, 256, (2160 if big else 270, 3840 if big else 480, 3), dtype=torch.uint8,
                        device=dev)
    vol = torch.randint(0, 4096, (256 if big else 32, 256, 256), dtype=torch.int32,
                        device=dev).to(torch.uint16)
    f = img.double()
    gray_ref = torch.floor(0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2] + 0.5)

    # A Llama-style MLP projection: bf16 activations (prefill and decode sized) through a
    # 4096 -> 11008 layer with a bias and the tanh GELU fused into the GEMM's epilogue.
    tokens, d_in, d_out = (2048, 4096, 11008) if big else (64, 256, 704)
    xl = torch.randn(tokens, d_in, device=dev).to(torch.bfloat16)
    wl = (torch.randn(d_out, d_in, device=dev) / d_in ** 0.5).to(torch.bfloat16)
    bl = torch.randn(d_out, device=dev).to(torch.bfloat16)
    xd = xl[:16]

    def linear_ref(xs: torch.Tensor) -> torch.Tensor:
        return F.gelu(xs.double() @ wl.double().t() + bl.double(), approximate="tanh")

    def ours_gemm() -> torch.Tensor:
        gemmt.gemm(c, a, b)
        return c

    # The backward pieces, on their own: a bf16 MLP activation's gradient (with the bias's
    # column sums) and swiglu's, against the ATen calls torch's autograd makes for them. On
    # the CPU, over 512 tokens: at 64, a call from Python through torch.ops costs more than
    # the column sums themselves.
    ops = torch.ops.gemmt
    zl = F.linear(xl if big else torch.randn(512, d_in).to(torch.bfloat16), wl, bl)
    gl = torch.randn_like(zl)
    xb, yb = x.to(torch.bfloat16), y.to(torch.bfloat16)
    gb = torch.randn_like(xb)

    def silu64(t: torch.Tensor) -> torch.Tensor:
        return F.silu(t.double())

    def act_backward_ref() -> tuple[torch.Tensor, torch.Tensor]:
        z = zl.double().requires_grad_()
        gz, = torch.autograd.grad(F.gelu(z, approximate="tanh"), z, gl.double())
        return gz, gz.sum(0)

    def act_backward_torch() -> tuple[torch.Tensor, torch.Tensor]:
        gz = torch.ops.aten.gelu_backward(gl, zl, approximate="tanh")
        return gz, gz.sum(0)

    def swiglu_backward_ref() -> tuple[torch.Tensor, torch.Tensor]:
        g, u = gb.double(), yb.double()
        z = xb.double()
        s = torch.sigmoid(z)
        return g * u * s * (1 + z * (1 - s)), g * z * s

    def swiglu_backward_torch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.aten.silu_backward(gb * yb, xb), gb * F.silu(xb)

    torch.backends.cuda.matmul.allow_tf32 = False
    return [
        ("gemm fp32", ours_gemm, lambda: torch.matmul(a, b), a.double() @ b.double(), 1e-5),
        ("mm bf16", lambda: gemmt.mm(ah, bh), lambda: torch.matmul(ah, bh),
         ah.double() @ bh.double(), 1e-2),
        ("linear bf16 gelu", lambda: gemmt.linear(xl, wl, bl, activation="gelu_tanh"),
         lambda: F.gelu(F.linear(xl, wl, bl), approximate="tanh"), linear_ref(xl), 1e-2),
        ("linear bf16 decode", lambda: gemmt.linear(xd, wl, bl, activation="gelu_tanh"),
         lambda: F.gelu(F.linear(xd, wl, bl), approximate="tanh"), linear_ref(xd), 1e-2),
        ("add fp32", lambda: gemmt.add(x, y), lambda: torch.add(x, y), x.double() + y.double(),
         1e-7),
        ("square fp32", lambda: gemmt.square(x), lambda: torch.square(x), x.double() ** 2, 1e-7),
        ("scale fp32", lambda: gemmt.scale(x, 2.0), lambda: x * 2.0, x.double() * 2.0, 1e-7),
        ("rgb_to_gray u8", lambda: gemmt.rgb_to_gray(img),
         lambda: (0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]).round().to(
             torch.uint8), gray_ref, 1e-2),
        ("normalize_volume u16", lambda: gemmt.normalize_volume(vol, 4095.0),
         lambda: vol.float() / 4095.0, vol.double() / 4095.0, 1e-7),
        ("square_backward fp32", lambda: ops.square_backward(y, x), lambda: y * (2 * x),
         y.double() * 2 * x.double(), 1e-7),
        ("swiglu fp32", lambda: gemmt.swiglu(x, y), lambda: F.silu(x) * y,
         silu64(x) * y.double(), 1e-6),
        ("swiglu bf16", lambda: gemmt.swiglu(xb, yb), lambda: F.silu(xb) * yb,
         silu64(xb) * yb.double(), 1e-2),
        ("swiglu_backward bf16", lambda: ops.swiglu_backward(gb, xb, yb), swiglu_backward_torch,
         swiglu_backward_ref(), 1e-2),
        ("linear_act_bwd bf16", lambda: ops.linear_activation_backward(gl, zl, "gelu_tanh", True),
         act_backward_torch, act_backward_ref(), 1e-2),
        ("linear_bias_bwd bf16", lambda: ops.linear_bias_backward(gl), lambda: gl.sum(0),
         gl.double().sum(0), 1e-2),
    ]


def _torch_scaled_grouped(aq: torch.Tensor, bq: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                          offs: torch.Tensor) -> torch.Tensor:
    """torch's row-scaled FP8 grouped product, bf16 out: ``torch._scaled_grouped_mm`` on CUDA,
    elsewhere (torch has no grouped FP8 product there) a loop of ``torch._scaled_mm``."""
    if aq.is_cuda and hasattr(torch, "_scaled_grouped_mm"):
        return torch._scaled_grouped_mm(aq, bq, sa, sb, offs=offs, out_dtype=torch.bfloat16)
    out = torch.zeros(aq.shape[0], bq.shape[2], dtype=torch.bfloat16, device=aq.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = torch._scaled_mm(aq[start:end], bq[e], scale_a=sa[start:end, None],
                                              scale_b=sb[e][None, :], out_dtype=torch.bfloat16)
        start = end
    return out


def _fp8_moe_cases(dev: str
                   ) -> list[tuple[str, Callable[[], Result], Callable[[], Result], Result, float]]:
    """The FP8 and mixture-of-experts ops: rowwise quantisation, scaled_mm and the grouped
    products of 8 unevenly routed experts, against torch's own ops (on the CPU, where torch has
    no grouped FP8 product, a loop of torch._scaled_mm)."""
    big = dev == "cuda"
    tokens, d_in, d_out, experts = (2048, 4096, 4096, 8) if big else (128, 256, 256, 8)
    e4m3 = torch.float8_e4m3fn
    x = torch.randn(tokens, d_in, device=dev).to(torch.bfloat16)
    w = (torch.randn(d_out, d_in, device=dev) / d_in ** 0.5).to(torch.bfloat16)
    xq, xs = gemmt.quantize_fp8(x, "row")
    wq, ws = gemmt.quantize_fp8(w, "row")

    def quantize_torch() -> torch.Tensor:
        scale = x.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
        return (x.float() / scale).clamp(-448, 448).to(e4m3).float() * scale

    def dequant64(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return q.double() * s.double()

    def dequant32(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # As quantize_torch returns it: the demo compares what the quantisation keeps.
        return q.float() * s

    # Tokens routed unevenly to the experts, sorted by expert (one expert gets none).
    counts = [tokens // 4, 0, tokens // 8, tokens // 4, tokens // 16, tokens // 8,
              tokens // 16, tokens // 8]
    offs = torch.tensor(counts, device=dev).cumsum(0).to(torch.int32)
    starts = [0, *offs.tolist()[:-1]]
    ends = offs.tolist()
    we = (torch.randn(experts, d_out, d_in, device=dev) / d_in ** 0.5).to(torch.bfloat16)
    wt = we.transpose(1, 2)  # (experts, K, N), column-major: the layout torch's products take
    weq = torch.stack([gemmt.quantize_fp8(we[e], "row")[0] for e in range(experts)])
    wes = torch.stack([gemmt.quantize_fp8(we[e], "row")[1].reshape(-1) for e in range(experts)])
    xs1 = xs.reshape(-1)

    def grouped_ref(a: torch.Tensor, b: list[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros(tokens, d_out, dtype=torch.float64, device=dev)
        for e, (s0, s1) in enumerate(zip(starts, ends)):
            out[s0:s1] = a[s0:s1] @ b[e]
        return out

    def scaled_grouped_torch() -> torch.Tensor:
        return _torch_scaled_grouped(xq, weq.transpose(1, 2), xs1, wes, offs)

    return [
        ("quantize_fp8 row bf16", lambda: dequant32(*gemmt.quantize_fp8(x, "row")),
         quantize_torch, x.double(), 4e-2),
        ("scaled_mm e4m3 row", lambda: gemmt.scaled_mm(xq, wq.t(), xs, ws.t()),
         lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(),
                                  out_dtype=torch.bfloat16),
         dequant64(xq, xs) @ dequant64(wq, ws).t(), 1e-2),
        ("grouped_mm bf16", lambda: gemmt.grouped_mm(x, wt, offs),
         lambda: torch._grouped_mm(x, wt, offs), grouped_ref(x.double(), [
             wt[e].double() for e in range(experts)]), 1e-2),
        ("scaled_grouped_mm e4m3", lambda: gemmt.scaled_grouped_mm(
            xq, weq.transpose(1, 2), xs1, wes, offs), scaled_grouped_torch,
         grouped_ref(dequant64(xq, xs), [dequant64(weq[e], wes[e].reshape(-1, 1)).t()
                                          for e in range(experts)]), 1e-2),
    ]


def _moe_layer_cases(dev: str
                     ) -> list[tuple[str, Callable[[], Result], Callable[[], Result], Result, float]]:
    """The rest of a mixture-of-experts layer: the routing (softmax top-k, renormalised), the
    permutation into expert order and the fused experts (gate/up product, SwiGLU, down
    product, weighted combine), against the same steps in torch (its grouped product where
    it has one), with the rowwise FP8 quantisation that also writes the transpose."""
    big = dev == "cuda"
    tokens, hidden, inter, experts, top_k = ((4096, 2048, 1408, 16, 4) if big
                                             else (96, 64, 96, 8, 2))
    logits = torch.randn(tokens, experts, device=dev)
    x = torch.randn(tokens, hidden, device=dev).to(torch.bfloat16)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, device=dev) / hidden ** 0.5).to(
        torch.bfloat16)
    w_down = (torch.randn(experts, hidden, inter, device=dev) / inter ** 0.5).to(torch.bfloat16)
    route = gemmt.moe_route(logits, top_k)
    ids, order, offs = route.expert_ids, route.token_order, route.offsets
    weights = route.weights

    def route_torch(lg: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # What moe_route returns: weights, ids and the permutation into expert order.
        w, i = lg.softmax(-1).topk(top_k, -1)
        flat = i.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        offs = torch.bincount(flat, minlength=experts).cumsum(0).to(torch.int32)
        return w / w.sum(-1, keepdim=True), i, order, offs

    def route_ours() -> tuple[torch.Tensor, ...]:
        return tuple(gemmt.moe_route(logits, top_k))

    def permute_torch() -> tuple[torch.Tensor, torch.Tensor]:
        o = torch.sort(ids.reshape(-1), stable=True).indices
        return o, torch.bincount(ids.reshape(-1), minlength=experts).cumsum(0).to(torch.int32)

    def experts_torch() -> torch.Tensor:
        slot_token = order // top_k
        h = torch._grouped_mm(x[slot_token], w_gate_up.transpose(1, 2), offs)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y = torch._grouped_mm(a, w_down.transpose(1, 2), offs).float()
        y *= weights.reshape(-1)[order, None]
        return torch.zeros(tokens, hidden, device=dev).index_add_(0, slot_token, y).to(x.dtype)

    def experts_ref() -> torch.Tensor:
        out = torch.zeros(tokens, hidden, dtype=torch.float64, device=dev)
        x64 = x.double()
        for e in range(experts):
            tok, k = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                h = x64[tok] @ w_gate_up[e].double().t()
                a = F.silu(h[:, :inter]) * h[:, inter:]
                y = (a @ w_down[e].double().t()) * weights[tok, k, None].double()
                out.index_add_(0, tok, y)
        return out

    xq = x.float()

    def quant_t_torch() -> tuple[torch.Tensor, torch.Tensor]:
        def dq(t: torch.Tensor) -> torch.Tensor:
            s = t.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
            return (t / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
        return dq(xq), dq(xq.t())

    def quant_t_ours() -> tuple[torch.Tensor, torch.Tensor]:
        q, s, qt, st = gemmt.quantize_fp8_with_transpose(x, "row")
        return q.float() * s, qt.float() * st

    from gemmt.moe import quantize_experts

    gu_q, gu_s = quantize_experts(w_gate_up)
    dn_q, dn_s = quantize_experts(w_down)

    def experts_float8() -> torch.Tensor:
        return torch.ops.gemmt.moe_experts_float8(x, gu_q, gu_s, dn_q, dn_s, weights, ids, order,
                                                  offs)

    def experts_float8_torch() -> torch.Tensor:
        # The same layer in torch's ops: rows quantised, gathered, its FP8 grouped products.
        def quant_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            s = t.float().abs().amax(1).clamp_min(1e-12) / 448.0
            return (t.float() / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn), s

        slot_token = order // top_k
        xq, xs = quant_rows(x)
        h = _torch_scaled_grouped(xq[slot_token], gu_q.transpose(1, 2), xs[slot_token], gu_s, offs)
        aq, a_s = quant_rows(F.silu(h[:, :inter]) * h[:, inter:])
        o = _torch_scaled_grouped(aq, dn_q.transpose(1, 2), a_s, dn_s, offs).float()
        o *= weights.reshape(-1)[order, None]
        return torch.zeros(tokens, hidden, device=dev).index_add_(0, slot_token, o).to(x.dtype)

    ref_experts = experts_ref()
    return [
        ("quantize_fp8 row +T", quant_t_ours, quant_t_torch, (x.double(), x.double().t()), 4e-2),
        ("moe_route softmax", route_ours, lambda: route_torch(logits),
         route_torch(logits.double()), 1e-6),
        ("moe_permute", lambda: gemmt.moe_permute(ids, experts), permute_torch, permute_torch(),
         0.0),
        ("moe_experts bf16", lambda: gemmt.moe_experts(x, w_gate_up, w_down, weights, ids, order,
                                                       offs),
         experts_torch, ref_experts, 1e-2),
        # Against the bf16 layer's float64 reference: float8's own error (about 6%) is the bound.
        ("moe_experts_float8", experts_float8, experts_float8_torch, ref_experts, 1e-1),
    ]


def demo() -> int:
    """Runs every op on CUDA if present (else CPU) and compares it with PyTorch."""
    info = gemmt.build_info()
    dev = "cuda" if torch.cuda.is_available() and info.get("cuda") else "cpu"
    print("gemmt build:", json.dumps(info))
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    threads = "" if dev == "cuda" else f", {torch.get_num_threads()} threads for both"
    print(f"device: {dev} ({name}), torch {torch.__version__}{threads}")
    print("times: medians of calls alternating between gemmt and torch, after a warm-up\n")
    header = f"{'op':<24}{'device':<8}{'max abs err':>12}{'rel err':>11}{'bound':>9}{'gemmt ms':>11}{'torch ms':>11}{'speedup':>9}  ok"
    print(header)
    print("-" * len(header))
    failures = 0
    cases = _cases(dev) + _fp8_moe_cases(dev) + _moe_layer_cases(dev)
    for label, ours, theirs, ref, bound in cases:
        out = ours()
        err = _rel_err(out, ref)
        max_abs = _max_abs(out, ref)
        ok = err <= bound and _same_shapes(out, ref)
        failures += not ok
        t_ours, t_ref = paired_median_ms([ours, theirs], dev, reps=21, budget_s=2.0)
        print(f"{label:<24}{dev:<8}{max_abs:>12.2e}{err:>11.2e}{bound:>9.0e}{t_ours:>11.3f}{t_ref:>11.3f}"
              f"{t_ref / t_ours:>8.2f}x  {'yes' if ok else 'NO'}")
    print(f"\n{'all ops match PyTorch' if not failures else f'{failures} op(s) FAILED'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gemmt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="run every op and compare with PyTorch (the default)")
    sub.add_parser("info", help="print build_info() as JSON")
    sub.add_parser("prepare", help="compile now the kernels this build compiles on first use")
    bench = sub.add_parser("bench", help="benchmarks: JSON, table and PNG plot")
    bench.add_argument("suite", choices=["gemm", "gemm_fp64", "memory", "linear", "mm", "tune",
                                         "fp8", "moe", "fp8_quant", "all"])
    bench.add_argument("--out", default="benchmarks/results",
                       help="output directory (fp8_quant: also a .json file path)")
    bench.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    bench.add_argument("--smoke", action="store_true",
                       help="fp8 and moe suites: tiny sizes that check the code paths (on the "
                            "CPU when there is no GPU; the times mean nothing)")
    bench.add_argument("--device", choices=["cuda", "cpu"], default=None,
                       help="fp8 and moe suites: the device (default: the GPU when there is "
                            "one; the CPU runs --smoke only)")
    bench.add_argument("--sections", "--only", dest="sections", default=None,
                       help="linear suite: which sections to run (comma separated; default "
                            "prefill,fp32,decode,fused,model); tune suite: decode,prefill; "
                            "fp8 suite: gemm,quant,decode,train,model; "
                            "moe suite: grouped,scaled,scaled_block,layer,models")
    bench.add_argument("--fast-accum", action="store_true",
                       help="fp8 suite: the gemm and decode sections' products with the tensor "
                            "cores' own FP8 accumulation (use_fast_accum=True), both libraries")
    bench.add_argument("--tokens", default="512,2048,8192",
                       help="linear suite: token counts of the prefill section (comma separated)")
    args = parser.parse_args(argv)
    if args.cmd == "info":
        print(json.dumps(gemmt.build_info(), indent=2))
        return 0
    if args.cmd == "prepare":
        took = gemmt.prepare_kernels()
        for group, seconds in took.items():
            print(f"{group}: ready ({seconds:.1f} s)")
        if not took:
            print("this build compiles every kernel at install time")
        return 0
    if args.cmd == "bench" and args.suite in ("fp8", "moe"):
        from pathlib import Path

        if args.suite == "fp8":
            from gemmt import bench_fp8

            return bench_fp8.run(Path(args.out), quick=args.quick, smoke=args.smoke,
                                 sections=args.sections or ",".join(bench_fp8.SECTIONS),
                                 device=args.device, fast_accum=args.fast_accum)
        from gemmt import bench_moe

        return bench_moe.run(Path(args.out), quick=args.quick, smoke=args.smoke,
                             sections=args.sections or ",".join(bench_moe.SECTIONS),
                             device=args.device)
    if args.cmd == "bench" and args.suite == "fp8_quant":
        from gemmt import bench_fp8_quant

        return bench_fp8_quant.run(args.out, quick=args.quick)
    if args.cmd == "bench" and args.suite == "mm":
        from gemmt import bench_mm

        return bench_mm.run(args.out, quick=args.quick)
    if args.cmd == "bench":
        from gemmt import bench as bench_mod

        if args.suite == "tune":
            if not torch.cuda.is_available():
                print("the benchmarks need a CUDA device")
                return 1
            from pathlib import Path

            from gemmt import bench_tune

            return bench_tune.run(Path(args.out), quick=args.quick,
                                  sections=args.sections or ",".join(bench_tune.SECTIONS))
        return bench_mod.run(args.suite, args.out, quick=args.quick,
                             sections=args.sections or "prefill,fp32,decode,fused,model",
                             tokens=args.tokens)
    return demo()


if __name__ == "__main__":
    sys.exit(main())
