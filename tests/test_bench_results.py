"""The committed benchmark results carry the fields the reports promise, and the plots can be
redrawn from them (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemmt import bench

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
COMMON = {"op", "dtype", "ours_ms", "ref_ms", "device_name", "torch_version", "date"}


def _load(suite: str) -> list[dict]:
    files = sorted(RESULTS.glob(f"{suite}_*.json"))
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
