"""``python -m gemmt bench moe``: grouped products, the MoE layer and transformers MoE models
against PyTorch, in the same run.

Sections (``--only``, comma separated; all by default):

* ``grouped``: ``torch.ops.gemmt.grouped_mm`` against ``torch._grouped_mm`` and a Python loop
  of ``torch.mm`` (one product per expert, written into the output), over experts' up
  projections (hidden H -> intermediate I) of Mixtral-, DBRX-, Qwen3-MoE- and
  DeepSeek-V3-shaped layers (8 to 256 experts, hidden 2048 to 7168, intermediate 768 to
  14336) and 2 to 8192 tokens per expert, with balanced and Zipf-skewed routing (expert
  loads proportional to 1/rank), in the three layouts of the layer's training step:
  forward ``x @ W_e.T`` (a (M, H), b (E, H, I) a transposed view of transformers' (E, I, H)
  weight, offsets over M), grad_input ``g @ W_e`` and grad_weight ``g.T @ x`` (offsets over
  the contracted tokens, output (E, I, H)). Offsets are int32 cumulative ends; tokens are
  sorted by expert. Each point also has its roofline fraction: the roofline time is
  max(FLOPs / dense bf16 rate, bytes of weights + activations + output / copy bandwidth),
  both rates measured in this run (``torch.matmul`` of 8192^3 bf16, a 1 GiB device copy),
  divided by the measured time.
* ``scaled``: ``gemmt.scaled_grouped_mm`` (float8 e4m3, a scale a row of the activations and
  a column of each expert's weight) against ``torch._scaled_grouped_mm`` on the same
  configurations, in the forward and grad_input layouts (both operands K-major, as torch's
  product wants), and each against the bf16 grouped product of the same shapes.
* ``scaled_block``: ``gemmt.scaled_grouped_mm`` with block scales (1x128 of the activations,
  128x128 of each expert's weight: DeepSeek-V3's recipe) on the same configurations and
  layouts, against a loop over the experts of ``torch._scaled_mm``'s blockwise product
  (cuBLASLt; torch has no grouped product with block scales; each group's rows padded to a
  multiple of 16, the only counts it takes), against gemmt's own row-scaled
  product (what the blocks cost) and its bf16 grouped product.
* ``layer``: ``gemmt.nn.MoE`` forward and forward + backward against the same layer written
  with torch ops and ``torch._grouped_mm`` (softmax routing, top-k, renormalised weights,
  SwiGLU experts, float32 weighted combine), sharing the module's parameters; and
  ``gemmt.nn.Float8MoE`` made from it (float8 experts, inference) against both bf16 layers'
  forward (phase ``forward_float8``).
* ``models``: when transformers imports, two-layer Mixtral-like (hidden 4096, 8 experts x
  14336, top-2) and Qwen3-MoE-like (hidden 2048, 128 experts x 768, top-8) models with
  random bf16 weights, run with ``set_experts_implementation("gemmt")`` (after
  ``gemmt.moe.register_transformers()``) against "grouped_mm", "eager" and, for decode,
  "batched_mm": prefill (2 x 2048 tokens), decode (32 sequences x 1 token, no cache) and a
  training step (2 x 2048 tokens, loss and backward), host time included; and on CUDA
  ``decode_graph``, the same decode step captured in a CUDA graph per implementation and
  replayed, as a serving loop runs it (the "eager" implementation reads the routing back to the
  host, which a graph cannot hold, so it is left out there).

Timing: CUDA events, warm-up, medians over rounds alternating between the candidates (see
:mod:`gemmt._bench_kit`); random data. Ratios are the other's time over gemmt's (above 1:
gemmt faster). Every external call is wrapped: a failure is recorded with its error and the
run goes on. ``--quick`` runs fewer configurations; ``--smoke`` tiny sizes, on the CPU
when there is no GPU (this checks the code paths; its times mean nothing).

Writes ``<out>/moe_<gpu>_<date>.json``, a ``.png`` beside it (with matplotlib) and a ``.md``
README draft.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

import gemmt
from gemmt import _bench_kit as kit
from gemmt._report import progress as _progress
from gemmt._report import write as _write

SECTIONS = ("grouped", "scaled", "scaled_block", "layer", "models")
SCALED_LAYOUTS = ("forward", "grad_input")
LAYOUTS = ("forward", "grad_input", "grad_weight")
ROUTINGS = ("balanced", "zipf")
ZIPF_EXPONENT = 1.0
_BF16 = torch.bfloat16

# (name, experts, hidden, intermediate, tokens per expert)
GROUPED = [
    ("mixtral", 8, 4096, 14336, [16, 128, 1024, 8192]),
    ("dbrx", 16, 6144, 10752, [64, 512, 4096]),
    ("qwen3_30b", 128, 2048, 768, [2, 16, 128, 512]),
    ("qwen3_235b", 128, 4096, 1536, [8, 64, 512]),
    ("deepseek_v3", 256, 7168, 2048, [2, 32, 256]),
]
QUICK_GROUPED = [
    ("mixtral", 8, 4096, 14336, [128, 4096]),
    ("qwen3_30b", 128, 2048, 768, [16, 256]),
    ("deepseek_v3", 256, 7168, 2048, [2, 64]),
]
SMOKE_GROUPED = [("tiny", 4, 64, 96, [2, 16]), ("tiny_many", 16, 32, 48, [4])]
# Block scales: K a multiple of 128 (and of 512 here: torch 2.11's CUDA blockwise product
# misreads a 128x128 scale with K / 128 not a multiple of 4 beside two or more column blocks).
SMOKE_BLOCK = [("tiny", 4, 512, 512, [2, 16])]
# An FP8 product further than this from the bf16 one (relative) is wrong, not imprecise.
FP8_WRONG = 0.08
# (name, hidden, intermediate, experts, top_k)
LAYERS = [("mixtral", 4096, 14336, 8, 2), ("qwen3_30b", 2048, 768, 128, 8)]
LAYER_TOKENS = [512, 4096, 16384]
QUICK_LAYER_TOKENS = [4096]
SMOKE_LAYERS = [("tiny", 64, 32, 8, 2)]
SMOKE_LAYER_TOKENS = [32]
DENSE_N = 8192
COPY_BYTES = 1 << 30
# Model phases: (name, batch, sequence, implementations compared with gemmt)
PHASES = [("prefill", 2, 2048, ("grouped_mm", "eager")),
          ("decode", 32, 1, ("grouped_mm", "eager", "batched_mm")),
          ("decode_graph", 32, 1, ("grouped_mm", "batched_mm")),
          ("train", 2, 2048, ("grouped_mm", "eager"))]
SMOKE_PHASES = [("prefill", 2, 16, ("grouped_mm", "eager")),
                ("decode", 4, 1, ("grouped_mm", "eager", "batched_mm")),
                ("decode_graph", 4, 1, ("grouped_mm", "batched_mm")),
                ("train", 2, 16, ("grouped_mm", "eager"))]
MODEL_VOCAB = 32000


# ---- references measured in the same run --------------------------------------------------
def measure_references(device: str, smoke: bool, timing: dict[str, Any]) -> dict[str, Any]:
    """The dense bf16 rate (torch.matmul, n^3) and the copy bandwidth of a large device copy."""
    n = 256 if smoke else DENSE_N
    a = torch.randn(n, n, device=device, dtype=_BF16)
    b = torch.randn(n, n, device=device, dtype=_BF16)
    nbytes = (4 << 20) if smoke else COPY_BYTES
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms, err = kit.time_candidates({"matmul": lambda: torch.matmul(a, b),
                                   "copy": lambda: dst.copy_(src)}, device, **timing)
    return {"dense_n": n, "dense_ms": ms["matmul"],
            "dense_bf16_tflops": kit.tflops(2.0 * n ** 3, ms["matmul"]),
            "copy_bytes": 2 * nbytes, "copy_ms": ms["copy"],
            "copy_gbps": (2 * nbytes / ms["copy"] / 1e6) if ms["copy"] else None,
            "errors": err}


# ---- grouped ------------------------------------------------------------------------------
def group_counts(experts: int, tokens_per_expert: int, routing: str,
                 gen: torch.Generator) -> list[int]:
    """Tokens per expert, summing to experts * tokens_per_expert: all equal ("balanced"), or
    proportional to 1/rank^ZIPF_EXPONENT over a random order of the experts ("zipf")."""
    total = experts * tokens_per_expert
    if routing == "balanced":
        return [tokens_per_expert] * experts
    weights = [1.0 / (r + 1) ** ZIPF_EXPONENT for r in range(experts)]
    s = sum(weights)
    counts = [math.floor(total * w / s) for w in weights]
    counts[0] += total - sum(counts)
    order = torch.randperm(experts, generator=gen).tolist()
    return [counts[order[e]] for e in range(experts)]


def _loop(layout: str, a: torch.Tensor, b: torch.Tensor, counts: list[int],
          out_shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    """The Python loop of torch.mm, one product per expert, written into one output."""
    def run() -> torch.Tensor:
        out = torch.empty(out_shape, device=a.device, dtype=a.dtype)
        start = 0
        for e, c in enumerate(counts):
            end = start + c
            if layout == "forward":
                if c:
                    torch.mm(a[start:end], b[e].t(), out=out[start:end])
            elif layout == "grad_input":
                if c:
                    torch.mm(a[start:end], b[e], out=out[start:end])
            elif c:
                torch.mm(a[start:end].t(), b[start:end], out=out[e])
            else:
                out[e].zero_()
            start = end
        return out
    return run


def _routed_points(device: str, configs: list[tuple[str, int, int, int, list[int]]], what: str
                   ) -> Iterator[tuple[tuple[str, int, int, int], int, str, list[int],
                                       torch.Tensor, torch.Tensor]]:
    """Every (configuration, tokens per expert, routing) with a progress bar: the
    configuration's (name, experts, hidden, intermediate), the tokens per expert, the routing,
    the group counts, their int32 offsets on the device and a random expert weight in
    transformers' layout of an up projection, (experts, out = I, in = H)."""
    gen = torch.Generator().manual_seed(0)
    points = [(c, tpe, routing) for c in configs for tpe in c[4] for routing in ROUTINGS]
    for (name, experts, hidden, inter, _), tpe, routing in _progress(points, what):
        counts = group_counts(experts, tpe, routing, gen)
        offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
        w = torch.randn(experts, inter, hidden, device=device, dtype=_BF16).mul_(hidden ** -0.5)
        yield (name, experts, hidden, inter), tpe, routing, counts, offs, w
        del w
        if device == "cuda":
            torch.cuda.empty_cache()


