"""``python -m gemmt bench linear``: Linear layers against PyTorch (cuBLAS / cuBLASLt), in
the same run.

Sections (``--sections``, comma separated; all by default):

* ``prefill``: the products of a Llama-style layer's training step, bf16 and fp16, for
  (in, out) = (4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096), (8192, 28672),
  (28672, 8192), (4096, 32000), (4096, 128256) and 512 / 2048 / 8192 tokens (``--tokens``
  picks others, e.g. 1024 for the training step's products), in the three
  layouts: forward ``x @ W.T`` (gemmt.linear vs F.linear), grad_input ``g @ W`` and
  grad_weight ``g.T @ x`` (gemmt.mm vs torch.matmul).
* ``fp32``: the same shapes at 2048 tokens in float32 with TF32 off.
* ``decode``: ``x @ W.T`` in bf16 for 1..256 tokens on the same weights. Several copies of
  each weight (more bytes than twice the L2 cache) are used in turn, so every call streams
  its weight from HBM; reported against cuBLAS and against the device-to-device copy
  bandwidth measured in the same run.
* ``fused``: linear with bias and gelu_tanh or silu against eager ``F.linear`` + activation
  and against ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same function;
  forward (inference) and backward; bf16 on three shapes, fp16 on the first.
* ``model``: a Llama-shaped transformers model (hidden 4096, intermediate 11008, 4 layers,
  bf16, random weights) with its Linears replaced by gemmt.nn.Linear, against the same model
  with torch's: prefill (4 x 1024 tokens), decode (16 sequences, 1 token) and a training step
  (2 x 512 tokens), plus logits and gradients compared.

Times are medians of CUDA-event timings of CUDA-graph replays (each replay many calls, so
host overhead is excluded) after warm-up, alternating ours and the reference in rounds. The
fused backward (an autograd pass) is timed in alternating rounds of calls queued behind a
sleep kernel. The model's training step is timed in alternating rounds of single steps (host
included, as a training loop sees it), with the GPU's busy time per step from the profiler
beside it (``gpu_busy_ratio``).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import gemmt
# The whole-model timing lives in the shared kit (the fp8 suite's model section uses it too);
# the names stay importable from here.
from gemmt._bench_kit import Replay as _Replay
from gemmt._bench_kit import events_ms as _events_ms
from gemmt._bench_kit import gpu_busy_ms  # noqa: F401 - imported from here by experiments
from gemmt._bench_kit import paired_calls_ms, paired_ms, paired_steps_ms
from gemmt._report import environment, write as _write
from gemmt._report import progress as _progress
from gemmt._report import sections_of

LAYERS = [(4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096), (8192, 28672),
          (28672, 8192), (4096, 32000), (4096, 128256)]
TOKENS = [512, 2048, 8192]
DECODE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
L2_BYTES = 50 << 20
SECTIONS = ("prefill", "fp32", "decode", "fused", "model")


# ---- timing -------------------------------------------------------------------------------
def _queued_ms(fn: Callable[[], object], calls: int = 4) -> float:
    """GPU time of one call of ``fn`` that cannot be captured in a graph (an autograd pass).

    The calls are queued behind a sleep kernel of about a millisecond, so the host's launch
    work (the autograd engine's) runs ahead of the GPU and only the kernels are timed.
    """
    torch.cuda._sleep(2_000_000)
    return _events_ms(lambda: [fn() for _ in range(calls)]) / calls


def _repeats(est_ms: float, target_ms: float = 3.0, cap: int = 40) -> int:
    return max(1, min(cap, round(target_ms / max(est_ms, 1e-3))))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    d = ref.double()
    return ((out.double() - d).norm() / d.norm()).item()


# ---- prefill / fp32 -----------------------------------------------------------------------
def _layout_calls(case: str, tokens: int, fin: int, fout: int, dtype: torch.dtype):
    """(ours, reference, flops, output check) for one training product."""
    r = lambda *s: torch.randn(*s, device="cuda").to(dtype)  # noqa: E731
    if case == "fwd":
        x, w = r(tokens, fin), r(fout, fin) / math.sqrt(fin)
        return (lambda: gemmt.linear(x, w)), (lambda: F.linear(x, w)), 2.0 * tokens * fin * fout
    if case == "dgrad":
        g, w = r(tokens, fout), r(fout, fin)
        return (lambda: gemmt.mm(g, w)), (lambda: torch.matmul(g, w)), 2.0 * tokens * fin * fout
    g, x = r(tokens, fout), r(tokens, fin)
    gt = g.t()
    return (lambda: gemmt.mm(gt, x)), (lambda: torch.matmul(gt, x)), 2.0 * tokens * fin * fout


def _product_record(case: str, tokens: int, fin: int, fout: int, dtype: torch.dtype,
                    peak_tflops: float) -> dict[str, Any]:
    ours, ref, flops = _layout_calls(case, tokens, fin, fout, dtype)
    err = _rel_err(ours(), ref())
    n = _repeats(flops / peak_tflops / 1e9)
    o_ms, r_ms = paired_ms(_Replay([ours] * n), _Replay([ref] * n))
    return dict(section="prefill", case=case, dtype=str(dtype).replace("torch.", ""),
                tokens=tokens, in_features=fin, out_features=fout, ours_ms=o_ms, ref_ms=r_ms,
                ratio=r_ms / o_ms, tflops=flops / o_ms / 1e9, ref_tflops=flops / r_ms / 1e9,
                rel_err_vs_torch=err)


def run_prefill(quick: bool, tokens: list[int] | None = None) -> list[dict[str, Any]]:
    layers = LAYERS[:2] if quick else LAYERS
    cases = [(dt, fin, fout, t, c) for dt in (torch.bfloat16, torch.float16)
             for fin, fout in layers for t in (tokens or TOKENS)
             for c in ("fwd", "dgrad", "wgrad")]
    out = []
    for dt, fin, fout, t, c in _progress(cases, "prefill"):
        out.append(_product_record(c, t, fin, fout, dt, 700.0))
        torch.cuda.empty_cache()
    return out


def run_fp32(quick: bool) -> list[dict[str, Any]]:
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        layers = LAYERS[:2] if quick else LAYERS
        cases = [(fin, fout, c) for fin, fout in layers for c in ("fwd", "dgrad", "wgrad")]
        out = []
        for fin, fout, c in _progress(cases, "fp32"):
            rec = _product_record(c, 2048, fin, fout, torch.float32, 50.0)
            rec["section"] = "fp32"
            out.append(rec)
            torch.cuda.empty_cache()
        return out
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# ---- decode -------------------------------------------------------------------------------
def copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read plus written."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    rep = _Replay([lambda: dst.copy_(src)] * 4)
    ms = statistics.median(rep.ms() for _ in range(9))
    return 2 * src.numel() * 4 / ms / 1e6


def run_decode(quick: bool, bw: float) -> list[dict[str, Any]]:
    layers = LAYERS[:3] if quick else LAYERS
    out = []
    for fin, fout in _progress(layers, "decode"):
        wbytes = fin * fout * 2
        copies = max(2, math.ceil(3 * L2_BYTES / wbytes))
        ws = [(torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(torch.bfloat16)
              for _ in range(copies)]
        for m in DECODE_TOKENS:
            x = torch.randn(m, fin, device="cuda").to(torch.bfloat16)
            err = _rel_err(gemmt.linear(x, ws[0]), x.double() @ ws[0].double().t())
            ours = _Replay([lambda w=w: gemmt.linear(x, w) for w in ws])
            ref = _Replay([lambda w=w: F.linear(x, w) for w in ws])
            o_ms, r_ms = paired_ms(ours, ref)
            moved = wbytes + (m * fin + m * fout) * 2
            out.append(dict(section="decode", dtype="bfloat16", tokens=m, in_features=fin,
                            out_features=fout, weight_copies=copies, ours_us=o_ms * 1e3,
                            ref_us=r_ms * 1e3, ratio=r_ms / o_ms,
                            bw_fraction=moved / o_ms / 1e6 / bw,
                            ref_bw_fraction=moved / r_ms / 1e6 / bw, rel_err=err))
            del ours, ref
        del ws
        torch.cuda.empty_cache()
    return out


# ---- fused epilogue -----------------------------------------------------------------------
def _torch_act(z: torch.Tensor, act: str) -> torch.Tensor:
    return F.gelu(z, approximate="tanh") if act == "gelu_tanh" else F.silu(z)


def run_fused(quick: bool) -> list[dict[str, Any]]:
    shapes = [(2048, 4096, 11008)] if quick else [(2048, 4096, 11008), (2048, 4096, 14336),
                                                  (8192, 4096, 11008)]
    # bf16 on every shape, fp16 on the first (its wide tiles take the fill's epilogue too).
    cases = [(s, a, torch.bfloat16) for s in shapes for a in ("gelu_tanh", "silu")]
    cases += [(shapes[0], a, torch.float16) for a in ("gelu_tanh", "silu")]
    out = []
    for (m, fin, fout), act, dt in _progress(cases, "fused"):
        x = torch.randn(m, fin, device="cuda").to(dt)
        w = (torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(dt)
        b = torch.randn(fout, device="cuda").to(dt)

        def eager(x=x, w=w, b=b, act=act):
            return _torch_act(F.linear(x, w, b), act)

        def ours(x=x, w=w, b=b, act=act):
            return gemmt.linear(x, w, b, act)

        ref64 = _torch_act(x.double() @ w.double().t() + b.double(), act)
        rec: dict[str, Any] = dict(section="fused", dtype=str(dt).replace("torch.", ""),
                                   tokens=m, in_features=fin,
                                   out_features=fout, activation=act,
                                   rel_err=_rel_err(ours(), ref64),
                                   eager_rel_err=_rel_err(eager(), ref64))
        with torch.no_grad():
            n = _repeats(2.0 * m * fin * fout / 700e9)
            o_ms, e_ms = paired_ms(_Replay([ours] * n), _Replay([eager] * n))
            rec.update(fwd_ours_ms=o_ms, fwd_eager_ms=e_ms, fwd_vs_eager=e_ms / o_ms)
            if (m, fin, fout) == shapes[0] and dt == torch.bfloat16:
                compiled = torch.compile(eager, mode="max-autotune-no-cudagraphs")
                compiled()
                o_ms, c_ms = paired_ms(_Replay([ours] * n), _Replay([compiled] * n))
                rec.update(fwd_compiled_ms=c_ms, fwd_vs_compiled=c_ms / o_ms)
        # Backward: the graph of one forward, differentiated again and again, in alternating
        # rounds (like paired_ms) of calls queued behind a sleep (_queued_ms).
        g = torch.randn(m, fout, device="cuda").to(dt)
        bwds = {}
        for name, fn in (("ours", ours), ("eager", eager)):
            leaves = [t.detach().requires_grad_() for t in (x, w, b)]
            y = fn(*leaves)

            def bwd(y=y, leaves=leaves):
                return torch.autograd.grad(y, leaves, g, retain_graph=True)

            for _ in range(3):
                bwd()
            bwds[name] = bwd
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {"ours": [], "eager": []}
        for _ in range(7):
            for name, bwd in bwds.items():
                times[name].append(_queued_ms(bwd))
        o_ms, e_ms = statistics.median(times["ours"]), statistics.median(times["eager"])
        rec.update(bwd_ours_ms=o_ms, bwd_eager_ms=e_ms, bwd_vs_eager=e_ms / o_ms,
                   bwd_timing="7 alternating rounds of 4 calls queued behind a sleep")
        out.append(rec)
        torch.cuda.empty_cache()
    return out


# ---- whole model --------------------------------------------------------------------------
def _gemmt_kernel_count(fn: Callable[[], object]) -> int:
    """CUDA kernels of gemmt's that one call of ``fn`` launches (names in namespace gemmt)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and "gemmt::" in e.name)


def llama_pair(layers: int = 4) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two Llama-shaped models (hidden 4096, intermediate 11008, bf16, random weights from
    seed 0, nothing downloaded) with the same weights: torch's Linears, and gemmt's
    (``gemmt.nn.replace_linear``). Needs ``transformers``."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008,
                                   num_hidden_layers=layers, num_attention_heads=32,
                                   num_key_value_heads=32, vocab_size=32000,
                                   max_position_embeddings=4096)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    ours = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    gemmt.nn.replace_linear(ours)
    return ref, ours


