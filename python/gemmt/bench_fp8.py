"""``python -m gemmt bench fp8``: FP8 products, quantisation, decode and a training step
against PyTorch, in the same run.

Sections (``--only``, comma separated; all by default):

* ``gemm``: ``torch.ops.gemmt.scaled_mm`` against ``torch._scaled_mm`` on the same operands
  and scales, for each scaling mode (tensorwise, rowwise, blockwise 1x128 x 128x128), on
  the three products of Llama / Mistral Linear layers (N, K) in (4096, 4096), (6144, 4096),
  (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672) at 2048, 4096
  and 8192 tokens: forward ``x @ W.T`` (M=T, N, K), grad_input ``g @ W`` (M=T, N=K, K=N)
  and grad_weight ``g.T @ x`` (M=N, N=K, K=T). Every operand is K-major as
  ``torch._scaled_mm`` requires (``a`` row-major, ``b`` column-major). The bf16 products
  of the same operands (``torch.matmul`` and ``gemmt.mm``) give the FP8 speed-up. The
  forward 8192x28672x8192 product is flagged ``headline``.
* ``quant``: ``quantize_fp8`` and ``quantize_fp8_with_transpose`` per granularity on an
  8192x8192 bf16 tensor, as bandwidth against a device copy of the same tensor and against
  the same quantisation written as eager torch ops.
* ``decode``: 1..64 tokens through a few weights, rowwise and tensorwise: gemmt
  ``scaled_mm`` against ``torch._scaled_mm``, and against the bf16 products (``gemmt.mm``,
  ``torch.matmul``). Enough copies of each weight are used in turn (more bytes than twice
  the L2 cache) that every call reads its weight from HBM; the weight's bytes over the time
  are set against a device copy's bandwidth (bytes read plus written, far past the L2).
* ``train``: one forward + backward step (no optimizer) of four MLP blocks
  (4096 -> 14336 -> 4096, SiLU, residual; 8192 tokens; bf16 master weights): bf16 eager,
  ``gemmt.nn.convert_to_float8`` per recipe, eager and (tensorwise, rowwise, on CUDA) under
  ``torch.compile``, and torchao's ``Float8Linear`` (tensorwise and rowwise recipes, under
  ``torch.compile``) when torchao imports.
* ``model``: a Llama-shaped ``transformers.LlamaForCausalLM`` (hidden 4096, intermediate
  14336, 4 layers, 32 heads, 8 KV heads, vocabulary 32000, bf16, random weights from seed 0)
  converted by ``gemmt.nn.convert_to_float8`` per recipe (tensorwise, rowwise; every
  eligible Linear, lm_head included; the counts are recorded), against the same model in bf16
  torch: prefill (4 x 1024 tokens) and decode (16 sequences x 1 token, no cache) with
  ``inference=True``, timed as CUDA-graph replays in alternating rounds (single calls under
  CUDA events when a capture fails), with the logits' relative error against the bf16
  model's, held to :data:`LOGITS_TOLERANCE_FACTOR` (16) times the bf16 model's own error
  against float32 on the same ids (recorded, never failing the run); and a training step (2 x 2048 tokens, language-model
  loss, backward, no optimizer; ``inference=False``, bf16 master weights) timed with events
  around single steps (host included) in alternating rounds, the GPU's busy time from the
  profiler beside it. Needs ``transformers`` (skipped with a message without it).

Timing: CUDA events, warm-up, medians over rounds that alternate between the candidates
(see :mod:`gemmt._bench_kit`). Operands are random (``randn``), quantised by eager torch
ops so that both libraries read identical bytes. Ratios are the reference's time over
gemmt's (above 1: gemmt faster; for TFLOP/s the same number reads gemmt's rate over
torch's); a candidate that refuses (a mode this torch lacks, a kernel not built) is
recorded with its error and its ratios are null. ``--quick`` runs 8192 tokens only, fewer
decode points (the model keeps its four layers); ``--smoke`` runs tiny sizes, on the CPU
when there is no GPU (this checks the code paths; its times mean nothing).

Writes ``<out>/fp8_<gpu>_<date>.json``, a ``.png`` beside it (with matplotlib) and a
``.md`` README draft.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import gemmt
from gemmt import _bench_kit as kit
from gemmt._report import progress as _progress
from gemmt._report import write as _write

SECTIONS = ("gemm", "quant", "decode", "train", "model")
MODES = ("tensorwise", "rowwise", "blockwise")
LAYOUTS = ("forward", "grad_input", "grad_weight")
# (out_features N, in_features K) of Llama / Mistral 7-8B and 70B Linear layers.
LAYERS = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (8192, 8192),
          (28672, 8192), (8192, 28672)]
TOKENS = [2048, 4096, 8192]
HEADLINE = (8192, 28672, 8192)  # (M, N, K) of the forward product flagged in the summary
QUANT_SHAPE = (8192, 8192)
GRANULARITIES = ("tensor", "row", "block", "block_128x128")
DECODE_WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192)]
DECODE_TOKENS = [1, 2, 4, 8, 16, 32, 64]
DECODE_MODES = ("rowwise", "tensorwise")
TRAIN = {"dim": 4096, "hidden": 14336, "tokens": 8192, "blocks": 4}
TRAIN_RECIPES = ("tensorwise", "rowwise", "blockwise")
TORCHAO_RECIPES = ("tensorwise", "rowwise")
# The model section's Llama-shaped model (Llama 3 8B's layer shapes, four layers, Llama 2's
# vocabulary) and its three phases: (batch, tokens per sequence), and the speed-up over the
# bf16 torch model that each phase's target asks for.
MODEL = {"hidden": 4096, "intermediate": 14336, "layers": 4, "heads": 32, "kv_heads": 8,
         "vocab": 32000, "prefill": (4, 1024), "decode": (16, 1), "train": (2, 2048)}
MODEL_RECIPES = ("tensorwise", "rowwise")
MODEL_TARGETS = {"prefill": 1.5, "decode": 1.6, "train_step": 1.3}
# lm_head (4096 -> 32000) is converted like every other eligible Linear: the library's
# default, what ``convert_to_float8(model)`` gives a user. Its FP8 product feeds the logits
# directly (its share of the logits' error is small beside the layers': see
# LOGITS_TOLERANCE_FACTOR).
MODEL_LM_HEAD_FP8 = True
# The bound the FP8 models' logits are held to, ||logits - bf16 logits|| / ||bf16 logits||:
# this factor times the bf16 model's own relative error against the same model in float32 on
# the same ids. 16 is e4m3's unit roundoff over bf16's (2^-4 / 2^-8, 3 mantissa bits against
# 7): FP8 rounding of the products' operands in place of bf16 rounding, grown through the
# layers as the model grows bf16's. A fixed bound would not hold: a random-weight model grows
# rounding errors with its depth and width (one e4m3 product of random operands is 3.7% off;
# this model's FP8 logits, on the CPU reference, 15% off in decode and 26% in a 1024-token
# prefill, 11-13x its bf16 error of 1.2% / 2.3%). A path twice as coarse (e5m2's 2 mantissa
# bits) or broken (a lost scale: near 100%) lands outside.
LOGITS_TOLERANCE_FACTOR = 16.0
# The same accumulation request for both libraries: torch's default, unless --fast-accum.
FAST_ACCUM = False

# Tiny sizes of --smoke: in every layout K is a multiple of 512 and N of 128. torch 2.11's
# CUDA blockwise product reads the 128x128 scale of b as if its K / 128 extent were padded to
# a multiple of 4 (it does not check the strides): with K / 128 of 1-3 and two or more column
# blocks its result is garbage (measured relative differences of 58 to inf against bf16).
SMOKE_LAYERS = [(512, 1024), (1024, 512)]
SMOKE_TOKENS = [512]
SMOKE_QUANT_SHAPE = (256, 384)
SMOKE_DECODE_WEIGHTS = [(256, 128)]
SMOKE_DECODE_TOKENS = [1, 16]
SMOKE_TRAIN = {"dim": 128, "hidden": 256, "tokens": 128, "blocks": 4}
# A vocabulary of 1000 is not a multiple of 16: lm_head stays bf16 there (recorded as such).
SMOKE_MODEL = {"hidden": 256, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2,
               "vocab": 1000, "prefill": (2, 64), "decode": (4, 1), "train": (2, 64)}

_E4M3 = torch.float8_e4m3fn
_BF16 = torch.bfloat16
# Granularity of a (the activations side) and of b (the weight side, quantised as (N, K))
# per scaling mode: torch._scaled_mm's pairings.
_GRAN = {"tensorwise": ("tensor", "tensor"), "rowwise": ("row", "row"),
         "blockwise": ("block", "block_128x128")}


# ---- operands ---------------------------------------------------------------------------
def quantize_eager(x: torch.Tensor, granularity: str, dtype: torch.dtype = _E4M3
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8`` written as eager torch ops (the dimensions multiples of 128 for the
    block granularities): the quantised tensor and its dequantisation scale, in the shapes
    and layouts docs/fp8.md gives ("block": (M, K/128) column-major, the layout
    ``torch._scaled_mm`` reads; "block_128x128": (M/128, K/128) contiguous)."""
    fmax = torch.finfo(dtype).max
    m, k = x.shape
    xf = x.float()
    if granularity == "tensor":
        amax = xf.abs().amax()
    elif granularity == "row":
        amax = xf.abs().amax(dim=1, keepdim=True)
    elif granularity == "block":
        amax = xf.abs().view(m, k // 128, 128).amax(dim=2)
    elif granularity == "block_128x128":
        amax = xf.abs().view(m // 128, 128, k // 128, 128).amax(dim=(1, 3))
    else:
        raise ValueError(f"bench fp8: unknown granularity {granularity!r}")
    # As torchao's amax_to_scale: the factor in float64, rounded to float32 (a float32
    # scalar / tensor division is a reciprocal and a product, not correctly rounded).
    factor = (fmax / amax.double().clamp(min=1e-12)).float()
    if granularity == "block":
        q = (xf.view(m, k // 128, 128) * factor[..., None]).view(m, k)
    elif granularity == "block_128x128":
        q = (xf.view(m // 128, 128, k // 128, 128) * factor[:, None, :, None]).view(m, k)
    else:
        q = xf * factor
    q = q.clamp(-fmax, fmax).to(dtype)
    scale = (1.0 / factor.double()).float()
    if granularity == "block":
        scale = scale.t().contiguous().t()  # column-major, strides (1, M)
    return q, scale


class _Fp8Product:
    """``a @ b`` for one scaling mode: ``a`` (M, K) row-major, ``b`` (K, N) column-major (the
    transpose of a row-major (N, K) tensor), both e4m3, with torch._scaled_mm's scales."""

    def __init__(self, a_hp: torch.Tensor, bt_hp: torch.Tensor, mode: str,
                 fast_accum: bool = FAST_ACCUM) -> None:
        ga, gb = _GRAN[mode]
        self.fast_accum = fast_accum
        self.a, self.scale_a = quantize_eager(a_hp, ga)
        bq, bs = quantize_eager(bt_hp, gb)
        self.b = bq.t()
        # The weight side's scale, transposed: (1, N) rowwise, (K/128, N/128) blockwise,
        # the transpose of a contiguous (N/128, K/128) tensor, as torch's kernels read it.
        self.scale_b = bs if bs.dim() == 0 else bs.t()

    def gemmt(self) -> torch.Tensor:
        return torch.ops.gemmt.scaled_mm(self.a, self.b, self.scale_a, self.scale_b, None, _BF16,
                                         "none", self.fast_accum)

    def torch(self) -> torch.Tensor:
        return torch._scaled_mm(self.a, self.b, scale_a=self.scale_a, scale_b=self.scale_b,
                                out_dtype=_BF16, use_fast_accum=self.fast_accum)


def _product_dims(layout: str, tokens: int, n: int, k: int) -> tuple[int, int, int]:
    """(M, N, K) of one product of a Linear (out N, in K) over ``tokens`` rows."""
    if layout == "forward":
        return tokens, n, k
    if layout == "grad_input":
        return tokens, k, n
    return n, k, tokens


# ---- gemm ---------------------------------------------------------------------------------
def run_gemm(device: str, layers: list[tuple[int, int]], tokens: list[int],
             timing: dict[str, Any], fast_accum: bool = FAST_ACCUM) -> list[dict[str, Any]]:
    records = []
    points = [(t, n, k, layout) for t in tokens for (n, k) in layers for layout in LAYOUTS]
    for t, n, k, layout in _progress(points, "fp8 gemm"):
        m, pn, pk = _product_dims(layout, t, n, k)
        flops = 2.0 * m * pn * pk
        a_hp = torch.randn(m, pk, device=device, dtype=_BF16)
        bt_hp = torch.randn(pn, pk, device=device, dtype=_BF16).mul_(pk ** -0.5)
        b_hp = bt_hp.t()
        bf16_ms, bf16_err = kit.time_candidates(
            {"torch_bf16": lambda: torch.matmul(a_hp, b_hp),
             "gemmt_bf16": lambda: gemmt.mm(a_hp, b_hp)}, device, **timing)
        ref_bf16 = torch.matmul(a_hp, b_hp)
        for mode in MODES:
            prod = _Fp8Product(a_hp, bt_hp, mode, fast_accum)
            ms, err = kit.time_candidates({"gemmt": prod.gemmt, "torch": prod.torch}, device,
                                          **timing)
            out_g, _ = kit.attempt(prod.gemmt, device) if ms["gemmt"] is not None else (None, None)
            out_t, _ = kit.attempt(prod.torch, device) if ms["torch"] is not None else (None, None)
            rec: dict[str, Any] = dict(
                section="gemm", mode=mode, layout=layout, tokens=t, out_features=n,
                in_features=k, m=m, n=pn, k=pk, headline=(layout == "forward"
                                                          and (m, pn, pk) == HEADLINE),
                use_fast_accum=fast_accum, gemmt_ms=ms["gemmt"], torch_ms=ms["torch"],
                torch_bf16_ms=bf16_ms["torch_bf16"], gemmt_bf16_ms=bf16_ms["gemmt_bf16"],
                gemmt_tflops=kit.tflops(flops, ms["gemmt"]),
                torch_tflops=kit.tflops(flops, ms["torch"]),
                torch_bf16_tflops=kit.tflops(flops, bf16_ms["torch_bf16"]),
                gemmt_bf16_tflops=kit.tflops(flops, bf16_ms["gemmt_bf16"]),
                gemmt_vs_torch=kit.ratio(ms["torch"], ms["gemmt"]),
                gemmt_fp8_vs_gemmt_bf16=kit.ratio(bf16_ms["gemmt_bf16"], ms["gemmt"]),
                torch_fp8_vs_torch_bf16=kit.ratio(bf16_ms["torch_bf16"], ms["torch"]),
                gemmt_fp8_vs_torch_bf16=kit.ratio(bf16_ms["torch_bf16"], ms["gemmt"]),
                gemmt_error=err.get("gemmt"), torch_error=err.get("torch"),
                torch_bf16_error=bf16_err.get("torch_bf16"),
                gemmt_bf16_error=bf16_err.get("gemmt_bf16"),
                torch_supported="torch" not in err,
                torch_status="ok" if "torch" not in err else "unsupported",
                rel_diff_vs_torch=(kit.rel_diff(out_g, out_t)
                                   if out_g is not None and out_t is not None else None),
                rel_diff_vs_bf16=kit.rel_diff(out_g, ref_bf16) if out_g is not None else None)
            records.append(rec)
            del prod, out_g, out_t
        del a_hp, bt_hp, b_hp, ref_bf16
    return records


# ---- quant --------------------------------------------------------------------------------
def run_quant(device: str, shape: tuple[int, int], timing: dict[str, Any]
              ) -> list[dict[str, Any]]:
    rows, cols = shape
    x = torch.randn(rows, cols, device=device, dtype=_BF16)
    dst = torch.empty_like(x)
    copy_ms, copy_err = kit.time_candidates({"copy": lambda: dst.copy_(x)}, device, **timing)
    copy_bytes = 2 * x.numel() * x.element_size()
    copy_gbps = (copy_bytes / copy_ms["copy"] / 1e6) if copy_ms["copy"] else None
    records = []
    points = [(op, g) for op in ("quantize_fp8", "quantize_fp8_with_transpose")
              for g in GRANULARITIES]
    for op, gran in _progress(points, "fp8 quant"):
        with_t = op == "quantize_fp8_with_transpose"
        blocks = {"tensor": 1, "row": rows, "block": rows * math.ceil(cols / 128),
                  "block_128x128": math.ceil(rows / 128) * math.ceil(cols / 128)}[gran]
        # The least traffic: read x once, write each float8 output once, and the scales.
        nbytes = x.numel() * (x.element_size() + (2 if with_t else 1)) + 4 * blocks * (
            2 if with_t else 1)

        def ours(gran: str = gran, with_t: bool = with_t) -> object:
            if with_t:
                return torch.ops.gemmt.quantize_fp8_with_transpose(x, gran, _E4M3)
            return torch.ops.gemmt.quantize_fp8(x, gran, _E4M3)

        def eager(gran: str = gran, with_t: bool = with_t) -> object:
            q = quantize_eager(x, gran)
            return (q, quantize_eager(x.t().contiguous(), gran)) if with_t else q

        ms, err = kit.time_candidates({"gemmt": ours, "torch_eager": eager}, device, **timing)
        agree = same = None
        if ms["gemmt"] is not None:
            q, s = ours()[:2]  # type: ignore[index]
            qe, se = quantize_eager(x, gran)
            agree = kit.rel_diff(q.float() * _expand(s, q.shape), qe.float() * _expand(se, q.shape))
            same = bool(torch.equal(q.view(torch.uint8), qe.view(torch.uint8))
                        and torch.equal(s, se))
        gbps = nbytes / ms["gemmt"] / 1e6 if ms["gemmt"] else None
        records.append(dict(
            section="quant", op=op, granularity=gran, rows=rows, cols=cols, bytes=nbytes,
            gemmt_ms=ms["gemmt"], torch_eager_ms=ms["torch_eager"], copy_ms=copy_ms["copy"],
            copy_bytes=copy_bytes, gemmt_gbps=gbps, copy_gbps=copy_gbps,
            gemmt_vs_copy_bandwidth=kit.ratio(gbps, copy_gbps),
            gemmt_vs_torch_eager=kit.ratio(ms["torch_eager"], ms["gemmt"]),
            gemmt_error=err.get("gemmt"), torch_eager_error=err.get("torch_eager"),
            copy_error=copy_err.get("copy"), dequantized_rel_diff_vs_eager=agree,
            bitwise_equal_to_eager=same))
    return records


def _expand(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A dequantisation scale broadcast to the quantised tensor's shape."""
    rows, cols = shape
    if scale.dim() == 0 or scale.shape[1] == 1:
        return scale
    if scale.shape[0] == rows:  # 1x128 blocks along the columns
        return scale.repeat_interleave(128, dim=1)[:, :cols]
    return scale.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:rows, :cols]


# ---- decode -------------------------------------------------------------------------------
def copy_bandwidth(device: str, nbytes: int, timing: dict[str, Any]) -> float | None:
    """GB/s of a device copy of `nbytes` (bytes read plus bytes written over the time): the
    bandwidth a product that streams its weight from memory can hope to reach."""
    src = torch.empty(nbytes // 2, device=device, dtype=_BF16).normal_()
    dst = torch.empty_like(src)
    ms, _ = kit.time_candidates({"copy": lambda: dst.copy_(src)}, device, **timing)
    return 2 * nbytes / ms["copy"] / 1e6 if ms["copy"] else None


def run_decode(device: str, weights: list[tuple[int, int]], tokens: list[int],
               timing: dict[str, Any], fast_accum: bool = FAST_ACCUM) -> list[dict[str, Any]]:
    records = []
    l2 = kit.l2_bytes(device)
    # Far past the L2 (both buffers), so that the copy runs at the memory's bandwidth.
    copy_gbps = copy_bandwidth(device, max(4 * l2, 64 << 20), timing)
    for n, k in _progress(weights, "fp8 decode"):
        copies = max(2, math.ceil(2 * l2 / (n * k)))  # float8 bytes past twice the L2
        ws = [torch.randn(n, k, device=device, dtype=_BF16).mul_(k ** -0.5) for _ in range(copies)]
        wq = {mode: [quantize_eager(w, _GRAN[mode][1]) for w in ws] for mode in DECODE_MODES}
        for m in tokens:
            x = torch.randn(m, k, device=device, dtype=_BF16)
            xq = {mode: quantize_eager(x, _GRAN[mode][0]) for mode in DECODE_MODES}
            cands: dict[str, Callable[[], object]] = {
                "gemmt_bf16": lambda: [gemmt.mm(x, w.t()) for w in ws],
                "torch_bf16": lambda: [torch.matmul(x, w.t()) for w in ws]}
            for mode in DECODE_MODES:
                (aq, sa), wl = xq[mode], wq[mode]
                cands[f"gemmt_{mode}"] = lambda aq=aq, sa=sa, wl=wl: [
                    torch.ops.gemmt.scaled_mm(aq, q.t(), sa, s if s.dim() == 0 else s.t(), None,
                                              _BF16, "none", fast_accum) for q, s in wl]
                cands[f"torch_{mode}"] = lambda aq=aq, sa=sa, wl=wl: [
                    torch._scaled_mm(aq, q.t(), scale_a=sa, scale_b=s if s.dim() == 0 else s.t(),
                                     out_dtype=_BF16, use_fast_accum=fast_accum)
                    for q, s in wl]
            ms, err = kit.time_candidates(cands, device, **timing)
            us = {name: (v * 1e3 / copies if v is not None else None) for name, v in ms.items()}
            for mode in DECODE_MODES:
                g, t = us[f"gemmt_{mode}"], us[f"torch_{mode}"]
                records.append(dict(
                    section="decode", mode=mode, tokens=m, out_features=n, in_features=k,
                    weight_copies=copies, gemmt_us=g, torch_us=t,
                    gemmt_bf16_us=us["gemmt_bf16"], torch_bf16_us=us["torch_bf16"],
                    gemmt_vs_torch=kit.ratio(t, g),
                    gemmt_fp8_vs_gemmt_bf16=kit.ratio(us["gemmt_bf16"], g),
                    gemmt_fp8_vs_torch_bf16=kit.ratio(us["torch_bf16"], g),
                    gemmt_weight_gbps=(n * k / g / 1e3) if g else None,
                    gemmt_bf16_weight_gbps=(2 * n * k / us["gemmt_bf16"] / 1e3
                                            if us["gemmt_bf16"] else None),
                    copy_gbps=copy_gbps,
                    gemmt_vs_copy_bandwidth=kit.ratio((n * k / g / 1e3) if g else None,
                                                      copy_gbps),
                    gemmt_error=err.get(f"gemmt_{mode}"), torch_error=err.get(f"torch_{mode}"),
                    gemmt_bf16_error=err.get("gemmt_bf16"), torch_bf16_error=err.get("torch_bf16")))
        del ws, wq
        if device == "cuda":
            torch.cuda.empty_cache()
    return records


# ---- train --------------------------------------------------------------------------------
class _Block(torch.nn.Module):
    """``x + down(silu(up(x)))``: one MLP block with a residual, bias-free Linears."""

    def __init__(self, dim: int, hidden: int, device: str) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden, bias=False, device=device, dtype=_BF16)
        self.down = torch.nn.Linear(hidden, dim, bias=False, device=device, dtype=_BF16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


def _torchao_model(base: torch.nn.Module, recipe: str) -> torch.nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = copy.deepcopy(base)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return torch.compile(model)


def train_step(model: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    """One training step of ``model`` on ``x`` (no optimizer): the gradients of the parameters
    and of ``x`` cleared, the forward, the backward of ``g``."""
    params = [*model.parameters(), x]

    def run() -> None:
        for p in params:
            p.grad = None
        model(x).backward(g)
    return run


def run_train(device: str, shape: dict[str, int], timing: dict[str, Any]
              ) -> list[dict[str, Any]]:
    dim, hidden, tokens, blocks = shape["dim"], shape["hidden"], shape["tokens"], shape["blocks"]
    base = torch.nn.Sequential(*[_Block(dim, hidden, device) for _ in range(blocks)])
    # The input requires grad, as a block's input inside a model does: all three products
    # of every Linear run.
    x = torch.randn(tokens, dim, device=device, dtype=_BF16, requires_grad=True)
    g = torch.randn(tokens, dim, device=device, dtype=_BF16)
    builders: dict[str, Callable[[], torch.nn.Module]] = {"bf16_eager": lambda: base}
    for recipe in TRAIN_RECIPES:
        builders[f"gemmt_{recipe}"] = lambda recipe=recipe: gemmt.nn.convert_to_float8(
            copy.deepcopy(base), recipe=recipe)
    # Compiled as torchao's side is: inductor fuses the SiLU, its backward and the residual
    # adds around gemmt's ops, which it calls as they are (on CUDA only: the CPU runs the
    # smoke size, where a C++ compilation would only cost time).
    for recipe in TORCHAO_RECIPES if device == "cuda" else ():
        builders[f"gemmt_{recipe}_compiled"] = lambda recipe=recipe: torch.compile(
            gemmt.nn.convert_to_float8(copy.deepcopy(base), recipe=recipe))
    try:
        import torchao.float8  # noqa: F401
        torchao_absent = None
    except Exception as exc:  # noqa: BLE001 - any failure to import means "absent"
        torchao_absent = f"torchao absent: {kit.error_text(exc)}"
    for recipe in TORCHAO_RECIPES:
        builders[f"torchao_{recipe}_compiled"] = lambda recipe=recipe: _torchao_model(base, recipe)

    models: dict[str, torch.nn.Module] = {}
    build_errors: dict[str, str] = {}
    for name, build in builders.items():
        if name.startswith("torchao") and torchao_absent:
            build_errors[name] = torchao_absent
            continue
        model, err = kit.attempt(build, device)
        if err is None:
            models[name] = model
        else:
            build_errors[name] = err

    with torch.no_grad():
        ref_out = base(x)
    outs: dict[str, float | None] = {}
    for name, model in list(models.items()):
        with torch.no_grad():
            out, err = kit.attempt(lambda model=model: model(x), device)
        outs[name] = kit.rel_diff(out, ref_out) if out is not None else None
        if err is not None:
            build_errors[name] = err
            del models[name]
    steps = {name: train_step(m, x, g) for name, m in models.items()}
    ms, err = kit.time_candidates(steps, device,
                                  **{**timing, "queued": False})
    base_ms = ms.get("bf16_eager")
    flops = 3 * 2.0 * tokens * dim * hidden * 2 * blocks  # forward + two backward products
    records = []
    for name in builders:
        t = ms.get(name)
        recipe = name.split("_")[1]
        torchao_ms = ms.get(f"torchao_{recipe}_compiled")
        records.append(dict(
            section="train", variant=name, dim=dim, hidden=hidden, tokens=tokens, blocks=blocks,
            step_ms=t, tflops=kit.tflops(flops, t), vs_bf16=kit.ratio(base_ms, t),
            gemmt_vs_torchao=(kit.ratio(torchao_ms, t) if name.startswith("gemmt_") else None),
            output_rel_diff_vs_bf16=outs.get(name),
            error=build_errors.get(name) or err.get(name)))
    del models, base
    return records


# ---- model --------------------------------------------------------------------------------
MODEL_PHASES = ("prefill", "decode", "train_step")


def _has_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


def llama_model(shape: dict[str, Any], device: str) -> torch.nn.Module:
    """A ``transformers.LlamaForCausalLM`` of ``shape`` (:data:`MODEL`'s keys) in bf16 on
    ``device``, random weights from seed 0, nothing downloaded. Needs ``transformers``."""
    import transformers

    longest = max(shape["prefill"][1], shape["train"][1])
    cfg = transformers.LlamaConfig(
        hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], vocab_size=shape["vocab"],
        max_position_embeddings=max(4096, longest))
    torch.manual_seed(0)
    # Initialised where it runs: a float32 initialisation of a billion parameters on the host
    # takes longer than the whole section's timing.
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype=_BF16)


def _convert_model(ref: torch.nn.Module, recipe: str, inference: bool) -> torch.nn.Module:
    """A copy of ``ref`` with its Linears converted by ``gemmt.nn.convert_to_float8``."""
    include = None if MODEL_LM_HEAD_FP8 else (lambda name, _mod: name != "lm_head")
    return gemmt.nn.convert_to_float8(copy.deepcopy(ref), recipe=recipe, inference=inference,
                                      include=include)


_CONVERSION_KEYS = ("linears_total", "converted_linears", "unconverted_linears", "lm_head_fp8")


def _conversion(model: torch.nn.Module) -> dict[str, Any]:
    """Which Linear layers of ``model`` run in FP8: counts, and the names of those that do
    not (convert_to_float8 leaves a layer whose sizes are not multiples of 16)."""
    linears = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear)]
    kept = [name for name, mod in linears if not isinstance(mod, gemmt.nn.Float8Linear)]
    out = (len(linears), len(linears) - len(kept), kept, "lm_head" not in kept)
    return dict(zip(_CONVERSION_KEYS, out))


def _infer(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _train_step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Forward with the language-model loss and backward; no optimizer."""
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach()


def _model_inference(model: torch.nn.Module, ref: torch.nn.Module, ids: torch.Tensor,
                     ref_logits: torch.Tensor, logits32: torch.Tensor, tolerance: float,
                     device: str, timing: dict[str, int]) -> dict[str, Any]:
    """The converted model's logits against the bf16 and float32 references (``tolerance``:
    the bound on the first), and one forward of each model timed in alternating rounds
    (kit.paired_calls_ms)."""
    logits = _infer(model, ids)
    err = kit.rel_diff(logits, ref_logits)
    err32 = kit.rel_diff(logits, logits32)
    del logits
    ours_ms, ref_ms, how = kit.paired_calls_ms(
        lambda: _infer(model, ids), lambda: _infer(ref, ids), device, calls=timing["calls"],
        rounds=timing["rounds"], fallback_rounds=timing["fallback_rounds"])
    return dict(ours_ms=ours_ms, ref_ms=ref_ms, ratio=kit.ratio(ref_ms, ours_ms), timing=how,
                logits_rel_err=err, logits_rel_err_vs_fp32=err32,
                logits_within_tolerance=bool(err <= tolerance))


def _model_training(model: torch.nn.Module, ref: torch.nn.Module, ids: torch.Tensor,
                    device: str, timing: dict[str, int]) -> dict[str, Any]:
    """Losses and gradients of one step of each model, then the step timed in alternating
    rounds (kit.paired_steps_ms)."""
    loss, ref_loss = float(_train_step(model, ids)), float(_train_step(ref, ids))
    errs = []
    for (name, p), (ref_name, q) in zip(model.named_parameters(), ref.named_parameters()):
        if name != ref_name:
            raise RuntimeError(f"bench fp8: parameter {name} paired with {ref_name}")
        errs.append(kit.rel_diff(p.grad, q.grad))
    timed = kit.paired_steps_ms(lambda: _train_step(model, ids), lambda: _train_step(ref, ids),
                                device, rounds=timing["train_rounds"], warmup=timing["warmup"])
    return dict(**timed, loss=loss, ref_loss=ref_loss,
                loss_rel_diff=abs(loss - ref_loss) / abs(ref_loss),
                median_grad_rel_err=statistics.median(errs), max_grad_rel_err=max(errs))


def run_model(device: str, shape: dict[str, Any], timing: dict[str, int]
              ) -> list[dict[str, Any]]:
    """A Llama-shaped model converted by ``convert_to_float8`` against the same model in bf16
    torch: prefill and decode (``inference=True``), and a training step (``inference=False``,
    bf16 master weights), per recipe of :data:`MODEL_RECIPES`. A recipe that fails to convert
    or run is recorded with its error."""
    if not _has_transformers():
        print("bench fp8: transformers missing: no model section (pip install transformers)")
        return []
    ref = llama_model(shape, device)
    vocab = shape["vocab"]
    ids = {phase: torch.randint(0, vocab, shape[phase], device=device)
           for phase in ("prefill", "decode", "train")}
    ref_logits = {phase: _infer(ref, ids[phase]) for phase in ("prefill", "decode")}
    # The reference model's own rounding: its bf16 logits against the same weights in
    # float32, the scale against which the FP8 error is read.
    ref32 = copy.deepcopy(ref).float()
    logits32 = {phase: _infer(ref32, ids[phase]) for phase in ("prefill", "decode")}
    del ref32
    ref_err32 = {phase: kit.rel_diff(ref_logits[phase], logits32[phase]) for phase in logits32}
    common = dict(section="model", hidden=shape["hidden"], intermediate=shape["intermediate"],
                  layers=shape["layers"], heads=shape["heads"], kv_heads=shape["kv_heads"],
                  vocab=vocab, logits_tolerance_factor=LOGITS_TOLERANCE_FACTOR)
    measured = ("ours_ms", "ref_ms", "ratio", "timing")
    records = []
    for recipe in _progress(list(MODEL_RECIPES), "fp8 model inference"):
        model, build_err = kit.attempt(lambda recipe=recipe: _convert_model(ref, recipe, True),
                                       device)
        conv = _conversion(model) if model is not None else dict.fromkeys(_CONVERSION_KEYS)
        for phase in ("prefill", "decode"):
            batch, seq = shape[phase]
            rec: dict[str, Any] = dict(
                common, recipe=recipe, phase=phase, inference=True, batch=batch, seq=seq,
                tokens=batch * seq, target_ratio=MODEL_TARGETS[phase], **conv,
                ref_logits_rel_err_vs_fp32=ref_err32[phase],
                logits_tolerance=LOGITS_TOLERANCE_FACTOR * ref_err32[phase],
                **{k: None for k in (*measured, "logits_rel_err", "logits_rel_err_vs_fp32",
                                     "logits_within_tolerance")})
            out, err = (None, build_err) if model is None else kit.attempt(
                lambda rec=rec: _model_inference(
                    model, ref, ids[rec["phase"]], ref_logits[rec["phase"]],
                    logits32[rec["phase"]], rec["logits_tolerance"], device, timing), device)
            rec.update(out or {}, error=err)
            records.append(rec)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    del ref_logits, logits32
    batch, seq = shape["train"]
    for recipe in _progress(list(MODEL_RECIPES), "fp8 model training"):
        model, build_err = kit.attempt(lambda recipe=recipe: _convert_model(ref, recipe, False),
                                       device)
        rec = dict(common, recipe=recipe, phase="train_step", inference=False, batch=batch,
                   seq=seq, tokens=batch * seq, target_ratio=MODEL_TARGETS["train_step"],
                   **(_conversion(model) if model is not None
                      else dict.fromkeys(_CONVERSION_KEYS)),
                   **{k: None for k in (*measured, "loss", "ref_loss", "loss_rel_diff",
                                        "median_grad_rel_err", "max_grad_rel_err")})
        out, err = (None, build_err) if model is None else kit.attempt(
            lambda: _model_training(model, ref, ids["train"], device, timing), device)
        rec.update(out or {}, error=err)
        records.append(rec)
        del model
        ref.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    del ref
    return records


# ---- summary, plot, README ----------------------------------------------------------------
def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: median and worst of each ratio; per recipe and phase of the model: its
    ratio against the target and its logits' error against the bound (the README tables are
    made from this)."""
    out: dict[str, Any] = {}
    gemm = [r for r in records if r["section"] == "gemm"]
    if gemm:
        out["gemm"] = {}
        for mode in MODES:
            rs = [r for r in gemm if r["mode"] == mode]
            head = next((r for r in rs if r["headline"]), None)
            out["gemm"][mode] = {
                "gemmt_vs_torch": kit.stats([r["gemmt_vs_torch"] for r in rs]),
                "gemmt_fp8_vs_gemmt_bf16": kit.stats([r["gemmt_fp8_vs_gemmt_bf16"] for r in rs]),
                "torch_fp8_vs_torch_bf16": kit.stats([r["torch_fp8_vs_torch_bf16"] for r in rs]),
                "gemmt_tflops": kit.stats([r["gemmt_tflops"] for r in rs]),
                "torch_unsupported": sum(not r["torch_supported"] for r in rs),
                "headline": None if head is None else {
                    k: head[k] for k in ("m", "n", "k", "gemmt_tflops", "torch_tflops",
                                         "gemmt_vs_torch", "gemmt_fp8_vs_gemmt_bf16")}}
    quant = [r for r in records if r["section"] == "quant"]
    if quant:
        out["quant"] = {f"{r['op']}/{r['granularity']}": {
            "gemmt_vs_copy_bandwidth": r["gemmt_vs_copy_bandwidth"],
            "gemmt_vs_torch_eager": r["gemmt_vs_torch_eager"]} for r in quant}
    decode = [r for r in records if r["section"] == "decode"]
    if decode:
        out["decode"] = {mode: {
            "gemmt_vs_torch": kit.stats([r["gemmt_vs_torch"] for r in decode if r["mode"] == mode]),
            "gemmt_fp8_vs_gemmt_bf16": kit.stats(
                [r["gemmt_fp8_vs_gemmt_bf16"] for r in decode if r["mode"] == mode]),
            "gemmt_vs_copy_bandwidth": kit.stats(
                [r["gemmt_vs_copy_bandwidth"] for r in decode if r["mode"] == mode])}
            for mode in DECODE_MODES}
    train = [r for r in records if r["section"] == "train"]
    if train:
        out["train"] = {r["variant"]: {"step_ms": r["step_ms"], "vs_bf16": r["vs_bf16"],
                                       "gemmt_vs_torchao": r["gemmt_vs_torchao"],
                                       "error": r["error"]} for r in train}
    model = [r for r in records if r["section"] == "model"]
    if model:
        out["model"] = {f"{r['recipe']}/{r['phase']}": {
            "ours_ms": r["ours_ms"], "ref_ms": r["ref_ms"], "ratio": r["ratio"],
            "target_ratio": r["target_ratio"],
            "meets_target": None if r["ratio"] is None else r["ratio"] >= r["target_ratio"],
            "logits_rel_err": r.get("logits_rel_err"),
            "ref_logits_rel_err_vs_fp32": r.get("ref_logits_rel_err_vs_fp32"),
            "logits_tolerance": r.get("logits_tolerance"),
            "logits_within_tolerance": r.get("logits_within_tolerance"),
            "loss_rel_diff": r.get("loss_rel_diff"),
            "converted_linears": r["converted_linears"], "linears_total": r["linears_total"],
            "error": r["error"]} for r in model}
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    """gemm, decode, quant and train ratios, one panel each."""
    recs = doc["records"]
    panels = []
    gemm = [r for r in recs if r["section"] == "gemm" and r["mode"] == MODES[0]]
    if gemm:
        labels = [f"{r['m']}x{r['n']}x{r['k']} {r['layout'][:6]}" for r in gemm]
        series = {}
        for mode in MODES:
            by = {(r["m"], r["n"], r["k"], r["layout"]): r for r in recs
                  if r["section"] == "gemm" and r["mode"] == mode}
            series[mode] = [by[(r["m"], r["n"], r["k"], r["layout"])]["gemmt_vs_torch"]
                            for r in gemm]
        panels.append(("scaled_mm: gemmt vs torch._scaled_mm", labels, series,
                       "torch time / gemmt time"))
    dec = [r for r in recs if r["section"] == "decode"]
    if dec:
        first = [r for r in dec if r["mode"] == DECODE_MODES[0]]
        labels = [f"{r['out_features']}x{r['in_features']} m={r['tokens']}" for r in first]
        series = {}
        for mode in DECODE_MODES:
            rs = [r for r in dec if r["mode"] == mode]
            series[f"{mode} vs torch fp8"] = [r["gemmt_vs_torch"] for r in rs]
            series[f"{mode} vs gemmt bf16"] = [r["gemmt_fp8_vs_gemmt_bf16"] for r in rs]
            series[f"{mode} fraction of copy bandwidth"] = [r["gemmt_vs_copy_bandwidth"]
                                                            for r in rs]
        panels.append(("FP8 decode (weights from HBM)", labels, series, "other time / gemmt fp8"))
    quant = [r for r in recs if r["section"] == "quant"]
    if quant:
        labels = [("q+t " if r["op"].endswith("transpose") else "q ") + r["granularity"]
                  for r in quant]
        panels.append(("quantisation bandwidth", labels,
                       {"fraction of copy bandwidth": [r["gemmt_vs_copy_bandwidth"] for r in quant],
                        "vs eager torch": [r["gemmt_vs_torch_eager"] for r in quant]},
                       "ratio"))
    train = [r for r in recs if r["section"] == "train"]
    if train:
        panels.append(("MLP training step", [r["variant"] for r in train],
                       {"speed-up over bf16 eager": [r["vs_bf16"] for r in train]},
                       "bf16 time / variant time"))
    model = [r for r in recs if r["section"] == "model"]
    if model:
        panels.append(("Llama-shaped model: converted to FP8 (gemmt) vs bf16 torch",
                       [f"{r['recipe']} {r['phase']}" for r in model],
                       {"speed-up": [r["ratio"] for r in model],
                        "target": [r["target_ratio"] for r in model]},
                       "bf16 torch time / FP8 time"))
    kit.plot_panels(panels, f"FP8 on {doc['environment']['device_name']}", path)


def readme(doc: dict[str, Any]) -> str:
    """A README draft for the results folder: what ran, and the summary as tables."""
    env, summ = doc["environment"], doc["summary"]
    lines = [f"# `python -m gemmt bench fp8` on the {env['device_name']}", "",
             f"Run with `{doc['command']}`, torch {env['torch_version']}, CUDA "
             f"{env['cuda_version']}, {env['date'][:10]}. Ratios: torch time / gemmt time "
             f"(above 1: gemmt faster); n/a: a side refused (see the JSON's errors).", ""]
    f = kit.fmt
    if "gemm" in summ:
        lines += kit.md_table(
            ["mode", "points", "gemmt / torch._scaled_mm: median (worst)", "gemmt TFLOP/s median",
             "FP8 / bf16 (gemmt) median", "torch refused"],
            [[mode, str(s["gemmt_vs_torch"]["points"]),
              f"{f(s['gemmt_vs_torch']['median'])} ({f(s['gemmt_vs_torch']['worst'])})",
              f(s["gemmt_tflops"]["median"], ".0f"), f(s["gemmt_fp8_vs_gemmt_bf16"]["median"]),
              str(s["torch_unsupported"])] for mode, s in summ["gemm"].items()])
    if "decode" in summ:
        lines += kit.md_table(
            ["decode mode", "gemmt / torch fp8: median (worst)",
             "gemmt fp8 / gemmt bf16: median (worst)",
             "weight bandwidth / copy bandwidth: median (worst)"],
            [[mode, f"{f(s['gemmt_vs_torch']['median'])} ({f(s['gemmt_vs_torch']['worst'])})",
              f"{f(s['gemmt_fp8_vs_gemmt_bf16']['median'])} "
              f"({f(s['gemmt_fp8_vs_gemmt_bf16']['worst'])})",
              f"{f(s['gemmt_vs_copy_bandwidth']['median'])} "
              f"({f(s['gemmt_vs_copy_bandwidth']['worst'])})"]
             for mode, s in summ["decode"].items()])
    if "quant" in summ:
        lines += kit.md_table(
            ["quantisation", "fraction of copy bandwidth", "vs eager torch"],
            [[name, f(s["gemmt_vs_copy_bandwidth"]), f(s["gemmt_vs_torch_eager"])]
             for name, s in summ["quant"].items()])
    if "train" in summ:
        lines += kit.md_table(
            ["training step", "ms", "speed-up over bf16", "gemmt / torchao"],
            [[name + (f" ({s['error']})" if s["error"] else ""), f(s["step_ms"], ".2f"),
              f(s["vs_bf16"]), f(s["gemmt_vs_torchao"])] for name, s in summ["train"].items()])
    if "model" in summ:
        def err_cell(s: dict[str, Any]) -> str:
            if s["logits_rel_err"] is None:
                return "loss diff " + f(s["loss_rel_diff"], ".2e")
            within = {True: "within", False: "OUTSIDE", None: "n/a"}[s["logits_within_tolerance"]]
            return (f"{f(s['logits_rel_err'], '.4f')} ({within} "
                    f"{f(s['logits_tolerance'], '.4f')} = {LOGITS_TOLERANCE_FACTOR:g} x bf16's "
                    f"{f(s['ref_logits_rel_err_vs_fp32'], '.4f')} vs fp32)")

        lines += kit.md_table(
            ["model recipe / phase", "FP8 ms", "bf16 torch ms", "speed-up (target)",
             "logits rel. err. vs bf16 (bound)", "FP8 Linears"],
            [[name + (f" ({s['error']})" if s["error"] else ""), f(s["ours_ms"], ".2f"),
              f(s["ref_ms"], ".2f"), f"{f(s['ratio'])} ({s['target_ratio']})", err_cell(s),
              f"{s['converted_linears']} of {s['linears_total']}"]
             for name, s in summ["model"].items()])
    return "\n".join(lines) + "\n"


def run(out_dir: Path, quick: bool = False, smoke: bool = False,
        sections: str = ",".join(SECTIONS), device: str | None = None,
        fast_accum: bool = FAST_ACCUM) -> int:
    """Entry point of ``python -m gemmt bench fp8``; returns an exit code. ``fast_accum``: both
    libraries' products in the gemm and decode sections with the tensor cores' own FP8
    accumulation (``use_fast_accum=True``), as torchao's forward products run."""
    started = kit.start("fp8", sections, SECTIONS, smoke, device)
    if isinstance(started, int):
        return started
    wanted, device, env = started
    if smoke:
        timing: dict[str, Any] = {"rounds": 3, "warmup": 1, "min_rounds": 3, "budget_s": 0.5}
        gemm_args = (SMOKE_LAYERS, SMOKE_TOKENS)
        quant_shape, decode_args, train_shape = SMOKE_QUANT_SHAPE, (
            SMOKE_DECODE_WEIGHTS, SMOKE_DECODE_TOKENS), SMOKE_TRAIN
    else:
        timing = {"rounds": 10 if quick else 15, "warmup": 3, "budget_s": 1.0 if quick else 2.0}
        gemm_args = (LAYERS, [8192] if quick else TOKENS)
        quant_shape = QUANT_SHAPE
        decode_args = (DECODE_WEIGHTS[1::2] if quick else DECODE_WEIGHTS,
                       [1, 8, 64] if quick else DECODE_TOKENS)
        train_shape = TRAIN
    # The model keeps its four layers in --quick: the targets are stated for that model.
    model_shape = SMOKE_MODEL if smoke else MODEL
    model_timing = (dict(calls=1, rounds=2, fallback_rounds=3, train_rounds=3, warmup=1) if smoke
                    else dict(calls=3, rounds=5, fallback_rounds=10, train_rounds=11, warmup=3))
    records: list[dict[str, Any]] = []
    if "gemm" in wanted:
        records += run_gemm(device, *gemm_args, timing, fast_accum)
    if "quant" in wanted:
        records += run_quant(device, quant_shape, timing)
    if "decode" in wanted:
        records += run_decode(device, *decode_args, timing, fast_accum)
    if "train" in wanted:
        records += run_train(device, train_shape, {**timing, "rounds": 3 if smoke else 10})
    if "model" in wanted:
        records += run_model(device, model_shape, model_timing)
    summary = summarize(records)
    size = "smoke" if smoke else "quick" if quick else "full"
    command = "python -m gemmt bench fp8" + (f" --{size}" if size != "full" else "") + (
        f" --only {','.join(wanted)}" if set(wanted) != set(SECTIONS) else "") + (
        " --fast-accum" if fast_accum else "")
    extra = {"size": size, "sections": wanted, "command": command, "device": device,
             "use_fast_accum": fast_accum, "summary": summary}
    path = _write(out_dir, "fp8", env, records, extra)
    doc = {"environment": env, "records": records, "summary": summary, "command": command}
    kit.finish(path, lambda p: plot(doc, p), readme(doc))
    print(readme(doc))
    return 0