def run_grouped(device: str, configs: list[tuple[str, int, int, int, list[int]]],
                refs: dict[str, Any], timing: dict[str, Any]) -> list[dict[str, Any]]:
    records = []
    for cfg, tpe, routing, counts, offs, w in _routed_points(device, configs, "moe grouped"):
        name, experts, hidden, inter = cfg
        m = sum(counts)
        x = torch.randn(m, hidden, device=device, dtype=_BF16)
        g = torch.randn(m, inter, device=device, dtype=_BF16)
        flops = 2.0 * m * hidden * inter
        nbytes = 2.0 * (m * hidden + experts * hidden * inter + m * inter)
        roof_ms = max(flops / (refs["dense_bf16_tflops"] or math.inf) / 1e9,
                      nbytes / (refs["copy_gbps"] or math.inf) / 1e6)
        for layout in LAYOUTS:
            if layout == "forward":
                a, b, shape = x, w.transpose(1, 2), (m, inter)
                loop = _loop(layout, x, w, counts, shape)
            elif layout == "grad_input":
                a, b, shape = g, w, (m, hidden)
                loop = _loop(layout, g, w, counts, shape)
            else:
                a, b, shape = g.t(), x, (experts, inter, hidden)
                loop = _loop(layout, g, x, counts, shape)
            cands = {"gemmt": lambda a=a, b=b: torch.ops.gemmt.grouped_mm(a, b, offs),
                     "torch": lambda a=a, b=b: torch._grouped_mm(a, b, offs),
                     "loop": loop}
            ms, err = kit.time_candidates(cands, device, **timing)
            ref, _ = kit.attempt(loop, device)
            diffs: dict[str, float | None] = {}
            for impl in ("gemmt", "torch"):
                out = kit.attempt(cands[impl], device)[0] if ms[impl] is not None else None
                diffs[impl] = (kit.rel_diff(out, ref)
                               if out is not None and ref is not None else None)
                del out
            records.append(dict(
                section="grouped", config=name, experts=experts, hidden=hidden,
                intermediate=inter, tokens_per_expert=tpe, routing=routing, layout=layout,
                tokens=m, max_group=max(counts), empty_groups=sum(c == 0 for c in counts),
                flops=flops, bytes=nbytes, roofline_ms=roof_ms,
                gemmt_ms=ms["gemmt"], torch_ms=ms["torch"], loop_ms=ms["loop"],
                gemmt_tflops=kit.tflops(flops, ms["gemmt"]),
                torch_tflops=kit.tflops(flops, ms["torch"]),
                loop_tflops=kit.tflops(flops, ms["loop"]),
                gemmt_vs_torch=kit.ratio(ms["torch"], ms["gemmt"]),
                gemmt_vs_loop=kit.ratio(ms["loop"], ms["gemmt"]),
                gemmt_roofline_fraction=kit.ratio(roof_ms, ms["gemmt"]),
                torch_roofline_fraction=kit.ratio(roof_ms, ms["torch"]),
                loop_roofline_fraction=kit.ratio(roof_ms, ms["loop"]),
                gemmt_rel_diff_vs_loop=diffs["gemmt"], torch_rel_diff_vs_loop=diffs["torch"],
                gemmt_error=err.get("gemmt"), torch_error=err.get("torch"),
                loop_error=err.get("loop")))
            del ref
        del w, x, g
    return records