def run_model(quick: bool) -> list[dict[str, Any]]:
    if importlib.util.find_spec("transformers") is None:
        print("transformers missing: no model section")
        return []
    ref, ours = llama_pair(2 if quick else 4)
    cfg = ref.config
    # Every projection runs through gemmt. (Logits can come out bit-equal to cuBLAS's where
    # both add each output's products over k in the same order; the kernel count below
    # shows that gemmt computed them.)
    swapped = sum(isinstance(mod, gemmt.nn.Linear) for mod in ours.modules())
    expected = sum(type(mod) is torch.nn.Linear for mod in ref.modules())
    if swapped != expected or swapped == 0:
        raise RuntimeError(f"replace_linear swapped {swapped} of {expected} Linear layers")
    out = []
    counted: list[tuple[dict[str, Any], torch.Tensor]] = []  # (record, its input ids)

    def infer(model, ids):
        with torch.no_grad():
            return model(ids, use_cache=False).logits

    for name, batch, seq in (("prefill", 4, 1024), ("decode", 16, 1)):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
        err = _rel_err(infer(ours, ids), infer(ref, ids))
        o_ms, r_ms, how = paired_calls_ms(lambda: infer(ours, ids), lambda: infer(ref, ids),
                                          "cuda", calls=3, rounds=5)
        out.append(dict(section="model", phase=name, batch=batch, seq=seq, ours_ms=o_ms,
                        ref_ms=r_ms, ratio=r_ms / o_ms, logits_rel_err=err, timing=how,
                        gemmt_linears=swapped))
        counted.append((out[-1], ids))
    ids = torch.randint(0, cfg.vocab_size, (2, 512), device="cuda")

    def step(model):
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss

    loss_o, loss_r = step(ours), step(ref)
    grad_errs = [_rel_err(p.grad, q.grad) for p, q in zip(ours.parameters(), ref.parameters())]
    # A step is timed as a training loop sees it (kit.paired_steps_ms: events around single
    # steps, host included, in eleven alternating rounds; the GPU's busy time from three
    # profiled steps of each beside it).
    timed = paired_steps_ms(lambda: step(ours), lambda: step(ref), "cuda", rounds=11)
    out.append(dict(section="model", phase="train_step", batch=2, seq=512, **timed,
                    loss=float(loss_o), ref_loss=float(loss_r),
                    max_grad_rel_err=max(grad_errs),
                    median_grad_rel_err=statistics.median(grad_errs)))
    # Counted after all timing: the profiler's hooks would slow the eager training step.
    for rec, rec_ids in counted:
        rec["gemmt_kernels"] = _gemmt_kernel_count(lambda ids=rec_ids: infer(ours, ids))
        if rec["gemmt_kernels"] < swapped:
            print(f"warning: {rec['phase']}: {rec['gemmt_kernels']} gemmt kernels for "
                  f"{swapped} Linear layers")
    return out


