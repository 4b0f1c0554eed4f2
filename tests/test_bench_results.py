"""The committed benchmark results carry the fields the reports promise, their summaries agree
with their records, the plots can be redrawn from them (no GPU needed), and the results tree
stays what it promises: one folder per GPU and benchmark, each with JSON, PNG and a README,
3 MB in all."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from gemmt import bench, bench_linear

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# The folders the docs quote: one per GPU (count) and benchmark.
FOLDERS = {"h100_gemm": "gemm", "h100_memory": "memory", "h100_linear": "linear",
           "h100x2_mlp_tp": "mlp_tp_scaling", "h100x4_mlp_tp": "mlp_tp_scaling",
           "h100_mm": "mm", "h100_tune": "tune", "h100_gemm_fp64": "gemm_fp64",
           "h200_mm": "mm", "h200_tune": "tune", "h200_gemm_fp64": "gemm_fp64",
           "h200_fp8": "fp8", "h200_moe": "moe", "cpu_fp8_convergence": "fp8_convergence"}
COMMON = {"op", "dtype", "ours_ms", "ref_ms", "device_name", "torch_version", "date"}


def _load(suite: str) -> list[dict]:
    files = sorted(RESULTS.glob(f"*/{suite}_*.json")) + sorted(RESULTS.glob(f"*/{suite}.json"))
    if not files:
        pytest.skip(f"no committed {suite} results")
    return [json.loads(f.read_text()) for f in files]


def test_gemm_results_have_the_promised_fields() -> None:
    for doc in _load("gemm"):
        assert doc["records"], "empty results"
        for r in doc["records"]:
            assert COMMON | {"m", "n", "k", "variant"} <= r.keys(), sorted(r.keys())
            if r.get("ours_ms") is not None:
                assert r["ours_ms"] > 0 and r["ref_ms"] > 0
                assert r["all_written"], r
                bound = 1e-5 if r["dtype"] == "float32" else 5e-3 if r["dtype"] == "tf32" else 1e-2
                assert r["rel_err"] <= bound, r


def test_memory_results_have_the_promised_fields() -> None:
    for doc in _load("memory"):
        assert doc["copy_gbps"] > 0
        for r in doc["records"]:
            assert COMMON | {"bytes", "gbps", "copy_gbps"} <= r.keys(), sorted(r.keys())
            assert "numel" in r or "shape" in r
            # The bandwidth is what the record's bytes and time say it is.
            assert r["gbps"] == pytest.approx(r["bytes"] / r["ours_ms"] / 1e6, rel=1e-6)


def test_plots_redraw_from_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    gemm = _load("gemm")[0]
    bench._plot_gemm(gemm["records"], tmp_path / "gemm.png")
    mem = _load("memory")[0]
    bench._plot_memory(mem["records"], mem["copy_gbps"], tmp_path / "memory.png")
    assert (tmp_path / "gemm.png").stat().st_size > 10_000
    assert (tmp_path / "memory.png").stat().st_size > 10_000


def test_linear_results_have_the_promised_fields_and_summary() -> None:
    for doc in _load("linear"):
        records = doc["records"]
        sections = {r["section"] for r in records}
        assert {"prefill", "fp32", "decode", "fused", "model"} <= sections, sections
        for r in records:
            if r["section"] in ("prefill", "fp32"):
                assert r["ours_ms"] > 0 and r["ref_ms"] > 0
                assert r["ratio"] == pytest.approx(r["ref_ms"] / r["ours_ms"], rel=1e-6)
                assert r["rel_err_vs_torch"] <= (1e-2 if r["dtype"] != "float32" else 1e-4), r
            elif r["section"] == "decode":
                assert r["ratio"] == pytest.approx(r["ref_us"] / r["ours_us"], rel=1e-6)
                assert r["bw_fraction"] > 0, r
            elif r["section"] == "model":
                assert r["ratio"] == pytest.approx(r["ref_ms"] / r["ours_ms"], rel=1e-6)
        # The summary the README quotes is the one its records give.
        assert doc["summary"] == bench_linear._summary(records)
        prefill = [r["ratio"] for r in records if r["section"] == "prefill"]
        assert doc["summary"]["prefill"]["median_ratio"] == statistics.median(prefill)


def test_scaling_results_have_the_promised_fields() -> None:
    docs = _load("mlp_tp_scaling")
    assert {len(d["runs"]) for d in docs} >= {2, 3}, "the 2- and 4-GPU results"
    for doc in docs:
        assert doc["shape"] == {"dim": 4096, "hidden": 11008, "tokens": 8192, "dtype": "bfloat16"}
        runs = doc["runs"]
        assert runs[0]["gpus"] == 1
        for r in runs:
            assert r["torch"]["step_ms"] > 0 and r["gemmt"]["step_ms"] > 0
            assert r["gemmt_vs_torch"] == pytest.approx(
                r["torch"]["step_ms"] / r["gemmt"]["step_ms"], rel=1e-6)
            for impl in ("torch", "gemmt"):
                assert r[impl]["speedup"] == pytest.approx(
                    runs[0][impl]["step_ms"] / r[impl]["step_ms"], rel=1e-6)
                assert r[impl]["step_ms"] == pytest.approx(statistics.median(r[impl]["rounds_ms"]))
            assert r["max_rel_err"] < 1e-3, r


def test_linear_plot_redraws_from_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    doc = _load("linear")[0]
    bench_linear._plot(doc["records"], tmp_path / "linear.png")
    assert (tmp_path / "linear.png").stat().st_size > 10_000


def test_scaling_plot_redraws_from_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("mlp_tp_scaling",
                                                  ROOT / "benchmarks" / "mlp_tp_scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for doc in _load("mlp_tp_scaling"):
        assert module._plot(doc, tmp_path / "scaling.png")
        assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_results_tree_is_one_folder_per_gpu_and_benchmark() -> None:
    folders = {p.name for p in RESULTS.iterdir()
               if p.is_dir() and (p.name[:4] in ("h100", "h200") or p.name.startswith("cpu_"))}
    assert folders == set(FOLDERS), sorted(folders ^ set(FOLDERS))
    for name, suite in FOLDERS.items():
        folder = RESULTS / name
        assert (folder / "README.md").is_file(), name
        assert list(folder.glob(f"{suite}*.json")) and list(folder.glob(f"{suite}*.png")), name
        for f in folder.iterdir():
            assert f.suffix in (".json", ".png", ".md"), f"{name}: {f.name} (logs live in git history)"
    total = sum(f.stat().st_size for f in RESULTS.rglob("*") if f.is_file())
    assert total <= 3 * 2**20, f"benchmarks/results holds {total / 2**20:.1f} MB"


def test_mm_tune_and_fp64_results_hold_what_their_readmes_quote() -> None:
    # Every ratio recomputes from its record's times, and each summary from its records.
    for f in sorted(RESULTS.glob("h*_mm/mm_*.json")):
        doc = json.loads(f.read_text())
        for r in doc["autograd"]:
            assert abs(r["mm_vs_torch"] - r["torch_ms"] / r["mm_ms"]) < 1e-9, f
            assert abs(r["gemm_function_vs_torch"] - r["torch_ms"] / r["gemm_function_ms"]) < 1e-9
            if "torch_function_ms" in r:  # the same Function on torch.mm (later runs)
                assert abs(r["gemm_function_vs_torch_function"]
                           - r["torch_function_ms"] / r["gemm_function_ms"]) < 1e-9, f
        assert doc["summary"]["mm_median"] == statistics.median(
            r["mm_vs_torch"] for r in doc["autograd"])
        for p in doc["points"]:
            assert abs(p["gemmt_vs_torch"] - p["torch_ms"] / p["gemmt_ms"]) < 1e-9, f
    for f in sorted(RESULTS.glob("h*_tune/tune_*.json")):
        doc = json.loads(f.read_text())
        for section, summ in doc["summary"].items():
            recs = [r for r in doc["records"] if r["section"] == section]
            assert summ["points"] == len(recs), f
            assert summ["tuned_median"] == statistics.median(r["tuned_vs_cublas"] for r in recs)
            for r in recs:
                assert abs(r["tuned_vs_cublas"] - r["cublas_us"] / r["tuned_us"]) < 1e-9, f
                assert r["tuned_untuned_rel_diff"] < 1e-2, (f, r)
    for f in sorted(RESULTS.glob("h*_gemm_fp64/gemm_fp64_*.json")):
        for r in json.loads(f.read_text())["records"]:
            assert r["dtype"] == "float64" and r["rel_err"] < 1e-12, (f, r)
            assert abs(r["ratio"] - r["ref_ms"] / r["ours_ms"]) < 1e-9, (f, r)


def test_mm_tune_and_fp64_plots_redraw_from_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gemmt import bench_mm, bench_tune

    for f in sorted(RESULTS.glob("h*_mm/mm_*.json")):
        bench_mm.plot(json.loads(f.read_text()), str(tmp_path / "mm.png"))
        assert (tmp_path / "mm.png").stat().st_size > 10_000
    for f in sorted(RESULTS.glob("h*_tune/tune_*.json")):
        bench_tune.plot(json.loads(f.read_text()), tmp_path / "tune.png")
        assert (tmp_path / "tune.png").stat().st_size > 10_000
    for f in sorted(RESULTS.glob("h*_gemm_fp64/gemm_fp64_*.json")):
        bench.plot_fp64(json.loads(f.read_text())["records"], tmp_path / "fp64.png")
        assert (tmp_path / "fp64.png").stat().st_size > 10_000


def test_fp8_convergence_result_holds_what_it_claims() -> None:
    # benchmarks/fp8_convergence.py: bf16 and the three recipes from the same start, each
    # recipe's ratios and verdict as its losses give them.
    for doc in _load("fp8_convergence"):
        assert doc["steps"] >= 300 and doc["tolerance"] == 0.01
        base, *fp8 = doc["runs"]
        assert base["recipe"] == "bf16" and base["converted_linears"] == 0
        assert [r["recipe"] for r in fp8] == ["tensorwise", "rowwise", "blockwise"]
        for r in doc["runs"]:
            assert len(r["losses"]) == doc["steps"]
            assert r["final_train_loss"] == pytest.approx(statistics.mean(r["losses"][-20:]))
            assert r["held_out_loss"] < r["losses"][0]  # it learned something
        for r in fp8:
            assert r["converted_linears"] == 16  # every block's four products; the head stays
            for key in ("final_train_loss", "held_out_loss"):
                assert r[f"{key}_vs_bf16"] == pytest.approx(r[key] / base[key] - 1)
            assert r["within_tolerance"] == (abs(r["final_train_loss_vs_bf16"]) <= 0.01
                                             and abs(r["held_out_loss_vs_bf16"]) <= 0.01)


@pytest.mark.parametrize("name,args", [("fp32_few_rows", []), ("batched_decode", []),
                                       ("launch_forms", ["grouped"]), ("launch_forms", ["fp8"]),
                                       ("profile_moe_layer", [])])
def test_benchmark_script_needs_a_gpu(tmp_path: Path, name: str, args: list[str]) -> None:
    """benchmarks/fp32_few_rows.py (the few-row float32 table of h200_mm/),
    benchmarks/batched_decode.py (the batched decode A/B of h200_tune/),
    benchmarks/launch_forms.py (the grouped / scaled GEMM's launch forms) and
    benchmarks/profile_moe_layer.py (the MoE layer's kernels) say what they need and exit 1
    on a machine without CUDA, writing nothing."""
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("runs the whole sweep on a GPU")
    script = ROOT / "benchmarks" / f"{name}.py"
    done = subprocess.run([sys.executable, str(script), *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and f"{name}: needs a CUDA device" in done.stdout, done
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("count", [2, 3, 5])
def test_timing_rounds_run_each_candidate_once_and_vary_its_predecessor(count: int) -> None:
    """Each round times every candidate once; with three or more, no candidate always follows
    the same other one (the kernel that ran before a call changes its time)."""
    from gemmt._bench_kit import round_order
    names = [f"c{i}" for i in range(count)]
    orders = [round_order(names, r) for r in range(12)]
    assert all(sorted(o) == names for o in orders)
    assert orders == [round_order(names, r) for r in range(12)]  # the same at every run
    if count == 2:
        assert {o[0] for o in orders} == set(names)
        return
    for name in names:
        before = {o[o.index(name) - 1] for o in orders if o.index(name) > 0}
        assert len(before) >= 2
