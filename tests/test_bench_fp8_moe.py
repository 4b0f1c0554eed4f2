"""``python -m gemmt bench fp8`` and ``bench moe`` in their ``--smoke`` size, on the CPU: every
section runs, the JSON holds what the READMEs and plots read (environment, records, summary),
every ratio that both sides produced is a finite positive number equal to the quotient of
the times it was made from, and the references the benchmarks build (the eager FP8
quantisation that feeds both libraries, the torch._grouped_mm MoE layer, the routing loads)
are what they claim to be. (On a GPU the same runs take the device; the times there are the
lead's to read.)"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import gemmt
from gemmt import __main__ as cli
from gemmt import bench_fp8, bench_moe

from conftest import rel_err



@functools.lru_cache(maxsize=None)
def _torch_cpu_modes() -> frozenset[str]:
    """The scaling modes this torch's CPU ``_scaled_mm`` runs: tensorwise always; rowwise from
    torch 2.13 (2.11 refuses it on the CPU)."""
    a = torch.ones(16, 32).to(torch.float8_e4m3fn)
    b = torch.ones(16, 32).to(torch.float8_e4m3fn).t()
    modes = {"tensorwise"}
    try:
        torch._scaled_mm(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
        modes.add("rowwise")
    except (RuntimeError, ValueError, NotImplementedError):
        pass
    return frozenset(modes)

_HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _finite_positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _doc(out: Path, suite: str) -> dict[str, Any]:
    files = sorted(out.glob(f"{suite}_*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert doc["suite"] == suite
    env = doc["environment"]
    for key in ("device_name", "torch_version", "cuda_version", "date", "gemmt"):
        assert key in env, key
    assert env["torch_version"] == torch.__version__
    for r in doc["records"]:
        assert r["device_name"] == env["device_name"] and r["date"] == env["date"]
    # The plot beside the JSON when matplotlib is there; the README draft always.
    png = files[0].with_suffix(".png")
    assert png.is_file() == (importlib.util.find_spec("matplotlib") is not None)
    if png.is_file():
        assert png.stat().st_size > 10_000
    assert files[0].with_suffix(".md").read_text().startswith(f"# `python -m gemmt bench {suite}`")
    return doc


def _check_ratio(r: dict[str, Any], ratio: str, num: str, den: str) -> None:
    """A ratio is present exactly when both times are, and is their quotient."""
    if r[num] is None or r[den] is None:
        assert r[ratio] is None, (ratio, r)
        return
    assert _finite_positive(r[num]) and _finite_positive(r[den]), r
    assert _finite_positive(r[ratio]), (ratio, r)
    assert r[ratio] == pytest.approx(r[num] / r[den], rel=1e-12)


@pytest.fixture(scope="module")
def fp8_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fp8")
    assert cli.main(["bench", "fp8", "--smoke", "--device", "cpu", "--out", str(out)]) == 0
    return {**_doc(out, "fp8"), "_dir": str(out)}


@pytest.fixture(scope="module")
def moe_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("moe")
    assert bench_moe.run(out, smoke=True, sections="grouped,scaled,scaled_block,layer",
                         device="cpu") == 0
    return _doc(out, "moe")


# ---- fp8 ----------------------------------------------------------------------------------
def test_fp8_smoke_runs_every_section(fp8_doc: dict[str, Any]) -> None:
    assert fp8_doc["size"] == "smoke" and fp8_doc["device"] == "cpu"
    # The model section needs transformers; without it the section prints why and adds none.
    expected = set(bench_fp8.SECTIONS) - (set() if _HAS_TRANSFORMERS else {"model"})
    assert {r["section"] for r in fp8_doc["records"]} == expected
    # The summary the README is made from is the one the records give.
    assert fp8_doc["summary"] == bench_fp8.summarize(fp8_doc["records"])


def test_fp8_gemm_records(fp8_doc: dict[str, Any]) -> None:
    gemm = [r for r in fp8_doc["records"] if r["section"] == "gemm"]
    points = {(r["tokens"], r["out_features"], r["in_features"], r["layout"]) for r in gemm}
    assert len(gemm) == len(points) * len(bench_fp8.MODES)
    assert {r["layout"] for r in gemm} == set(bench_fp8.LAYOUTS)
    for r in gemm:
        # The product's dimensions are the layout's: forward (T, N, K), grad_input (T, K, N),
        # grad_weight (N, K, T).
        assert (r["m"], r["n"], r["k"]) == bench_fp8._product_dims(
            r["layout"], r["tokens"], r["out_features"], r["in_features"])
        assert r["gemmt_error"] is None, r  # the CPU reference runs every mode
        _check_ratio(r, "gemmt_vs_torch", "torch_ms", "gemmt_ms")
        _check_ratio(r, "gemmt_fp8_vs_gemmt_bf16", "gemmt_bf16_ms", "gemmt_ms")
        _check_ratio(r, "torch_fp8_vs_torch_bf16", "torch_bf16_ms", "torch_ms")
        flops = 2 * r["m"] * r["n"] * r["k"]
        assert r["gemmt_tflops"] == pytest.approx(flops / r["gemmt_ms"] / 1e9)
        # FP8 against the unquantised bf16 product: e4m3's rounding, a few percent.
        assert 0 < r["rel_diff_vs_bf16"] < 0.08, r
        if r["mode"] in _torch_cpu_modes():
            # torch's CPU _scaled_mm has the mode: same operands, same scales, the same product.
            assert r["torch_supported"] and _finite_positive(r["gemmt_vs_torch"]), r
            assert r["rel_diff_vs_torch"] < 1e-3, r
        else:
            # A mode this torch refuses is recorded as such, with its error, not timed.
            assert r["torch_supported"] == (r["torch_error"] is None)
            assert r["torch_status"] == ("ok" if r["torch_supported"] else "unsupported")
            if not r["torch_supported"]:
                assert r["torch_ms"] is None and r["gemmt_vs_torch"] is None
                assert isinstance(r["torch_error"], str) and r["torch_error"]
    for mode, s in fp8_doc["summary"]["gemm"].items():
        ratios = [r["gemmt_vs_torch"] for r in gemm if r["mode"] == mode]
        present = [v for v in ratios if v is not None]
        assert s["gemmt_vs_torch"]["worst"] == (min(present) if present else None)
        assert s["gemmt_vs_torch"]["missing"] == len(ratios) - len(present)


def test_fp8_quant_records(fp8_doc: dict[str, Any]) -> None:
    quant = [r for r in fp8_doc["records"] if r["section"] == "quant"]
    assert {(r["op"], r["granularity"]) for r in quant} == {
        (op, g) for op in ("quantize_fp8", "quantize_fp8_with_transpose")
        for g in bench_fp8.GRANULARITIES}
    for r in quant:
        assert _finite_positive(r["gemmt_gbps"]) and _finite_positive(r["copy_gbps"])
        assert r["gemmt_gbps"] == pytest.approx(r["bytes"] / r["gemmt_ms"] / 1e6, rel=1e-12)
        assert r["copy_gbps"] == pytest.approx(r["copy_bytes"] / r["copy_ms"] / 1e6, rel=1e-12)
        assert r["gemmt_vs_copy_bandwidth"] == pytest.approx(r["gemmt_gbps"] / r["copy_gbps"])
        _check_ratio(r, "gemmt_vs_torch_eager", "torch_eager_ms", "gemmt_ms")
        assert _finite_positive(r["gemmt_vs_torch_eager"])
        # The eager reference quantises exactly as gemmt does.
        assert r["bitwise_equal_to_eager"] is True and r["dequantized_rel_diff_vs_eager"] == 0.0


def test_fp8_decode_and_train_records(fp8_doc: dict[str, Any]) -> None:
    decode = [r for r in fp8_doc["records"] if r["section"] == "decode"]
    assert {r["mode"] for r in decode} == set(bench_fp8.DECODE_MODES)
    for r in decode:
        assert r["weight_copies"] >= 2
        # Weight bytes over the time, against a device copy's bandwidth.
        nk = r["out_features"] * r["in_features"]
        assert _finite_positive(r["copy_gbps"])
        assert r["gemmt_weight_gbps"] == pytest.approx(nk / r["gemmt_us"] / 1e3, rel=1e-12)
        assert r["gemmt_bf16_weight_gbps"] == pytest.approx(2 * nk / r["gemmt_bf16_us"] / 1e3,
                                                            rel=1e-12)
        assert r["gemmt_vs_copy_bandwidth"] == pytest.approx(r["gemmt_weight_gbps"]
                                                             / r["copy_gbps"])
        for ratio, num in (("gemmt_vs_torch", "torch_us"),
                           ("gemmt_fp8_vs_gemmt_bf16", "gemmt_bf16_us"),
                           ("gemmt_fp8_vs_torch_bf16", "torch_bf16_us")):
            _check_ratio(r, ratio, num, "gemmt_us")
            if ratio == "gemmt_vs_torch" and r["mode"] not in _torch_cpu_modes():
                # This torch's CPU _scaled_mm refuses the mode: recorded, not timed.
                assert r[ratio] is None and r["torch_us"] is None and r["torch_error"], r
                continue
            assert _finite_positive(r[ratio]), (ratio, r)
    train = {r["variant"]: r for r in fp8_doc["records"] if r["section"] == "train"}
    assert set(train) == {"bf16_eager", *(f"gemmt_{x}" for x in bench_fp8.TRAIN_RECIPES),
                          *(f"torchao_{x}_compiled" for x in bench_fp8.TORCHAO_RECIPES)}
    assert train["bf16_eager"]["vs_bf16"] == 1.0
    for recipe in bench_fp8.TRAIN_RECIPES:
        r = train[f"gemmt_{recipe}"]
        assert r["error"] is None, r
        assert _finite_positive(r["vs_bf16"]) and _finite_positive(r["tflops"])
        assert r["vs_bf16"] == pytest.approx(train["bf16_eager"]["step_ms"] / r["step_ms"])
        # Four FP8 blocks against the bf16 stack: a few percent apart, not garbage.
        assert 0 < r["output_rel_diff_vs_bf16"] < 0.1, r
    has_torchao = importlib.util.find_spec("torchao") is not None
    for recipe in bench_fp8.TORCHAO_RECIPES:
        r = train[f"torchao_{recipe}_compiled"]
        if not has_torchao:
            assert r["step_ms"] is None and "torchao absent" in r["error"]
        else:
            assert (r["step_ms"] is None) == (r["error"] is not None)


@pytest.mark.skipif(not _HAS_TRANSFORMERS, reason="the model section needs transformers")
def test_fp8_model_records(fp8_doc: dict[str, Any]) -> None:
    shape = bench_fp8.SMOKE_MODEL
    model = {(r["recipe"], r["phase"]): r for r in fp8_doc["records"] if r["section"] == "model"}
    assert set(model) == {(recipe, phase) for recipe in bench_fp8.MODEL_RECIPES
                          for phase in bench_fp8.MODEL_PHASES}
    # Seven projections a layer; lm_head (1000 outputs, not a multiple of 16) stays bf16.
    layer_linears = 7 * shape["layers"]
    for (recipe, phase), r in model.items():
        assert r["error"] is None, r  # the CPU reference runs both recipes
        assert (r["hidden"], r["layers"], r["vocab"]) == (shape["hidden"], shape["layers"],
                                                          shape["vocab"])
        key = "train" if phase == "train_step" else phase
        assert (r["batch"], r["seq"]) == tuple(shape[key]) and r["tokens"] == r["batch"] * r["seq"]
        assert r["inference"] == (phase != "train_step")
        assert r["linears_total"] == layer_linears + 1
        assert r["converted_linears"] == layer_linears
        assert r["unconverted_linears"] == ["lm_head"] and r["lm_head_fp8"] is False
        assert r["target_ratio"] == bench_fp8.MODEL_TARGETS[phase]
        _check_ratio(r, "ratio", "ref_ms", "ours_ms")
        assert _finite_positive(r["ratio"]), r
        assert r["logits_tolerance_factor"] == bench_fp8.LOGITS_TOLERANCE_FACTOR == 16
        if phase == "train_step":
            # FP8 products of a language-model loss: the same loss to well under a percent, and
            # gradients a few FP8 roundings away from bf16's (not garbage, not identical).
            assert r["loss"] > 0 and r["ref_loss"] > 0
            assert r["loss_rel_diff"] == pytest.approx(abs(r["loss"] - r["ref_loss"])
                                                       / r["ref_loss"])
            assert r["loss_rel_diff"] < 5e-3, r
            assert 0 < r["median_grad_rel_err"] <= r["max_grad_rel_err"] < 0.5, r
            # The ratio of the medians lies within the per-round ratios' range.
            lo, hi = r["round_ratio_range"]
            assert lo * (1 - 1e-9) <= r["ratio"] <= hi * (1 + 1e-9), r
            assert r["gpu_busy_ms"] is None  # the profiler's busy time is the GPU's only
            continue
        assert r["timing"] == "cpu clock"
        # The bound: 16 (e4m3's unit roundoff over bf16's) times the bf16 model's own error
        # against float32, which is bf16-grade.
        assert 0 < r["ref_logits_rel_err_vs_fp32"] < 0.02, r
        tol = r["logits_tolerance"]
        assert tol == pytest.approx(16 * r["ref_logits_rel_err_vs_fp32"], rel=1e-12)
        # The FP8 logits: FP8's rounding away from the bf16 model's, several times bf16's own
        # error and far below a broken scale's ~1, within the bound.
        assert 4 * r["ref_logits_rel_err_vs_fp32"] < r["logits_rel_err"] < tol, r
        assert r["logits_within_tolerance"] is True
        assert 4 * r["ref_logits_rel_err_vs_fp32"] < r["logits_rel_err_vs_fp32"] < tol, r
    summ = fp8_doc["summary"]["model"]
    for (recipe, phase), r in model.items():
        s = summ[f"{recipe}/{phase}"]
        assert s["ratio"] == r["ratio"] and s["meets_target"] == (r["ratio"] >= r["target_ratio"])
        assert s["converted_linears"] == layer_linears and s["error"] is None
    md = next(Path(fp8_doc["_dir"]).glob("fp8_*.md")).read_text()
    assert "| model recipe / phase |" in md and "tensorwise/train_step" in md


def test_fp8_model_section_skips_without_transformers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_fp8, "_has_transformers", lambda: False)
    assert bench_fp8.run(tmp_path, smoke=True, sections="model", device="cpu") == 0
    assert "transformers missing: no model section" in capsys.readouterr().out
    doc = json.loads(next(tmp_path.glob("fp8_*.json")).read_text())
    assert doc["records"] == [] and "model" not in doc["summary"]


def test_fp8_only_picks_sections_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    assert cli.main(["bench", "fp8", "--smoke", "--device", "cpu", "--only", "quant",
                     "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("fp8_*.json")).read_text())
    assert {r["section"] for r in doc["records"]} == {"quant"} and doc["sections"] == ["quant"]
    assert "--only quant" in doc["command"]
    assert bench_fp8.run(tmp_path / "x", smoke=True, sections="gemm,bogus", device="cpu") == 2
    # The CPU runs the smoke size only.
    assert bench_fp8.run(tmp_path / "x", device="cpu") == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eager_quantisation_feeds_both_libraries_gemmt_bytes(dtype: torch.dtype) -> None:
    # The operands of the gemm section come from quantize_eager: the same bytes, scales and
    # scale layouts (1x128 column-major, 128x128 contiguous) as gemmt's quantize_fp8.
    x = (torch.randn(256, 384) * 3).to(dtype)
    for gran in bench_fp8.GRANULARITIES:
        q, s = gemmt.quantize_fp8(x, gran)
        qe, se = bench_fp8.quantize_eager(x, gran)
        assert torch.equal(q.view(torch.uint8), qe.view(torch.uint8)), gran
        assert torch.equal(s, se) and s.shape == se.shape and s.stride() == se.stride(), gran


def test_fp8_product_scales_have_torch_layouts() -> None:
    a, bt = torch.randn(256, 256).bfloat16(), torch.randn(384, 256).bfloat16()
    blk = bench_fp8._Fp8Product(a, bt, "blockwise")
    assert blk.b.shape == (256, 384) and blk.b.stride() == (1, 256)  # column-major b
    assert blk.scale_a.shape == (256, 2) and blk.scale_a.stride() == (1, 256)
    assert blk.scale_b.shape == (2, 3) and blk.scale_b.t().is_contiguous()
    row = bench_fp8._Fp8Product(a, bt, "rowwise")
    assert row.scale_a.shape == (256, 1) and row.scale_b.shape == (1, 384)
    # The product is the dequantised operands' product.
    for prod in (blk, row, bench_fp8._Fp8Product(a, bt, "tensorwise")):
        ref = (bench_fp8._expand(prod.scale_a, prod.a.shape) * prod.a.float().double()) @ (
            bench_fp8._expand(prod.scale_b.t(), bt.shape) * prod.b.t().float().double()).t()
        assert rel_err(prod.gemmt(), ref) < 1e-2


# ---- moe ----------------------------------------------------------------------------------
def test_moe_smoke_references_and_summary(moe_doc: dict[str, Any]) -> None:
    refs = moe_doc["references"]
    assert _finite_positive(refs["dense_bf16_tflops"]) and _finite_positive(refs["copy_gbps"])
    dense_flops = 2 * refs["dense_n"] ** 3
    assert refs["dense_bf16_tflops"] == pytest.approx(dense_flops / refs["dense_ms"] / 1e9)
    assert {r["section"] for r in moe_doc["records"]} == {"grouped", "scaled", "scaled_block",
                                                          "layer"}
    assert moe_doc["summary"] == bench_moe.summarize(moe_doc["records"], refs)


def test_moe_grouped_records(moe_doc: dict[str, Any]) -> None:
    refs = moe_doc["references"]
    grouped = [r for r in moe_doc["records"] if r["section"] == "grouped"]
    assert {r["layout"] for r in grouped} == set(bench_moe.LAYOUTS)
    assert {r["routing"] for r in grouped} == set(bench_moe.ROUTINGS)
    for r in grouped:
        assert r["tokens"] == r["experts"] * r["tokens_per_expert"]
        assert r["flops"] == 2.0 * r["tokens"] * r["hidden"] * r["intermediate"]
        roof = max(r["flops"] / refs["dense_bf16_tflops"] / 1e9,
                   r["bytes"] / refs["copy_gbps"] / 1e6)
        assert r["roofline_ms"] == pytest.approx(roof, rel=1e-12)
        for impl in ("gemmt", "torch", "loop"):
            assert r[f"{impl}_error"] is None, r
            _check_ratio(r, f"{impl}_roofline_fraction", "roofline_ms", f"{impl}_ms")
            assert _finite_positive(r[f"{impl}_roofline_fraction"])
        _check_ratio(r, "gemmt_vs_torch", "torch_ms", "gemmt_ms")
        _check_ratio(r, "gemmt_vs_loop", "loop_ms", "gemmt_ms")
        assert _finite_positive(r["gemmt_vs_torch"]) and _finite_positive(r["gemmt_vs_loop"])
        # Every implementation computed the same grouped product as the loop.
        assert r["gemmt_rel_diff_vs_loop"] < 1e-2 and r["torch_rel_diff_vs_loop"] < 1e-2, r
    skewed = [r for r in grouped if r["routing"] == "zipf"]
    assert any(r["max_group"] > r["tokens_per_expert"] for r in skewed)


def test_moe_scaled_records(moe_doc: dict[str, Any]) -> None:
    scaled = [r for r in moe_doc["records"] if r["section"] == "scaled"]
    configs = {c[0] for c in bench_moe.SMOKE_GROUPED}
    assert {r["config"] for r in scaled} == configs
    assert {r["layout"] for r in scaled} == set(bench_moe.SCALED_LAYOUTS)
    for r in scaled:
        assert r["gemmt_error"] is None and r["gemmt_ms"] > 0 and r["gemmt_bf16_ms"] > 0
        assert r["gemmt_vs_gemmt_bf16"] == pytest.approx(r["gemmt_bf16_ms"] / r["gemmt_ms"])
        assert r["flops"] == 2.0 * r["tokens"] * r["hidden"] * r["intermediate"]
    assert set(moe_doc["summary"]["scaled"]) == {
        f"{layout}/{routing}" for layout in bench_moe.SCALED_LAYOUTS for routing in bench_moe.ROUTINGS}


def test_moe_block_scaled_records(moe_doc: dict[str, Any]) -> None:
    block = [r for r in moe_doc["records"] if r["section"] == "scaled_block"]
    assert {r["config"] for r in block} == {c[0] for c in bench_moe.SMOKE_BLOCK}
    assert {r["layout"] for r in block} == set(bench_moe.SCALED_LAYOUTS)
    for r in block:
        assert r["gemmt_error"] is None and r["gemmt_ms"] > 0 and r["gemmt_rowwise_ms"] > 0
        assert r["gemmt_vs_gemmt_rowwise"] == pytest.approx(r["gemmt_rowwise_ms"] / r["gemmt_ms"])
        # The block-quantised product stays within FP8's error of the bf16 one.
        assert r["gemmt_rel_diff_vs_bf16"] < 0.08, r
        # torch's CPU _scaled_mm has no blockwise product: recorded, not timed.
        assert (r["torch_loop_ms"] is None) == (r["torch_loop_error"] is not None), r
    assert set(moe_doc["summary"]["scaled_block"]) == {
        f"{layout}/{routing}" for layout in bench_moe.SCALED_LAYOUTS for routing in bench_moe.ROUTINGS}


def test_moe_quantize_rows_round_trips() -> None:
    t = torch.randn(3, 40, 24)
    q, s = bench_moe.quantize_rows(t, 1)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 24)
    assert q.float().abs().amax(dim=1).max() <= 448
    assert (q.float() * s.unsqueeze(1) - t).abs().max() <= 0.07 * t.abs().max()


def test_moe_layer_records(moe_doc: dict[str, Any]) -> None:
    layer = [r for r in moe_doc["records"] if r["section"] == "layer"]
    assert {r["phase"] for r in layer} == {"forward", "forward_backward", "forward_float8"}
    for r in layer:
        assert r["gemmt_error"] is None and r["torch_error"] is None, r
        _check_ratio(r, "gemmt_vs_torch", "torch_ms", "gemmt_ms")
        assert _finite_positive(r["gemmt_vs_torch"])
        if r["phase"] == "forward":
            assert r["rel_diff_vs_torch"] < 2e-2, r
        if r["phase"] == "forward_float8":
            # float8 experts: e4m3's own error, not a wrong product (that would be ~1)
            assert 1e-3 < r["rel_diff_vs_torch"] < 0.1, r
            _check_ratio(r, "gemmt_vs_gemmt_bf16", "gemmt_bf16_ms", "gemmt_ms")


def test_group_counts() -> None:
    gen = torch.Generator().manual_seed(0)
    assert bench_moe.group_counts(8, 5, "balanced", gen) == [5] * 8
    for experts, tpe in ((8, 16), (256, 2), (128, 512)):
        counts = bench_moe.group_counts(experts, tpe, "zipf", gen)
        assert len(counts) == experts and sum(counts) == experts * tpe and min(counts) >= 0
        # The heaviest expert takes its Zipf share, 1 / H_E of the tokens.
        harmonic = sum(1.0 / (i + 1) for i in range(experts))
        assert max(counts) >= math.floor(experts * tpe / harmonic)


def test_torch_moe_reference_is_gemmt_moe_semantics() -> None:
    # The layer section's reference: routing, SwiGLU experts and the weighted combine, in
    # float32, against gemmt.nn.MoE on the same parameters; gradients too.
    moe = gemmt.nn.MoE(48, 32, 6, 2)
    x = torch.randn(40, 48, requires_grad=True)
    ours = moe(x)
    ref = bench_moe.torch_moe(moe, x)
    assert rel_err(ours, ref) < 1e-5
    g = torch.randn_like(ours)
    grads = torch.autograd.grad(ours, [x, moe.gate_up_proj, moe.down_proj, moe.gate.weight], g)
    grads_ref = torch.autograd.grad(ref, [x, moe.gate_up_proj, moe.down_proj, moe.gate.weight], g)
    for a, b in zip(grads, grads_ref):
        assert rel_err(a, b) < 1e-4


def test_moe_models_smoke(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    assert bench_moe.run(tmp_path, smoke=True, sections="models", device="cpu") == 0
    doc = _doc(tmp_path, "moe")
    models = [r for r in doc["records"] if r["section"] == "models"]
    assert {r["model"] for r in models} == {"mixtral_like", "qwen3_moe_like"}
    assert {r["phase"] for r in models} == {"prefill", "decode", "train"}
    for r in models:
        if r["impl"] in ("gemmt", "grouped_mm", "eager"):
            assert r["error"] is None and _finite_positive(r["ms"]), r
        if r["impl"] in ("grouped_mm", "eager"):
            assert _finite_positive(r["gemmt_vs_impl"]), r
        if r["impl"] == "gemmt" and r["phase"] != "train":
            assert r["logits_rel_diff_vs_eager"] < 2e-2, r


def test_moe_without_gpu_needs_smoke(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if torch.cuda.is_available() and gemmt.build_info().get("cuda"):
        pytest.skip("a GPU is present: the full run would take it")
    assert bench_moe.run(tmp_path, smoke=False) == 1
    assert "--smoke" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.json"))


# ---- on the GPU ---------------------------------------------------------------------------
@pytest.mark.cuda
def test_smoke_runs_on_the_gpu(tmp_path: Path) -> None:
    # Both suites' code paths on CUDA, in seconds: gemmt's kernels run every FP8 mode and
    # every grouped layout (no recorded error), their ratios exist, and their results agree
    # with torch's.
    assert bench_fp8.run(tmp_path, smoke=True, device="cuda") == 0
    assert bench_moe.run(tmp_path, smoke=True, device="cuda",
                         sections="grouped,scaled_block,layer") == 0
    fp8 = _doc(tmp_path, "fp8")
    for r in fp8["records"]:
        if r["section"] == "gemm":
            assert r["gemmt_error"] is None and _finite_positive(r["gemmt_tflops"]), r
            assert r["rel_diff_vs_bf16"] < 0.08, r
            if r["torch_supported"]:
                assert _finite_positive(r["gemmt_vs_torch"]) and r["rel_diff_vs_torch"] < 1e-2, r
        elif r["section"] == "quant":
            assert r["gemmt_error"] is None and _finite_positive(r["gemmt_vs_copy_bandwidth"]), r
            assert r["bitwise_equal_to_eager"] is True, r
        elif r["section"] == "decode":
            assert _finite_positive(r["gemmt_fp8_vs_gemmt_bf16"]), r
        elif r["section"] == "train":
            if r["variant"].startswith("gemmt"):
                assert r["error"] is None and _finite_positive(r["vs_bf16"]), r
        else:
            # The converted model runs both recipes on the GPU; its forward is captured in a
            # CUDA graph as the bf16 model's is, and its logits stay within the bound.
            assert r["section"] == "model" and r["error"] is None, r
            assert _finite_positive(r["ratio"]), r
            if r["phase"] == "train_step":
                assert _finite_positive(r["gpu_busy_ratio"]) and r["loss_rel_diff"] < 5e-3, r
            else:
                assert r["timing"] == "cuda graph", r
                assert r["logits_within_tolerance"] is True, r
    assert {r["section"] for r in fp8["records"]} == set(bench_fp8.SECTIONS) - (
        set() if _HAS_TRANSFORMERS else {"model"})
    # On CUDA the step also runs compiled, as torchao's side does.
    assert {f"gemmt_{x}_compiled" for x in bench_fp8.TORCHAO_RECIPES} <= {
        r["variant"] for r in fp8["records"] if r["section"] == "train"}
    moe = _doc(tmp_path, "moe")
    for r in moe["records"]:
        if r["section"] == "scaled_block":
            # Against torch._scaled_mm's blockwise product, group by group.
            assert r["gemmt_error"] is None and _finite_positive(r["gemmt_vs_torch_loop"]), r
            assert r["gemmt_rel_diff_vs_torch_loop"] < 1e-2, r
            continue
        assert r["gemmt_error"] is None and _finite_positive(r["gemmt_vs_torch"]), r
        if r["section"] == "grouped":
            assert r["gemmt_rel_diff_vs_loop"] < 1e-2, r


@pytest.mark.cuda
def test_moe_models_decode_graph_on_the_gpu(tmp_path: Path) -> None:
    # The decode step captured in a CUDA graph: gemmt's experts and grouped_mm's capture
    # (neither reads the routing back to the host) and both are timed.
    pytest.importorskip("transformers")
    assert bench_moe.run(tmp_path, smoke=True, sections="models", device="cuda") == 0
    graphed = [r for r in _doc(tmp_path, "moe")["records"]
               if r["section"] == "models" and r["phase"] == "decode_graph"]
    assert {(r["model"], r["impl"]) for r in graphed} == {
        (m, i) for m in ("mixtral_like", "qwen3_moe_like")
        for i in ("gemmt", "grouped_mm", "batched_mm")}
    for r in graphed:
        if r["impl"] in ("gemmt", "grouped_mm"):
            assert r["error"] is None and _finite_positive(r["ms"]), r
        if r["impl"] == "grouped_mm":
            assert _finite_positive(r["gemmt_vs_impl"]), r


def test_demo_runs_the_fp8_and_moe_ops_against_torch() -> None:
    """The demo's FP8 and MoE entries (python -m gemmt): each of gemmt's results and torch's
    within the entry's bound of the float64 reference, on the CPU."""
    cases = cli._fp8_moe_cases("cpu")
    assert [c[0].split()[0] for c in cases] == ["quantize_fp8", "scaled_mm", "grouped_mm",
                                                "scaled_grouped_mm"]
    for label, ours, theirs, ref, bound in cases:
        for fn in (ours, theirs):
            out = fn()
            assert out.shape == ref.shape, label
            assert cli._rel_err(out, ref) <= bound, label