# ---- report -------------------------------------------------------------------------------
def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for sec in ("prefill", "fp32", "decode"):
        ratios = [r["ratio"] for r in records if r["section"] == sec]
        if ratios:
            s[sec] = dict(median_ratio=statistics.median(ratios), min_ratio=min(ratios),
                          cases=len(ratios))
    dec = [r for r in records if r["section"] == "decode" and r["tokens"] <= 64]
    if dec:
        s["decode"]["min_bw_fraction_m_le_64"] = min(r["bw_fraction"] for r in dec)
    return s


def _plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(22, 5))
    pre = [r for r in records if r["section"] in ("prefill", "fp32")]
    if pre:
        ax = axes[0]
        labels = [f"{r['dtype'][:4]} {r['case']} {r['in_features']}>{r['out_features']} "
                  f"T{r['tokens']}" for r in pre]
        ax.bar(range(len(pre)), [r["ratio"] for r in pre],
               color=["C0" if r["dtype"] == "bfloat16" else "C1" if r["dtype"] == "float16"
                      else "C2" for r in pre])
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.set_xticks(range(len(pre)), labels, rotation=90, fontsize=4)
        ax.set_ylabel("cuBLAS time / gemmt time")
        ax.set_title("training products (bf16 C0, fp16 C1, fp32 C2)")
    dec = [r for r in records if r["section"] == "decode"]
    if dec:
        ax = axes[1]
        for fin, fout in sorted({(r["in_features"], r["out_features"]) for r in dec}):
            pts = sorted((r["tokens"], r["bw_fraction"]) for r in dec
                         if (r["in_features"], r["out_features"]) == (fin, fout))
            ax.plot(*zip(*pts), marker="o", label=f"gemmt {fin}->{fout}")
            pts = sorted((r["tokens"], r["ref_bw_fraction"]) for r in dec
                         if (r["in_features"], r["out_features"]) == (fin, fout))
            ax.plot(*zip(*pts), ls=":", marker="x", alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.set_ylabel("fraction of copy bandwidth (dotted: cuBLAS)")
        ax.set_title("decode x @ W.T, bf16, weights from HBM")
        ax.legend(fontsize=6)
    other = [r for r in records if r["section"] in ("fused", "model")]
    if other:
        ax = axes[2]
        labels, vals = [], []
        for r in other:
            if r["section"] == "fused":
                shape = f"{r['dtype']} {r['tokens']}x{r['out_features']}"
                labels += [f"fwd {r['activation']} {shape}", f"bwd {r['activation']} {shape}"]
                vals += [r["fwd_vs_eager"], r["bwd_vs_eager"]]
            else:
                labels.append(f"model {r['phase']}")
                vals.append(r["ratio"])
        ax.bar(range(len(vals)), vals)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.set_xticks(range(len(vals)), labels, rotation=60, fontsize=6)
        ax.set_ylabel("torch time / gemmt time")
        ax.set_title("fused epilogue (vs eager) and whole model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(out_dir: Path, quick: bool = False, sections: str = ",".join(SECTIONS),
        tokens: str = ",".join(map(str, TOKENS))) -> int:
    """Entry point of ``python -m gemmt bench linear``; ``tokens``: the prefill section's token
    counts (comma separated; the targets are stated for the default ones)."""
    wanted, known = sections_of(sections, SECTIONS)
    if not known:
        return 2
    env = environment()
    bw = copy_gbps()
    records: list[dict[str, Any]] = []
    if "decode" in wanted:
        records += run_decode(quick, bw)
    if "prefill" in wanted:
        records += run_prefill(quick, [int(t) for t in tokens.split(",") if t])
    if "fp32" in wanted:
        records += run_fp32(quick)
    if "fused" in wanted:
        records += run_fused(quick)
    if "model" in wanted:
        records += run_model(quick)
    summary = _summary(records)
    path = _write(out_dir, "linear", env, records, {"copy_gbps": bw, "summary": summary})
    try:
        _plot(records, path.with_suffix(".png"))
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"\ncopy bandwidth (same run): {bw:.0f} GB/s")
    for r in records:
        if r["section"] in ("prefill", "fp32"):
            print(f"{r['section']:8s}{r['dtype']:9s}{r['case']:6s}{r['in_features']:>7}"
                  f"{r['out_features']:>7}{r['tokens']:>6}  gemmt {r['ours_ms'] * 1e3:9.1f} us"
                  f"  torch {r['ref_ms'] * 1e3:9.1f} us  ratio {r['ratio']:.3f}")
        elif r["section"] == "decode":
            print(f"decode  {r['in_features']:>7}{r['out_features']:>7}{r['tokens']:>6}  gemmt "
                  f"{r['ours_us']:8.1f} us  torch {r['ref_us']:8.1f} us  ratio {r['ratio']:.3f}"
                  f"  bw {r['bw_fraction']:.2f} (torch {r['ref_bw_fraction']:.2f})")
        elif r["section"] == "fused":
            comp = (f" compiled {r['fwd_vs_compiled']:.3f}" if "fwd_vs_compiled" in r else "")
            print(f"fused   {r['activation']:10s}{r['dtype']:>9}{r['tokens']:>6}"
                  f"{r['out_features']:>7}  fwd vs "
                  f"eager {r['fwd_vs_eager']:.3f}{comp}  bwd vs eager {r['bwd_vs_eager']:.3f}")
        else:
            busy = (f"  (GPU busy {r['gpu_busy_ms']['ours']:.2f} / {r['gpu_busy_ms']['ref']:.2f}"
                    f" ms, ratio {r['gpu_busy_ratio']:.3f})" if "gpu_busy_ratio" in r else "")
            print(f"model   {r['phase']:11s} gemmt {r['ours_ms']:8.2f} ms  torch "
                  f"{r['ref_ms']:8.2f} ms  ratio {r['ratio']:.3f}{busy}")
    for sec, s in summary.items():
        print(f"summary {sec}: {s}")
    print(f"wrote {path}")
    return 0