# ---- scaled: FP8 grouped products --------------------------------------------------------
def _point(section: str, cfg: tuple[str, int, int, int], tpe: int, routing: str, layout: str,
           tokens: int, flops: float) -> dict[str, Any]:
    """The fields that name an FP8 grouped point: its section, configuration, routing and
    layout."""
    name, experts, hidden, inter = cfg
    return dict(section=section, config=name, experts=experts, hidden=hidden,
                intermediate=inter, tokens_per_expert=tpe, routing=routing, layout=layout,
                tokens=tokens, flops=flops)


def _fp8_points(device: str, configs: list[tuple[str, int, int, int, list[int]]], what: str
                ) -> Iterator[tuple[tuple[str, int, int, int], int, str, list[int], torch.Tensor,
                                    str, torch.Tensor, torch.Tensor]]:
    """The FP8 sections' points: each routed point of :func:`_routed_points` in the forward
    and grad_input layouts, with random bf16 tokens ``a16`` (M, K) and the expert weight as
    ``b16`` (experts, K, N), column-major: W^T for the forward, W for grad_input."""
    for cfg, tpe, routing, counts, offs, w in _routed_points(device, configs, what):
        hidden, inter = cfg[2:]
        for layout in SCALED_LAYOUTS:
            k = hidden if layout == "forward" else inter
            a16 = torch.randn(sum(counts), k, device=device, dtype=_BF16)
            b16 = (w.transpose(1, 2) if layout == "forward"
                   else w.transpose(1, 2).contiguous().transpose(1, 2))
            yield cfg, tpe, routing, counts, offs, layout, a16, b16
            del a16, b16


def _times(ms: dict[str, float | None], flops: float, rates: tuple[str, ...],
           ratios: tuple[tuple[str, str], ...]) -> dict[str, float | None]:
    """Each candidate's ``<name>_ms``, the ``<name>_tflops`` of ``rates`` and, for each pair
    (a, b) of ``ratios``, ``<a>_vs_<b>``: b's time over a's."""
    out: dict[str, float | None] = {f"{name}_ms": t for name, t in ms.items()}
    out.update({f"{name}_tflops": kit.tflops(flops, ms[name]) for name in rates})
    out.update({f"{a}_vs_{b}": kit.ratio(ms[b], ms[a]) for a, b in ratios})
    return out


