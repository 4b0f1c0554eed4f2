"""The GEMM tuner (pytorch_wrapper/gemm_tuner.h, gemmt.tuning).

CPU: the cache file's format round-trips; corrupt files, files from another version and
unwritable places are ignored or refused with a warning, never a crash; concurrent writers
from several processes lose nothing and readers never see a partial file; the Python API
and the environment variables. CUDA: tuned products stay within rounding of the untuned
plan's (gemm, mm, linear forward and backward, decode-sized to prefill, epilogues, beta),
the caller's buffers end as the winner writes them, results are bitwise deterministic once
cached (also across a fresh process reading the file), nothing is timed during CUDA-graph
capture, several threads tune at once, and a file from another GPU warns.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

import gemmt
from conftest import HAS_CUDA, REPO_ROOT
from gemmt import _native

MAGIC = "gemmt-tuning-cache 1"
DEV_A = "Fake GPU A sms=132 cc=9.0 driver=12040"
DEV_B = "Fake GPU B sms=78 cc=9.0 driver=12040"
PLANS = ["wgmma", "mma_sync", "gemv", "decode", "pipelined",
         "wgmma:bn=128:splits=4:orient=swapped", "wgmma:bn=256:splits=-1:orient=given",
         "wgmma:bn=64:splits=0:orient=auto", "wgmma:bn=192:splits=1:orient=given"]


def lib():
    return _native.load()


@pytest.fixture(autouse=True)
def clean_tuner() -> Iterator[None]:
    """Each test starts with tuning off, an empty cache in memory and zeroed statistics."""
    before = gemmt.tuning_state()
    lib().tuning_configure("off", "")
    gemmt.clear_tuning_cache()
    gemmt.reset_tuning_stats()
    yield
    lib().tuning_configure("off", "")
    gemmt.clear_tuning_cache()
    gemmt.reset_tuning_stats()
    lib().tuning_configure(before["mode"], before["cache"])


def entries_set() -> set[tuple]:
    return {(e["device"], e["problem"], e["plan"]) for e in gemmt.tuning_entries()}


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "python"), str(REPO_ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    # The source tree's package holds no built extension: the child loads this process's.
    env["GEMMT_LIBRARY"] = gemmt.library_path()
    env.pop("GEMMT_TUNE", None)
    env.pop("GEMMT_TUNE_FILE", None)
    env.update(extra)
    return env


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(**env), timeout=600)


# ---- file format --------------------------------------------------------------------------
def test_cache_file_round_trips(tmp_path: Path) -> None:
    want = set()
    for i, plan in enumerate(PLANS):
        dev = DEV_A if i % 2 else DEV_B
        problem = f"bf16 {i + 1}x4096x4096 a:k b:k align:16,16,16 epi:-,none,- beta:0 sms:132"
        lib().tuning_insert(dev, problem, plan, 10.0 + i, 12.5 + i)
        want.add((dev, problem, plan))
    path = tmp_path / "cache.txt"
    assert gemmt.save_tuning_cache(path)
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == MAGIC
    assert lines[1] == f"library {lib().tuning_library_version()}"
    assert lines[-1] == f"end {len(PLANS)}" and text.endswith("\n")
    assert all(line.startswith("entry\t") for line in lines[2:-1])
    before = {(e["device"], e["problem"]): e for e in gemmt.tuning_entries()}
    gemmt.clear_tuning_cache()
    assert gemmt.tuning_entries() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemmt.load_tuning_cache(path)
    assert entries_set() == want
    after = {(e["device"], e["problem"]): e for e in gemmt.tuning_entries()}
    for key, e in before.items():
        assert after[key]["tuned_us"] == pytest.approx(e["tuned_us"], rel=1e-5)
        assert after[key]["default_us"] == pytest.approx(e["default_us"], rel=1e-5)
    # Writing what was read gives the same bytes (a stable, sorted format).
    path2 = tmp_path / "again.txt"
    assert gemmt.save_tuning_cache(path2)
    assert path2.read_text() == text
    # No temporary files are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.txt", "again.txt.lock",
                                                          "cache.txt", "cache.txt.lock"]


def test_missing_file_is_an_empty_cache(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemmt.load_tuning_cache(tmp_path / "absent.txt")
    assert gemmt.tuning_entries() == []


def _valid_text() -> str:
    version = lib().tuning_library_version()
    return (f"{MAGIC}\nlibrary {version}\n"
            f"entry\t{DEV_A}\tbf16 1x2x3\twgmma\t1.5\t2\n"
            f"entry\t{DEV_B}\tf16 4x5x6\tgemv\t3\t4\nend 2\n")


CORRUPT = {
    "empty": "",
    "garbage": "this is not a cache\n",
    "binary": "\x00\x01\x02\xff" * 10,
    "truncated_no_end": lambda t: t[: t.index("end ")],
    "truncated_mid_line": lambda t: t[:-9],
    "wrong_count": lambda t: t.replace("end 2", "end 3"),
    "bad_plan": lambda t: t.replace("\twgmma\t", "\tturbo\t"),
    "auto_plan": lambda t: t.replace("\twgmma\t", "\tauto\t"),
    "bad_width": lambda t: t.replace("\twgmma\t", "\twgmma:bn=100:splits=1:orient=given\t"),
    "forced_gemv": lambda t: t.replace("\tgemv\t", "\tgemv:bn=64:splits=1:orient=given\t"),
    "negative_time": lambda t: t.replace("\t1.5\t", "\t-1.5\t"),
    "nan_time": lambda t: t.replace("\t1.5\t", "\tnan\t"),
    "missing_field": lambda t: t.replace("\t1.5\t2\n", "\t1.5\n"),
    "extra_field": lambda t: t.replace("\t1.5\t2\n", "\t1.5\t2\tx\n"),
    "empty_device": lambda t: t.replace(f"entry\t{DEV_A}", "entry\t"),
    "bad_magic_version": lambda t: t.replace(MAGIC, "gemmt-tuning-cache 99"),
    "no_library_line": lambda t: t.replace("library ", "librar "),
    "line_after_end": lambda t: t + f"entry\t{DEV_A}\tbf16 9x9x9\twgmma\t1\t1\n",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_file_is_ignored_with_a_warning(tmp_path: Path, kind: str) -> None:
    make = CORRUPT[kind]
    text = make(_valid_text()) if callable(make) else make
    path = tmp_path / "cache.txt"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    lib().tuning_insert(DEV_A, "kept 1x1x1", "wgmma", 1.0, 1.0)
    with pytest.warns(UserWarning, match="ignoring the tuning cache"):
        assert not gemmt.load_tuning_cache(path)
    # Nothing of the bad file was taken; what was in memory stays.
    assert entries_set() == {(DEV_A, "kept 1x1x1", "wgmma")}
    # Configuring the file as the cache warns the same way, and the process goes on.
    with pytest.warns(UserWarning, match="ignoring the tuning cache"):
        gemmt.tuning_cache(path)
    assert gemmt.tuning_state() == {"mode": "cached", "cache": str(path)}
    # Saving replaces the unusable file (with a warning) by a valid one holding memory.
    with pytest.warns(UserWarning, match="replacing the tuning cache"):
        assert gemmt.save_tuning_cache()
    gemmt.clear_tuning_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemmt.load_tuning_cache(path)
    assert entries_set() == {(DEV_A, "kept 1x1x1", "wgmma")}


def test_file_from_another_version_is_ignored_with_a_warning(tmp_path: Path) -> None:
    version = lib().tuning_library_version()
    path = tmp_path / "cache.txt"
    path.write_text(_valid_text().replace(f"library {version}", "library 0.0.0-other"))
    with pytest.warns(UserWarning, match=r"written by gemmt 0\.0\.0-other"):
        assert not gemmt.load_tuning_cache(path)
    assert gemmt.tuning_entries() == []


def test_file_from_another_gpu_is_kept_and_merged(tmp_path: Path) -> None:
    # Entries of GPUs absent here are kept (a shipped file can hold several GPUs) and
    # survive a save from this process; on CUDA, test_other_gpu_file_warns_and_runs_default
    # checks that they are not used here.
    path = tmp_path / "cache.txt"
    path.write_text(_valid_text())
    assert gemmt.load_tuning_cache(path)
    lib().tuning_insert(DEV_A, "mine 7x7x7", "mma_sync", 1.0, 2.0)
    assert gemmt.save_tuning_cache(path)
    gemmt.clear_tuning_cache()
    assert gemmt.load_tuning_cache(path)
    assert entries_set() == {(DEV_A, "bf16 1x2x3", "wgmma"), (DEV_B, "f16 4x5x6", "gemv"),
                             (DEV_A, "mine 7x7x7", "mma_sync")}


def test_save_merges_with_the_file_and_memory_wins(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    # "Another process" wrote two entries.
    lib().tuning_insert(DEV_A, "theirs 1x1x1", "gemv", 1.0, 1.0)
    lib().tuning_insert(DEV_A, "shared 2x2x2", "decode", 1.0, 1.0)
    assert gemmt.save_tuning_cache(path)
    gemmt.clear_tuning_cache()
    # This process has its own entry and another plan for the shared problem.
    lib().tuning_insert(DEV_A, "mine 3x3x3", "wgmma", 1.0, 1.0)
    lib().tuning_insert(DEV_A, "shared 2x2x2", "mma_sync", 1.0, 1.0)
    assert gemmt.save_tuning_cache(path)
    gemmt.clear_tuning_cache()
    assert gemmt.load_tuning_cache(path)
    assert entries_set() == {(DEV_A, "theirs 1x1x1", "gemv"), (DEV_A, "mine 3x3x3", "wgmma"),
                             (DEV_A, "shared 2x2x2", "mma_sync")}
    # Loading never replaces a plan already in memory (the process keeps what it runs).
    lib().tuning_insert(DEV_A, "shared 2x2x2", "wgmma", 1.0, 1.0)
    assert gemmt.load_tuning_cache(path)
    assert (DEV_A, "shared 2x2x2", "wgmma") in entries_set()


def test_unwritable_place_warns_and_returns_false(tmp_path: Path) -> None:
    lib().tuning_insert(DEV_A, "x 1x1x1", "wgmma", 1.0, 1.0)
    target = tmp_path / "no_such_dir" / "cache.txt"
    with pytest.warns(UserWarning, match="cannot write the tuning cache"):
        assert not gemmt.save_tuning_cache(target)
    with pytest.raises(ValueError, match="no cache file is set"):
        gemmt.save_tuning_cache()


def _writer(lib_path: str, path: str, worker: int, count: int) -> None:
    if lib_path:
        os.environ["GEMMT_LIBRARY"] = lib_path
    import gemmt as g
    from gemmt import _native as nat

    native = nat.load()
    for i in range(count):
        # Memory holds only the new entry, so every earlier one (this writer's and the
        # others') survives only through the merge with the file: a lost update shows.
        native.tuning_clear()
        native.tuning_insert(f"{DEV_A}", f"w{worker} {i}x1x1", PLANS[i % len(PLANS)], i, i + 1)
        assert g.save_tuning_cache(path)


def _reader(lib_path: str, path: str, rounds: int, failures) -> None:
    if lib_path:
        os.environ["GEMMT_LIBRARY"] = lib_path
    import gemmt as g

    bad = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(rounds):
            g.clear_tuning_cache()
            bad += not g.load_tuning_cache(path)
    failures.value = bad + len(caught)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.txt")
    ctx = mp.get_context("spawn")
    lib_path = os.environ.get("GEMMT_LIBRARY", "")
    workers, count = 3, 40
    failures = ctx.Value("i", -1)
    procs = [ctx.Process(target=_writer, args=(lib_path, path, w, count)) for w in range(workers)]
    procs.append(ctx.Process(target=_reader, args=(lib_path, path, 300, failures)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    assert failures.value == 0, "a reader saw a partial or corrupt file"
    assert gemmt.load_tuning_cache(path)
    got = {e["problem"] for e in gemmt.tuning_entries()}
    assert got == {f"w{w} {i}x1x1" for w in range(workers) for i in range(count)}
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]


# ---- Python API and environment -----------------------------------------------------------
def test_tune_as_call_and_context_manager(tmp_path: Path) -> None:
    path = str(tmp_path / "c.txt")
    assert gemmt.tuning_state() == {"mode": "off", "cache": ""}
    with gemmt.tune():
        assert gemmt.tuning_state() == {"mode": "tune", "cache": ""}
        with gemmt.tune(cache=path):
            assert gemmt.tuning_state() == {"mode": "tune", "cache": path}
            with gemmt.tune(False):
                assert gemmt.tuning_state() == {"mode": "off", "cache": path}
            with gemmt.tuning_cache(path):
                assert gemmt.tuning_state() == {"mode": "cached", "cache": path}
            assert gemmt.tuning_state() == {"mode": "tune", "cache": path}
        assert gemmt.tuning_state() == {"mode": "tune", "cache": ""}
    assert gemmt.tuning_state() == {"mode": "off", "cache": ""}
    gemmt.tune()  # as a plain call: stays on
    assert gemmt.tuning_state()["mode"] == "tune"
    gemmt.tune(False)
    assert gemmt.tuning_state()["mode"] == "off"
    # Relative paths are made absolute, so a later chdir does not move the file.
    rel = os.path.relpath(path)
    gemmt.tune(cache=rel)
    assert gemmt.tuning_state()["cache"] == os.path.abspath(rel)


def test_tune_bad_arguments() -> None:
    with pytest.raises(TypeError, match="'enabled' expected a bool"):
        gemmt.tune("yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'cache' expected a non-empty file path"):
        gemmt.tune(cache="")
    with pytest.raises(ValueError, match="mode expected"):
        lib().tuning_configure("fast", "")
    with pytest.raises(ValueError, match="argument 'plan' expected"):
        lib().tuning_insert(DEV_A, "p 1x1x1", "wgmma:bn=64", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="argument 'device' expected"):
        lib().tuning_insert("tab\there", "p 1x1x1", "wgmma", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="argument 'problem' expected"):
        lib().tuning_insert(DEV_A, "", "wgmma", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="finite values"):
        lib().tuning_insert(DEV_A, "p 1x1x1", "wgmma", math.inf, 1.0)
    assert gemmt.tuning_state() == {"mode": "off", "cache": ""}
    assert gemmt.tuning_entries() == []


def test_stats_start_empty() -> None:
    s = gemmt.tuning_stats()
    assert s == {"problems": [], "seconds": 0.0, "cache_hits": 0, "capture_skips": 0,
                 "untuned_cached": 0, "tuning_skipped": 0}
    assert set(gemmt.tuning.__all__) <= set(gemmt.__all__)


STATE = "import gemmt; s = gemmt.tuning_state(); print(s['mode'], s['cache'], len(gemmt.tuning_entries()))"


@pytest.mark.parametrize("value, mode", [("1", "tune"), ("true", "tune"), ("ON", "tune"),
                                         ("yes", "tune"), ("0", "off"), ("false", "off"),
                                         ("off", "off"), ("", "off")])
def test_env_var_sets_the_mode(value: str, mode: str) -> None:
    proc = run_child(STATE, GEMMT_TUNE=value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [mode, "0"]


def test_env_var_bad_value_warns_and_stays_off() -> None:
    proc = run_child(STATE, GEMMT_TUNE="maybe")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["off", "0"]
    assert "GEMMT_TUNE='maybe'" in proc.stderr


def test_env_file_alone_is_read_only(tmp_path: Path) -> None:
    path = tmp_path / "shipped.txt"
    path.write_text(_valid_text())
    proc = run_child(STATE, GEMMT_TUNE_FILE=str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cached", str(path), "2"]
    proc = run_child(STATE, GEMMT_TUNE="1", GEMMT_TUNE_FILE=str(path))
    assert proc.stdout.split() == ["tune", str(path), "2"]


def test_env_file_corrupt_warns_and_runs(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("not a cache\n")
    code = STATE + "; import torch; print(gemmt.mm(torch.ones(2, 3), torch.ones(3, 4)).sum().item())"
    proc = run_child(code, GEMMT_TUNE_FILE=str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cached", str(path), "0", "24.0"]
    assert "ignoring the tuning cache" in proc.stderr


# ---- CUDA ---------------------------------------------------------------------------------
cuda = pytest.mark.cuda

ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


def within_rounding(tuned: torch.Tensor, untuned: torch.Tensor, mag: torch.Tensor, k: int,
                    slope: float = 1.0, tf32: bool = False) -> None:
    """|tuned - untuned| <= 2 ulp |untuned| + slope (8 sqrt(k) 2^-24 + tf32 2^-9) mag, where mag
    bounds the sum of magnitudes the product adds (the tuner's own acceptance bound)."""
    t, u = tuned.double(), untuned.double()
    assert torch.isfinite(t).all() and torch.isfinite(u).all()
    accum = 8 * math.sqrt(max(k, 1)) * 2.0 ** -24 + (2.0 ** -9 if tf32 else 0.0)
    tol = 2 * ULP[tuned.dtype] * u.abs() + slope * accum * mag.double() + 1e-30
    excess = ((t - u).abs() - tol).max().item()
    assert excess <= 0, f"tuned result differs from the untuned one beyond rounding by {excess}"


def run_modes(fn, *, tune_first: bool = True):
    """(untuned, tuned, tuned again) results of fn(); the first tuned call tunes."""
    with gemmt.tune(False):
        untuned = fn().clone()
    with gemmt.tune(True):
        tuned = fn().clone()
        again = fn().clone()
    return untuned, tuned, again


DECODE_SHAPES = [(1, 4096, 4096), (7, 5120, 5120), (64, 11008, 4096), (65, 4096, 4096),
                 (200, 4096, 5120), (256, 14336, 4096)]
PREFILL_SHAPES = [(512, 4096, 4096), (2048, 11008, 4096), (257, 1000, 520), (33, 96, 4104)]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", DECODE_SHAPES + PREFILL_SHAPES)
def test_tuned_mm_within_rounding_of_untuned(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    # The candidates' kernel groups are compiled before: a first-use compile inside the timing
    # is not what the tuning of a shape costs (the bound below).
    deferred = str(gemmt.build_info().get("deferred_groups", "")).split(",")
    gemmt.prepare_kernels([g for g in ("decode", "simt16") if g in deferred])
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype).t()  # K-major weight
    untuned, tuned, again = run_modes(lambda: gemmt.mm(a, b))
    assert torch.equal(tuned, again)
    mag = a.double().abs() @ b.double().abs()
    within_rounding(tuned, untuned, mag, k)
    ref = a.double() @ b.double()
    assert (tuned.double() - ref).norm() / ref.norm() < 1e-2
    stats = gemmt.tuning_stats()
    assert len(stats["problems"]) == 1 and stats["cache_hits"] >= 1
    p = stats["problems"][0]
    assert p["candidates"] >= 1 and p["seconds"] > 0
    assert p["seconds"] < 5.0, f"tuning one shape took {p['seconds']:.2f} s"
    # Every schedule timed is listed with its time, the default first; the winner is the
    # fastest of them or the default.
    assert len(p["timed"]) == p["candidates"]
    times = dict(p["timed"])
    assert all(us > 0 for us in times.values()) and p["default_us"] == p["timed"][0][1]
    assert p["winner"] in times and p["tuned_us"] == times[p["winner"]]
    assert p["winner"] == p["timed"][0][0] or p["tuned_us"] == min(times.values())


@cuda
@pytest.mark.parametrize("allow_tf32", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (48, 4096, 4096), (1000, 3000, 700)])
def test_tuned_fp32_within_rounding(allow_tf32: bool, m: int, n: int, k: int) -> None:
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        untuned, tuned, again = run_modes(lambda: gemmt.mm(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert torch.equal(tuned, again)
    within_rounding(tuned, untuned, a.double().abs() @ b.double().abs(), k, tf32=allow_tf32)


@cuda
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m, fin, fout", [(16, 4096, 4096), (200, 4096, 11008), (1024, 4096, 4096)])
def test_tuned_linear_forward_and_backward(act: str, bias: bool, m: int, fin: int, fout: int) -> None:
    dtype = torch.bfloat16
    x = torch.randn(m, fin, device="cuda").to(dtype)
    w = (torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(dtype)
    b = torch.randn(fout, device="cuda").to(dtype) if bias else None
    g = torch.randn(m, fout, device="cuda").to(dtype)

    def step():
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = b.clone().requires_grad_() if bias else None
        y = gemmt.linear(xs, ws, bs, act)
        y.backward(g)
        return torch.cat([y.flatten(), xs.grad.flatten(), ws.grad.flatten()])

    untuned, tuned, again = run_modes(step)
    assert torch.equal(tuned, again), "tuned results must be bitwise deterministic once cached"
    # Every product of the step (forward with epilogue, grad_x, grad_w) was tuned once.
    assert len(gemmt.tuning_stats()["problems"]) >= 3
    # Forward output within rounding of the untuned one.
    y_t, y_u = tuned[: m * fout].view(m, fout), untuned[: m * fout].view(m, fout)
    mag = x.double().abs() @ w.double().abs().t() + (b.double().abs() if bias else 0)
    within_rounding(y_t, y_u, mag, fin, slope=1.25 if act != "none" else 1.0)
    # Gradients: against float64 of the same step, as close as the untuned ones (ReLU masks
    # computed from values within rounding can flip where the pre-activation is ~0, so the
    # gradients are compared by their error, not elementwise).
    xs = x.double().requires_grad_()
    ws = w.double().requires_grad_()
    z = xs @ ws.t() + (b.double() if bias else 0)
    ref_y = {"none": z, "relu": F.relu(z), "gelu": F.gelu(z),
             "gelu_tanh": F.gelu(z, approximate="tanh"), "silu": F.silu(z)}[act]
    ref_y.backward(g.double())
    ref = torch.cat([ref_y.flatten(), xs.grad.flatten(), ws.grad.flatten()])
    err_t = ((tuned.double() - ref).norm() / ref.norm()).item()
    err_u = ((untuned.double() - ref).norm() / ref.norm()).item()
    assert err_t <= max(2 * err_u, 1e-3), (err_t, err_u)


@cuda
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (512, 2048, 1024)])
def test_gemm_outputs_end_as_the_winner_writes_them(beta: float, m: int, n: int, k: int) -> None:
    # Timing runs into scratch outputs: C read by beta is the caller's original, and a
    # NaN-poisoned C with beta == 0 never leaks NaN.
    dtype = torch.bfloat16
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = (torch.randn(k, n, device="cuda") / math.sqrt(k)).to(dtype)
    c0 = torch.randn(m, n, device="cuda").to(dtype) if beta else torch.full(
        (m, n), float("nan"), device="cuda", dtype=dtype)
    outs = []
    for enabled in (False, True, True):
        c = c0.clone()
        with gemmt.tune(enabled):
            gemmt.gemm(c, a, b, alpha=1.5, beta=beta)
        outs.append(c)
    untuned, tuned, again = outs
    assert torch.equal(tuned, again)
    mag = 1.5 * (a.double().abs() @ b.double().abs()) + (beta * c0.double().abs() if beta else 0)
    within_rounding(tuned, untuned, mag, k)
    ref = 1.5 * (a.double() @ b.double()) + (beta * c0.double() if beta else 0)
    assert (tuned.double() - ref).norm() / ref.norm() < 1e-2
    assert len(gemmt.tuning_stats()["problems"]) == 1


@cuda
def test_deterministic_across_a_fresh_process(tmp_path: Path) -> None:
    cache = tmp_path / "cache.txt"
    inputs = tmp_path / "inputs.pt"
    shapes = [(8, 4096, 4096), (100, 11008, 4096), (1024, 4096, 4096)]
    torch.manual_seed(7)
    data = [(torch.randn(m, k).to(torch.bfloat16), (torch.randn(n, k) / 64).to(torch.bfloat16))
            for m, n, k in shapes]
    torch.save(data, inputs)
    with gemmt.tune(cache=cache):
        mine = [gemmt.linear(x.cuda(), w.cuda(), None, "gelu").cpu() for x, w in data]
        again = [gemmt.linear(x.cuda(), w.cuda(), None, "gelu").cpu() for x, w in data]
    assert all(torch.equal(p, q) for p, q in zip(mine, again))
    assert len(gemmt.tuning_stats()["problems"]) == len(shapes)
    assert cache.exists()
    out = tmp_path / "child.pt"
    code = (
        "import torch, gemmt\n"
        f"data = torch.load({str(inputs)!r})\n"
        "res = [gemmt.linear(x.cuda(), w.cuda(), None, 'gelu').cpu() for x, w in data]\n"
        "s = gemmt.tuning_stats()\n"
        f"torch.save((res, len(s['problems']), s['cache_hits'], gemmt.tuning_state()), {str(out)!r})\n"
    )
    lib_env = {"GEMMT_LIBRARY": os.environ["GEMMT_LIBRARY"]} if "GEMMT_LIBRARY" in os.environ else {}
    proc = run_child(code, GEMMT_TUNE_FILE=str(cache), **lib_env)
    assert proc.returncode == 0, proc.stderr
    res, tuned_there, hits, state = torch.load(out)
    assert state["mode"] == "cached"
    assert tuned_there == 0, "a cached-only process must time nothing"
    assert hits == len(shapes)
    assert all(torch.equal(p, q) for p, q in zip(mine, res))


@cuda
def test_no_timing_during_graph_capture() -> None:
    a = torch.randn(64, 4096, device="cuda").to(torch.bfloat16)
    b = (torch.randn(4096, 4096, device="cuda") / 64).to(torch.bfloat16)
    with gemmt.tune(False):
        expected = gemmt.mm(a, b)
    gemmt.tune(True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemmt.mm(a, b)
    graph.replay()
    torch.cuda.synchronize()
    stats = gemmt.tuning_stats()
    assert stats["problems"] == [] and gemmt.tuning_entries() == []
    assert stats["capture_skips"] >= 1
    assert torch.equal(out, expected), "during capture the default plan runs"
    # After the capture the same problem is tuned at its first eager call.
    gemmt.mm(a, b)
    assert len(gemmt.tuning_stats()["problems"]) == 1


@cuda
def test_several_threads_tune_at_once() -> None:
    gemmt.tune(False)
    shapes = [(m, 4096, 4096) for m in (1, 16, 100, 256)] + [(512, 2048, 2048)]
    inputs = [(torch.randn(m, k, device="cuda").to(torch.bfloat16),
               (torch.randn(k, n, device="cuda") / 64).to(torch.bfloat16)) for m, n, k in shapes]
    expected = [gemmt.mm(a, b) for a, b in inputs]
    torch.cuda.synchronize()
    gemmt.tune(True)
    errors: list[BaseException] = []
    results: dict[tuple[int, int, int], torch.Tensor] = {}

    def worker(t: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for rep in range(3):
                    for i, (a, b) in enumerate(inputs):
                        results[(t, i, rep)] = gemmt.mm(a, b)
            stream.synchronize()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    torch.cuda.synchronize()
    problems = [p["problem"] for p in gemmt.tuning_stats()["problems"]]
    assert len(problems) == len(set(problems)) == len(shapes), "each problem is tuned once"
    for (t, i, rep), out in results.items():
        k = shapes[i][2]
        a, b = inputs[i]
        within_rounding(out, expected[i], a.double().abs() @ b.double().abs(), k)
        assert torch.equal(out, results[(0, i, 0)]), "one winner per problem for every thread"


@cuda
def test_other_gpu_file_warns_and_runs_default(tmp_path: Path) -> None:
    path = tmp_path / "other.txt"
    path.write_text(_valid_text())
    code = (
        "import warnings, torch, gemmt\n"
        "gemmt.build_info()\n"
        "a = torch.randn(64, 512, device='cuda'); b = torch.randn(512, 256, device='cuda')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    out = torch.ops.gemmt.mm(a, b)\n"
        "print(any('no entries measured on this GPU' in str(x.message) for x in w))\n"
        "print((out - a @ b).abs().max().item() < 1e-3, gemmt.tuning_stats()['untuned_cached'])\n"
    )
    lib_env = {"GEMMT_LIBRARY": os.environ["GEMMT_LIBRARY"]} if "GEMMT_LIBRARY" in os.environ else {}
    proc = run_child(code, GEMMT_TUNE_FILE=str(path), **lib_env)
    assert proc.returncode == 0, proc.stderr
    # The warning reaches Python's warnings where a Python warning handler is active on the
    # calling thread, and the process's stderr otherwise (C++'s handler): either way it is said.
    warned_py, rest = proc.stdout.split()[0], proc.stdout.split()[1:]
    assert warned_py == "True" or "no entries measured on this GPU" in proc.stderr, (
        proc.stdout + proc.stderr)
    assert rest == ["True", "1"], proc.stdout + proc.stderr


@cuda
def test_cached_plan_that_cannot_run_falls_back(tmp_path: Path) -> None:
    # A hand-edited entry naming a plan the problem cannot take warns and runs the default.
    a = torch.randn(3, 40, device="cuda")
    b = torch.randn(40, 24, device="cuda")
    with gemmt.tune(True):
        gemmt.mm(a, b)
    (entry,) = gemmt.tuning_entries()
    gemmt.clear_tuning_cache()
    lib().tuning_insert(entry["device"], entry["problem"], "wgmma:bn=64:splits=3:orient=given",
                        1.0, 2.0)
    with gemmt.tune(False, cache=tmp_path / "none.txt"):
        out = gemmt.mm(a, b)
    assert torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)