def test_demo_runs_the_moe_layer_ops_against_torch() -> None:
    """The demo's routing, permutation, fused experts and quantisation-with-transpose entries:
    gemmt's result and torch's each within the entry's bound of the reference, on the CPU."""
    cases = cli._moe_layer_cases("cpu")
    assert [c[0].split()[0] for c in cases] == ["quantize_fp8", "moe_route", "moe_permute",
                                                "moe_experts", "moe_experts_float8"]
    for label, ours, theirs, ref, bound in cases:
        for fn in (ours, theirs):
            out = fn()
            assert cli._same_shapes(out, ref), label
            assert cli._rel_err(out, ref) <= bound, label


def test_demo_covers_every_public_op() -> None:
    """Every op of gemmt's public API is an entry of the demo (the label's first word), so
    that ``python -m gemmt`` runs each one against PyTorch."""
    cases = cli._cases("cpu") + cli._fp8_moe_cases("cpu") + cli._moe_layer_cases("cpu")
    labels = {c[0].split()[0] for c in cases}
    ops = {"gemm", "mm", "linear", "add", "square", "scale", "swiglu", "rgb_to_gray",
           "normalize_volume", "scaled_mm", "quantize_fp8", "grouped_mm", "scaled_grouped_mm",
           "moe_route", "moe_permute", "moe_experts", "moe_experts_float8"}
    assert ops - {"moe_experts_float8"} <= set(gemmt.__all__)  # (gemmt.moe.float8_experts)
    assert ops <= labels, sorted(ops - labels)
    assert any(c[0].startswith("quantize_fp8 row +T") for c in cases)  # ..._with_transpose


def test_fp8_fast_accum_option(tmp_path: Path) -> None:
    """``--fast-accum``: both libraries' products asked for the tensor cores' own
    accumulation, recorded in every gemm record and in the command."""
    assert cli.main(["bench", "fp8", "--smoke", "--device", "cpu", "--only", "gemm",
                     "--fast-accum", "--out", str(tmp_path)]) == 0
    doc = _doc(tmp_path, "fp8")
    assert doc["use_fast_accum"] is True and doc["command"].endswith("--fast-accum")
    gemm = [r for r in doc["records"] if r["section"] == "gemm"]
    assert gemm and all(r["use_fast_accum"] is True for r in gemm)
    assert all(r["gemmt_error"] is None for r in gemm)