def quantize_rows(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t as float8_e4m3fn with one dequantisation scale per slice along ``dim`` (amax / 448),
    the scales with ``dim`` reduced away."""
    amax = t.float().abs().amax(dim=dim, keepdim=True).clamp_min(1e-12)
    scale = amax / torch.finfo(torch.float8_e4m3fn).max
    return (t.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(dim)


def run_scaled(device: str, configs: list[tuple[str, int, int, int, list[int]]],
               timing: dict[str, Any]) -> list[dict[str, Any]]:
    """``scaled_grouped_mm`` against ``torch._scaled_grouped_mm`` (row scales, the forward and
    grad_input products of an expert projection, in the K-major layouts both read), and each
    against the bf16 grouped product of the same shapes (gemmt's and torch's)."""
    records = []
    has_torch = hasattr(torch, "_scaled_grouped_mm")
    for cfg, tpe, routing, counts, offs, layout, a16, b16 in _fp8_points(device, configs,
                                                                         "moe scaled"):
        m, k, n = a16.shape[0], a16.shape[1], b16.shape[2]
        aq, sa = quantize_rows(a16, 1)
        bq, sb = quantize_rows(b16, 1)  # one scale a column of each expert's b
        bq = bq.transpose(1, 2).contiguous().transpose(1, 2)
        cands = {
            "gemmt": lambda: gemmt.ops.scaled_grouped_mm(aq, bq, sa, sb, offs),
            "gemmt_bf16": lambda: torch.ops.gemmt.grouped_mm(a16, b16, offs),
            "torch_bf16": lambda: torch._grouped_mm(a16, b16, offs)}
        if has_torch:
            cands["torch"] = lambda: torch._scaled_grouped_mm(
                aq, bq, sa, sb, offs=offs, out_dtype=_BF16)
        ms, err = kit.time_candidates(cands, device, **timing)
        ms.setdefault("torch", None)
        diff = None
        if ms["gemmt"] is not None and ms["torch"] is not None:
            diff = kit.rel_diff(cands["gemmt"](), cands["torch"]())
        flops = 2.0 * m * k * n
        records.append(dict(
            **_point("scaled", cfg, tpe, routing, layout, m, flops),
            **_times(ms, flops, ("gemmt", "torch"),
                     (("gemmt", "torch"), ("gemmt", "gemmt_bf16"), ("torch", "torch_bf16"))),
            gemmt_rel_diff_vs_torch=diff,
            gemmt_error=err.get("gemmt"),
            torch_error=err.get("torch") if has_torch else "torch._scaled_grouped_mm: absent"))
        del a16, b16, aq, bq
    return records


def _block_operands(a16: torch.Tensor, b16: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """a16 with 1x128 block scales (M, K/128), column-major, and each expert's b16 (K, N)
    with 128x128 ones, (E, K/128, N/128) as the transposes of (N/128, K/128) grids: the
    layouts torch._scaled_mm's blockwise product takes, a group at a time."""
    aq, sa = gemmt.quantize_fp8(a16, "block")
    qs = [gemmt.quantize_fp8(b16[e].t(), "block_128x128") for e in range(b16.shape[0])]
    bq = torch.stack([q for q, _ in qs]).transpose(1, 2)  # (E, K, N), K-major
    sb = torch.stack([sc for _, sc in qs]).transpose(1, 2)
    return aq, sa, bq, sb


# cuBLASLt's blockwise product refuses (CUBLAS_STATUS_NOT_SUPPORTED) row counts that are not
# a multiple of 16 (H200, torch 2.11): the loop pads each group's rows to one.
BLOCKWISE_ROWS = 16


def _blockwise_loop(aq: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor,
                    counts: list[int]) -> Callable[[], torch.Tensor]:
    """torch._scaled_mm's blockwise product group by group into one output, each group's rows
    padded with zeros to a multiple of BLOCKWISE_ROWS and its scales made in the layout it asks
    for, before the timing."""
    parts, start = [], 0
    for e, rows in enumerate(counts):
        if rows:
            padded = -(-rows // BLOCKWISE_ROWS) * BLOCKWISE_ROWS
            a = torch.zeros(padded, aq.shape[1], device=aq.device, dtype=aq.dtype)
            a[:rows] = aq[start:start + rows]
            sca = torch.ones(sa.shape[1], padded, device=sa.device, dtype=sa.dtype)
            sca[:, :rows] = sa[start:start + rows].t()
            parts.append((start, start + rows, a, sca.t(), bq[e], sb[e]))
        start += rows
    out = torch.zeros(aq.shape[0], bq.shape[2], device=aq.device, dtype=_BF16)

    def run() -> torch.Tensor:
        for s0, s1, a, sca, b, scb in parts:
            out[s0:s1] = torch._scaled_mm(a, b, scale_a=sca, scale_b=scb,
                                          out_dtype=_BF16)[:s1 - s0]
        return out
    return run


def run_scaled_block(device: str, configs: list[tuple[str, int, int, int, list[int]]],
                     timing: dict[str, Any]) -> list[dict[str, Any]]:
    """Block-scaled ``scaled_grouped_mm`` against a loop of ``torch._scaled_mm``'s blockwise
    product, gemmt's row-scaled product and its bf16 ``grouped_mm`` (forward and grad_input)."""
    records = []
    for cfg, tpe, routing, counts, offs, layout, a16, b16 in _fp8_points(device, configs,
                                                                         "moe block"):
        m, k, n = a16.shape[0], a16.shape[1], b16.shape[2]
        aq, sa, bq, sb = _block_operands(a16, b16)
        aq_r, sa_r = quantize_rows(a16, 1)
        bq_r, sb_r = quantize_rows(b16, 1)
        bq_r = bq_r.transpose(1, 2).contiguous().transpose(1, 2)
        cands = {
            "gemmt": lambda: gemmt.ops.scaled_grouped_mm(aq, bq, sa, sb, offs),
            "torch_loop": _blockwise_loop(aq, sa, bq, sb, counts),
            "gemmt_rowwise": lambda: gemmt.ops.scaled_grouped_mm(aq_r, bq_r, sa_r, sb_r, offs),
            "gemmt_bf16": lambda: torch.ops.gemmt.grouped_mm(a16, b16, offs)}
        ms, err = kit.time_candidates(cands, device, **timing)
        diff = torch_vs_bf16 = None
        ref = cands["gemmt_bf16"]() if ms["gemmt"] is not None else None
        if ms["gemmt"] is not None and ms["torch_loop"] is not None:
            theirs = cands["torch_loop"]()
            diff = kit.rel_diff(cands["gemmt"](), theirs)
            torch_vs_bf16 = kit.rel_diff(theirs, ref)
            if torch_vs_bf16 > FP8_WRONG:
                # Timed, but not a product to race: kept out of the ratios.
                err["torch_loop"] = (f"wrong result: {torch_vs_bf16:.3g} from the bf16 "
                                     f"product (K / 128 = {k // 128})")
                ms["torch_loop"] = None
        flops = 2.0 * m * k * n
        records.append(dict(
            **_point("scaled_block", cfg, tpe, routing, layout, m, flops),
            **_times(ms, flops, ("gemmt", "torch_loop"),
                     (("gemmt", "torch_loop"), ("gemmt", "gemmt_rowwise"),
                      ("gemmt", "gemmt_bf16"))),
            gemmt_rel_diff_vs_torch_loop=diff, torch_loop_rel_diff_vs_bf16=torch_vs_bf16,
            gemmt_rel_diff_vs_bf16=(kit.rel_diff(cands["gemmt"](), ref)
                                    if ref is not None else None),
            gemmt_error=err.get("gemmt"), torch_loop_error=err.get("torch_loop")))
        del a16, b16, aq, bq, aq_r, bq_r, ref
    return records


# ---- layer --------------------------------------------------------------------------------
def torch_moe(moe: gemmt.nn.MoE, x: torch.Tensor) -> torch.Tensor:
    """``moe(x)`` written with torch ops and ``torch._grouped_mm``, in gemmt.nn.MoE's semantics
    (softmax in float32, top-k, renormalised weights, gate rows before up rows, SwiGLU,
    each token's contributions summed in float32 and rounded once)."""
    flat = x.reshape(-1, moe.hidden_size)
    k = moe.top_k
    scores = F.linear(flat, moe.gate.weight).float().softmax(dim=-1)
    weights, ids = scores.topk(k, dim=-1)
    if moe.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    # Cumulative ends per expert without a host synchronisation (bincount would need one).
    experts = torch.arange(moe.num_experts, device=x.device, dtype=flat_ids.dtype)
    offs = torch.searchsorted(flat_ids[order], experts, right=True).to(torch.int32)
    token = order // k
    h = torch._grouped_mm(flat[token], moe.gate_up_proj.transpose(1, 2), offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, moe.down_proj.transpose(1, 2), offs)
    contrib = y.float() * weights.reshape(-1)[order, None]
    out = torch.zeros(flat.shape, device=x.device, dtype=torch.float32).index_add(0, token, contrib)
    return out.to(x.dtype).reshape(x.shape)


def run_layer(device: str, configs: list[tuple[str, int, int, int, int]], tokens: list[int],
              timing: dict[str, Any]) -> list[dict[str, Any]]:
    records = []
    points = [(c, t) for c in configs for t in tokens]
    for (name, hidden, inter, experts, top_k), t in _progress(points, "moe layer"):
        moe, err = kit.attempt(lambda: gemmt.nn.MoE(hidden, inter, experts, top_k,
                                                   device=device, dtype=_BF16), device)
        if moe is None:
            records.append(dict(section="layer", config=name, tokens=t, phase="forward",
                                error=err))
            continue
        x = torch.randn(t, hidden, device=device, dtype=_BF16)
        xg = x.clone().requires_grad_()
        g = torch.randn(t, hidden, device=device, dtype=_BF16)
        params = [*moe.parameters(), xg]

        def forward(fn: Callable[[gemmt.nn.MoE, torch.Tensor], torch.Tensor]
                    ) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                with torch.no_grad():
                    return fn(moe, x)
            return run

        def train(fn: Callable[[gemmt.nn.MoE, torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                for p in params:
                    p.grad = None
                fn(moe, xg).backward(g)
            return run

        def call_module(m: gemmt.nn.MoE, inp: torch.Tensor) -> torch.Tensor:
            return m(inp)

        # Active parameters per token: top_k experts' three matrices, and the router.
        flops_fwd = 2.0 * t * (top_k * 3 * hidden * inter + hidden * experts)
        for phase, make, flops in (("forward", forward, flops_fwd),
                                   ("forward_backward", train, 3 * flops_fwd)):
            ms, errs = kit.time_candidates({"gemmt": make(call_module), "torch": make(torch_moe)},
                                           device, **timing)
            diff = None
            if phase == "forward" and ms["gemmt"] is not None and ms["torch"] is not None:
                diff = kit.rel_diff(forward(call_module)(), forward(torch_moe)())
            records.append(dict(
                section="layer", config=name, hidden=hidden, intermediate=inter,
                experts=experts, top_k=top_k, tokens=t, phase=phase,
                gemmt_ms=ms["gemmt"], torch_ms=ms["torch"],
                gemmt_tflops=kit.tflops(flops, ms["gemmt"]),
                torch_tflops=kit.tflops(flops, ms["torch"]),
                gemmt_vs_torch=kit.ratio(ms["torch"], ms["gemmt"]),
                rel_diff_vs_torch=diff, gemmt_error=errs.get("gemmt"),
                torch_error=errs.get("torch")))
        records.append(_float8_layer_record(moe, forward, call_module, flops_fwd, device, timing,
                                            dict(config=name, hidden=hidden, intermediate=inter,
                                                 experts=experts, top_k=top_k, tokens=t)))
        del moe, x, xg, g, params
        if device == "cuda":
            torch.cuda.empty_cache()
    return records


def _float8_layer_record(moe: gemmt.nn.MoE, forward: Callable[..., Callable[[], torch.Tensor]],
                         call_module: Callable[[gemmt.nn.MoE, torch.Tensor], torch.Tensor],
                         flops: float, device: str, timing: dict[str, Any],
                         point: dict[str, Any]) -> dict[str, Any]:
    """The phase "forward_float8": gemmt.nn.Float8MoE made from the layer (its experts in
    float8, inference) against the bf16 layer written with torch ops, and against gemmt's own
    bf16 layer; its output's difference from torch's bf16 layer is float8's error."""
    layer, err = kit.attempt(lambda: gemmt.nn.Float8MoE.from_moe(moe), device)
    if layer is None:
        return dict(section="layer", phase="forward_float8", **point, gemmt_ms=None,
                    torch_ms=None, gemmt_vs_torch=None, gemmt_error=err, torch_error=None)

    def call_float8(_: gemmt.nn.MoE, inp: torch.Tensor) -> torch.Tensor:
        return layer(inp)

    ms, errs = kit.time_candidates({"gemmt": forward(call_float8), "torch": forward(torch_moe),
                                    "gemmt_bf16": forward(call_module)}, device, **timing)
    diff = None
    if ms["gemmt"] is not None and ms["torch"] is not None:
        diff = kit.rel_diff(forward(call_float8)(), forward(torch_moe)())
    return dict(section="layer", phase="forward_float8", **point, gemmt_ms=ms["gemmt"],
                torch_ms=ms["torch"], gemmt_bf16_ms=ms["gemmt_bf16"],
                gemmt_tflops=kit.tflops(flops, ms["gemmt"]),
                torch_tflops=kit.tflops(flops, ms["torch"]),
                gemmt_vs_torch=kit.ratio(ms["torch"], ms["gemmt"]),
                gemmt_vs_gemmt_bf16=kit.ratio(ms["gemmt_bf16"], ms["gemmt"]),
                rel_diff_vs_torch=diff, gemmt_error=errs.get("gemmt"),
                torch_error=errs.get("torch"))


# ---- models -------------------------------------------------------------------------------
def _model_builders(tf: Any, smoke: bool) -> list[tuple[str, Callable[[], Any]]]:
    if smoke:
        common = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
        mixtral = dict(intermediate_size=24, num_local_experts=6, num_experts_per_tok=2)
        qwen = dict(intermediate_size=48, moe_intermediate_size=16, num_experts=8,
                    num_experts_per_tok=3, decoder_sparse_step=1, head_dim=8)
    else:
        common = dict(vocab_size=MODEL_VOCAB, num_hidden_layers=2, num_attention_heads=32,
                      max_position_embeddings=4096)
        mixtral = dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                       num_experts_per_tok=2, num_key_value_heads=8)
        qwen = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                    num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1,
                    num_key_value_heads=4, head_dim=128, norm_topk_prob=True)
    return [("mixtral_like", lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**common, **mixtral))),
            ("qwen3_moe_like", lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**common, **qwen)))]


def _build_model(build: Callable[[], Any], device: str) -> Any:
    with torch.device(device):
        model = build()
    model = model.to(_BF16)
    with torch.no_grad():  # random weights everywhere (some start at zero); norms stay ones
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    return model


def run_models(device: str, smoke: bool, timing: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        import transformers as tf

        import gemmt.moe

        registered = gemmt.moe.register_transformers()
        if not registered:
            raise ImportError("gemmt.moe.register_transformers() found no experts registry")
    except Exception as exc:  # noqa: BLE001 - transformers missing or too old: recorded
        return [dict(section="models", model=None, phase=None, impl=None,
                     error=f"transformers absent: {kit.error_text(exc)}")]
    records = []
    phases = SMOKE_PHASES if smoke else PHASES
    for name, build in _progress(_model_builders(tf, smoke), "moe models"):
        model, err = kit.attempt(lambda build=build: _build_model(build, device), device)
        if model is None:
            records.append(dict(section="models", model=name, phase=None, impl=None, error=err))
            continue
        vocab = model.config.vocab_size
        for phase, batch, seq, others in phases:
            if phase == "decode_graph" and device != "cuda":
                continue
            ids = torch.randint(0, vocab, (batch, seq), device=device)
            impls = ("gemmt", *others)

            def run(phase: str = phase, ids: torch.Tensor = ids) -> Any:
                if phase == "train":
                    model.train()
                    model.zero_grad(set_to_none=True)
                    loss = model(ids, labels=ids, use_cache=False).loss
                    loss.backward()
                    return loss.detach()
                model.eval()
                with torch.no_grad():
                    return model(ids, use_cache=False).logits

            # decode_graph: the decode step captured in a CUDA graph per implementation and
            # replayed, as a serving loop runs it: the host's share of each step is gone.
            replays: dict[str, kit.Replay] = {}

            def first(impl: str, phase: str = phase) -> Any:
                model.set_experts_implementation(impl)
                out = run()
                if phase == "decode_graph":
                    replays[impl] = kit.Replay([run])
                return out

            def timed(impl: str) -> Callable[[], Any]:
                return replays[impl].graph.replay if impl in replays else run

            outs: dict[str, Any] = {}
            errs: dict[str, str] = {}
            for impl in impls:
                out, e = kit.attempt(lambda impl=impl: first(impl), device)
                if e is None:
                    outs[impl] = out.float() if phase != "train" else out
                else:
                    errs[impl] = e
            # Implementations take turns in blocks, three each: the switch is made between
            # blocks, outside the timed calls; the time is the median of the block medians.
            blocks: dict[str, list[float]] = {impl: [] for impl in outs}
            for _ in range(3):
                for impl in outs:
                    if impl in errs:
                        continue
                    try:
                        model.set_experts_implementation(impl)
                        blocks[impl].append(kit.interleaved_ms(
                            {impl: timed(impl)}, device,
                            **{**timing, "warmup": 1, "queued": False})[impl])
                    except Exception as exc:  # noqa: BLE001
                        errs.setdefault(impl, kit.error_text(exc))
            ms = {impl: (sorted(v)[len(v) // 2] if v and impl not in errs else None)
                  for impl, v in blocks.items()}
            for impl in impls:
                t = ms.get(impl)
                ref = outs.get("eager")
                diff = None
                if impl in outs and ref is not None and phase != "train":
                    diff = kit.rel_diff(outs[impl], ref)
                records.append(dict(
                    section="models", model=name, phase=phase, batch=batch, sequence=seq,
                    impl=impl, ms=t, gemmt_vs_impl=(kit.ratio(t, ms.get("gemmt"))
                                                    if impl != "gemmt" else None),
                    logits_rel_diff_vs_eager=diff,
                    loss=(float(outs[impl]) if phase == "train" and impl in outs else None),
                    error=errs.get(impl)))
            replays.clear()
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return records


# ---- summary, plot, README ----------------------------------------------------------------
def summarize(records: list[dict[str, Any]], refs: dict[str, Any] | None) -> dict[str, Any]:
    """Medians and worsts per layout and routing, per layer phase and per model phase."""
    out: dict[str, Any] = {}
    if refs is not None:
        out["references"] = {k: refs[k] for k in ("dense_bf16_tflops", "copy_gbps")}
    for section, layouts, keys in (
            ("grouped", LAYOUTS, ("gemmt_vs_torch", "gemmt_vs_loop", "gemmt_roofline_fraction",
                                  "torch_roofline_fraction")),
            ("scaled", SCALED_LAYOUTS, ("gemmt_vs_torch", "gemmt_vs_gemmt_bf16",
                                        "torch_vs_torch_bf16")),
            ("scaled_block", SCALED_LAYOUTS, ("gemmt_vs_torch_loop", "gemmt_vs_gemmt_rowwise",
                                              "gemmt_vs_gemmt_bf16"))):
        rows = [r for r in records if r["section"] == section]
        if rows:
            out[section] = {
                f"{layout}/{routing}": {key: kit.stats([r[key] for r in rows
                                                        if r["layout"] == layout
                                                        and r["routing"] == routing])
                                        for key in keys}
                for layout in layouts for routing in ROUTINGS}
    layer = [r for r in records if r["section"] == "layer"]
    if layer:
        out["layer"] = {f"{r['config']}/{r['tokens']}/{r['phase']}": {
            "gemmt_ms": r.get("gemmt_ms"), "torch_ms": r.get("torch_ms"),
            "gemmt_vs_torch": r.get("gemmt_vs_torch")} for r in layer}
    models = [r for r in records if r["section"] == "models"]
    if models:
        out["models"] = {}
        for r in models:
            if r["model"] is None or r["phase"] is None:
                out["models"]["error"] = r["error"]
                continue
            key = f"{r['model']}/{r['phase']}"
            out["models"].setdefault(key, {})[r["impl"]] = {
                "ms": r["ms"], "gemmt_vs_impl": r["gemmt_vs_impl"], "error": r["error"]}
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    """grouped_mm against torch and the loop, its roofline fraction, the layer, the models."""
    recs = doc["records"]
    panels = []
    def point_labels(rows: list[dict[str, Any]]) -> list[str]:
        return [f"{r['config']} {r['tokens_per_expert']}/e {r['routing'][:3]} {r['layout'][:6]}"
                for r in rows]

    grouped = [r for r in recs if r["section"] == "grouped"]
    if grouped:
        labels = point_labels(grouped)
        panels.append(("grouped_mm: gemmt vs torch._grouped_mm and a loop of mm", labels,
                       {"vs torch._grouped_mm": [r["gemmt_vs_torch"] for r in grouped],
                        "vs loop of mm": [r["gemmt_vs_loop"] for r in grouped]},
                       "other time / gemmt time"))
        panels.append(("grouped_mm: fraction of the roofline", labels,
                       {impl: [r[f"{impl}_roofline_fraction"] for r in grouped]
                        for impl in ("gemmt", "torch", "loop")}, "roofline time / time"))
    scaled = [r for r in recs if r["section"] == "scaled"]
    if scaled:
        panels.append(("scaled_grouped_mm (FP8, row scales)", point_labels(scaled),
                       {"vs torch._scaled_grouped_mm": [r["gemmt_vs_torch"] for r in scaled],
                        "vs gemmt bf16 grouped_mm": [r["gemmt_vs_gemmt_bf16"] for r in scaled]},
                       "other time / gemmt time"))
    block = [r for r in recs if r["section"] == "scaled_block"]
    if block:
        panels.append(("scaled_grouped_mm (FP8, 1x128 / 128x128 block scales)",
                       point_labels(block),
                       {"vs loop of torch._scaled_mm": [r["gemmt_vs_torch_loop"] for r in block],
                        "vs gemmt row scales": [r["gemmt_vs_gemmt_rowwise"] for r in block],
                        "vs gemmt bf16 grouped_mm": [r["gemmt_vs_gemmt_bf16"] for r in block]},
                       "other time / gemmt time"))
    layer = [r for r in recs if r["section"] == "layer" and "gemmt_vs_torch" in r]
    if layer:
        panels.append(("MoE layer: gemmt.nn.MoE vs torch._grouped_mm layer",
                       [f"{r['config']} T={r['tokens']} {r['phase']}" for r in layer],
                       {"vs torch": [r["gemmt_vs_torch"] for r in layer]},
                       "torch time / gemmt time"))
    models = [r for r in recs if r["section"] == "models" and r.get("impl") not in (None, "gemmt")]
    if models:
        labels = sorted({f"{r['model']} {r['phase']}" for r in models})
        impls = sorted({r["impl"] for r in models})
        by = {(f"{r['model']} {r['phase']}", r["impl"]): r["gemmt_vs_impl"] for r in models}
        panels.append(("transformers models: \"gemmt\" experts vs others", labels,
                       {impl: [by.get((lab, impl)) for lab in labels] for impl in impls},
                       "other time / gemmt time"))
    kit.plot_panels(panels, f"MoE on {doc['environment']['device_name']}", path)


def readme(doc: dict[str, Any]) -> str:
    """A README draft for the results folder: what ran, and the summary as tables."""
    env, summ = doc["environment"], doc["summary"]
    lines = [f"# `python -m gemmt bench moe` on the {env['device_name']}", "",
             f"Run with `{doc['command']}`, torch {env['torch_version']}, CUDA "
             f"{env['cuda_version']}, {env['date'][:10]}. Ratios: the other's time / gemmt's "
             f"(above 1: gemmt faster); n/a: a side failed (see the JSON's errors)."]
    f = kit.fmt
    refs = summ.get("references")
    if refs:
        lines += ["", f"Measured in the same run: dense bf16 {f(refs['dense_bf16_tflops'], '.1f')} "
                      f"TFLOP/s, copy {f(refs['copy_gbps'], '.0f')} GB/s."]
    lines.append("")

    def med_worst(s: dict[str, Any], key: str) -> str:
        return f"{f(s[key]['median'])} ({f(s[key]['worst'])})"

    if "grouped" in summ:
        lines += kit.md_table(
            ["layout / routing", "points", "vs torch._grouped_mm: median (worst)",
             "vs loop: median (worst)", "roofline fraction: gemmt median (torch)"],
            [[key, str(s["gemmt_vs_torch"]["points"]), med_worst(s, "gemmt_vs_torch"),
              med_worst(s, "gemmt_vs_loop"),
              f"{f(s['gemmt_roofline_fraction']['median'])} "
              f"({f(s['torch_roofline_fraction']['median'])})"]
             for key, s in summ["grouped"].items()])
    if "scaled" in summ:
        lines += kit.md_table(
            ["FP8 layout / routing", "points", "vs torch._scaled_grouped_mm: median (worst)",
             "vs gemmt bf16: median (worst)", "torch FP8 vs torch bf16: median"],
            [[key, str(s["gemmt_vs_torch"]["points"]), med_worst(s, "gemmt_vs_torch"),
              med_worst(s, "gemmt_vs_gemmt_bf16"), f(s["torch_vs_torch_bf16"]["median"])]
             for key, s in summ["scaled"].items()])
    if "scaled_block" in summ:
        lines += kit.md_table(
            ["FP8 block scales: layout / routing", "points",
             "vs loop of torch._scaled_mm: median (worst)", "vs gemmt row scales: median",
             "vs gemmt bf16: median"],
            [[key, str(s["gemmt_vs_torch_loop"]["points"]), med_worst(s, "gemmt_vs_torch_loop"),
              f(s["gemmt_vs_gemmt_rowwise"]["median"]), f(s["gemmt_vs_gemmt_bf16"]["median"])]
             for key, s in summ["scaled_block"].items()])
    if "layer" in summ:
        lines += kit.md_table(
            ["MoE layer", "gemmt ms", "torch ms", "torch / gemmt"],
            [[key, f(s["gemmt_ms"]), f(s["torch_ms"]), f(s["gemmt_vs_torch"])]
             for key, s in summ["layer"].items()])
    if "models" in summ:
        rows = []
        for key, impls in summ["models"].items():
            if key == "error":
                rows.append([str(impls), "", "", ""])
                continue
            for impl, s in impls.items():
                note = f" ({s['error']})" if s["error"] else ""
                rows.append([key, impl + note, f(s["ms"]), f(s["gemmt_vs_impl"])])
        lines += kit.md_table(["model / phase", "implementation", "ms", "its time / gemmt's"], rows)
    return "\n".join(lines) + "\n"


def run(out_dir: Path, quick: bool = False, smoke: bool = False,
        sections: str = ",".join(SECTIONS), device: str | None = None) -> int:
    """Entry point of ``python -m gemmt bench moe``; returns an exit code."""
    started = kit.start("moe", sections, SECTIONS, smoke, device)
    if isinstance(started, int):
        return started
    wanted, device, env = started
    if smoke:
        timing: dict[str, Any] = {"rounds": 3, "warmup": 1, "min_rounds": 3, "budget_s": 0.5}
    else:
        timing = {"rounds": 10 if quick else 15, "warmup": 2, "budget_s": 1.0 if quick else 2.0}
    records: list[dict[str, Any]] = []
    refs = None
    if "grouped" in wanted:
        refs = measure_references(device, smoke, timing)
        configs = SMOKE_GROUPED if smoke else QUICK_GROUPED if quick else GROUPED
        records += run_grouped(device, configs, refs, timing)
    if "scaled" in wanted:
        configs = SMOKE_GROUPED if smoke else QUICK_GROUPED if quick else GROUPED
        records += run_scaled(device, configs, timing)
    if "scaled_block" in wanted:
        configs = SMOKE_BLOCK if smoke else QUICK_GROUPED if quick else GROUPED
        records += run_scaled_block(device, configs, timing)
    if "layer" in wanted:
        configs_l = SMOKE_LAYERS if smoke else LAYERS
        tokens = SMOKE_LAYER_TOKENS if smoke else QUICK_LAYER_TOKENS if quick else LAYER_TOKENS
        records += run_layer(device, configs_l, tokens, timing)
    if "models" in wanted:
        records += run_models(device, smoke, {**timing, "rounds": 3 if smoke or quick else 5,
                                              "min_rounds": 3})
    summary = summarize(records, refs)
    size = "smoke" if smoke else "quick" if quick else "full"
    command = "python -m gemmt bench moe" + (f" --{size}" if size != "full" else "") + (
        f" --only {','.join(wanted)}" if set(wanted) != set(SECTIONS) else "")
    extra = {"size": size, "sections": wanted, "command": command, "device": device,
             "references": refs, "zipf_exponent": ZIPF_EXPONENT, "summary": summary}
    path = _write(out_dir, "moe", env, records, extra)
    doc = {"environment": env, "records": records, "summary": summary, "command": command}
    kit.finish(path, lambda p: plot(doc, p), readme(doc))
    print(readme(doc))
    return 0
