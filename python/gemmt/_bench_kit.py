"""What the ``fp8`` and ``moe`` benchmark suites share: the device they run on (a CUDA GPU, or
the CPU in ``--smoke`` mode), the environment record, timing that survives an implementation
that refuses, ratios that are None rather than a guess, and the multi-panel plot. The
``linear`` suite and the ``fp8`` suite's model section share the whole-model timing below it
(CUDA-graph replays, single training steps with the GPU's busy time beside them).

Timing on CUDA uses CUDA events: each candidate is warmed up, then timed in rounds that take
turns between the candidates (the order rotating), so that clock and thermal drift land on
all of them alike; the reported time is the median over the rounds. With ``queued=True``
each timed sample is queued behind a sleep kernel of about a millisecond, so the host's
launch work runs ahead of the GPU and only the kernels are timed. On the CPU the same rounds
are timed with a monotonic clock.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import gemmt
from gemmt._report import environment as _cuda_environment

# Cycles of the sleep kernel a queued sample waits behind (about 1 ms on an H100).
_SLEEP_CYCLES = 2_000_000


def pick_device(smoke: bool, suite: str, device: str | None = None) -> str | None:
    """"cuda" when a GPU and a CUDA build of gemmt are present, "cpu" in smoke mode
    without them, else None after printing why the suite cannot run. ``device`` ("cpu" or
    "cuda") asks for one: the CPU only in smoke mode."""
    has_cuda = torch.cuda.is_available() and bool(gemmt.build_info().get("cuda"))
    if device == "cpu" and not smoke:
        print(f"bench {suite}: the CPU runs the --smoke size only")
        return None
    if device == "cuda" and not has_cuda:
        print(f"bench {suite}: no CUDA device, or gemmt was built without CUDA")
        return None
    if device is not None:
        return device
    if has_cuda:
        return "cuda"
    if smoke:
        return "cpu"
    print(f"bench {suite}: needs a CUDA device and a CUDA build of gemmt; "
          f"--smoke runs tiny sizes on the CPU instead")
    return None


def start(suite: str, sections: str, known_sections: tuple[str, ...], smoke: bool,
          device: str | None) -> tuple[list[str], str, dict[str, Any]] | int:
    """A suite's start: the sections asked for, the device and the environment record, with
    the seed fixed; or the exit code (2: an unknown section, 1: no device for the suite)."""
    from gemmt._report import sections_of

    wanted, known = sections_of(sections, known_sections)
    if not known:
        return 2
    picked = pick_device(smoke, suite, device)
    if picked is None:
        return 1
    torch.manual_seed(0)
    return wanted, picked, environment(picked)


def environment(device: str) -> dict[str, Any]:
    """The GPU (or CPU), torch and CUDA versions, date and gemmt build of this run."""
    if device == "cuda":
        env = _cuda_environment()
        props = torch.cuda.get_device_properties(0)
        env["l2_bytes"] = int(getattr(props, "L2_cache_size", 0)) or None
        env["memory_bytes"] = int(props.total_memory)
        return env
    return {
        "device_name": f"CPU {platform.machine()}",
        "sm_count": None,
        "compute_capability": None,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gemmt": gemmt.build_info(),
        "cpu_threads": torch.get_num_threads(),
    }


def l2_bytes(device: str) -> int:
    """The GPU's L2 cache in bytes (50 MB when the driver does not say; 1 MB on the CPU)."""
    if device != "cuda":
        return 1 << 20
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or (50 << 20)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def error_text(exc: BaseException) -> str:
    """One line naming the exception: what the JSON records for a failed call."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:400]


def attempt(fn: Callable[[], Any], device: str) -> tuple[Any, str | None]:
    """(result, None) when ``fn()`` runs, (None, the error's text) when it raises.

    A failed CUDA call may leave the allocator holding its workspace: the cache is emptied
    so that the next candidate starts from the same memory.
    """
    try:
        out = fn()
        sync(device)
        return out, None
    except Exception as exc:  # noqa: BLE001 - any refusal is recorded, the run goes on
        if device == "cuda":
            torch.cuda.empty_cache()
        return None, error_text(exc)


def round_order(names: list[str], r: int) -> list[str]:
    """The order of round ``r``: two candidates alternate which goes first; more are shuffled
    (seeded by the round), so that no candidate always runs after the same other one. The
    kernel that ran before a timed call changes its time: in a fixed rotation two launches of
    one FP8 kernel with one plan measured 16.0 and 18.8 us, each after its fixed predecessor
    (docs/performance.md)."""
    if len(names) <= 2:
        return [names[(r + j) % len(names)] for j in range(len(names))]
    order = list(names)
    random.Random(r).shuffle(order)
    return order


def interleaved_ms(fns: dict[str, Callable[[], object]], device: str, *, rounds: int = 15,
                   reps: int = 1, warmup: int = 3, budget_s: float = 2.0, min_rounds: int = 5,
                   queued: bool = True) -> dict[str, float]:
    """Median milliseconds of one call of each of ``fns``, over alternating rounds.

    Each sample times ``reps`` back-to-back calls (CUDA events on the GPU) and divides.
    Stops early once ``budget_s`` of timed work has passed, never before ``min_rounds``.
    """
    if not fns:
        return {}
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync(device)
    samples: dict[str, list[float]] = {n: [] for n in names}
    spent = 0.0
    for r in range(rounds):
        for name in round_order(names, r):
            fn = fns[name]
            if device == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                if queued:
                    torch.cuda._sleep(_SLEEP_CYCLES)
                start.record()
                for _ in range(reps):
                    fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                ms = (time.perf_counter() - t0) * 1e3
            samples[name].append(ms / reps)
            spent += ms / 1e3
        if spent > budget_s and r + 1 >= min_rounds:
            break
    return {n: statistics.median(s) for n, s in samples.items()}


def time_candidates(candidates: dict[str, Callable[[], object]], device: str,
                    **timing: Any) -> tuple[dict[str, float | None], dict[str, str]]:
    """Times the candidates that run; (ms or None per name, error text per failed name).

    Each candidate is called once first: one that raises is recorded with its error and left
    out of the timing, so a refusal (a kernel not built, a mode this torch lacks) costs the
    others nothing.
    """
    errors: dict[str, str] = {}
    runnable: dict[str, Callable[[], object]] = {}
    for name, fn in candidates.items():
        _, err = attempt(fn, device)
        if err is None:
            runnable[name] = fn
        else:
            errors[name] = err
    times: dict[str, float | None] = {name: None for name in candidates}
    if runnable:
        try:
            times.update(interleaved_ms(runnable, device, **timing))
        except Exception as exc:  # noqa: BLE001 - a failure mid-timing is recorded too
            for name in runnable:
                errors.setdefault(name, error_text(exc))
    return times, errors


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or the denominator is not positive."""
    if num is None or den is None or not den > 0 or not math.isfinite(num / den):
        return None
    return num / den


def tflops(flops: float, ms: float | None) -> float | None:
    return None if ms is None or not ms > 0 else flops / ms / 1e9


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius), in float32 on the tensors' device."""
    o, r = out.float(), ref.float()
    den = r.norm().item()
    return (o - r).norm().item() / (den if den > 0 else 1.0)


def stats(values: list[float | None]) -> dict[str, Any]:
    """Median and worst (smallest) of the ratios that exist, and how many are missing."""
    present = [v for v in values if v is not None]
    return {"points": len(values), "missing": len(values) - len(present),
            "median": statistics.median(present) if present else None,
            "worst": min(present) if present else None}


def plot_panels(panels: list[tuple[str, list[str], dict[str, list[float | None]], str]],
                title: str, path: Path) -> None:
    """One grouped bar chart per panel, (title, labels, series, y label), parity line at 1;
    a missing value is left blank. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in panels if p[1]]
    if not panels:
        return
    width_in = max(8.0, max(0.28 * len(p[1]) * max(1, len(p[2])) for p in panels))
    fig, axes = plt.subplots(len(panels), 1, figsize=(min(width_in, 30.0), 4.2 * len(panels)),
                             squeeze=False)
    for ax, (sub, labels, series, ylabel) in zip(axes[:, 0], panels):
        width = 0.8 / max(1, len(series))
        for i, (name, values) in enumerate(series.items()):
            offset = (i - (len(series) - 1) / 2) * width
            ys = [float("nan") if v is None else v for v in values]
            ax.bar([x + offset for x in range(len(labels))], ys, width=width, label=name)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        present = [v for vs in series.values() for v in vs if v is not None and v > 0]
        if present and max(present) / min(present) > 30:
            ax.set_yscale("log")  # ratios spanning orders of magnitude (loops, eager experts)
        ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=70)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(sub, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def finish(path: Path, plot: Callable[[Path], None], readme: str) -> None:
    """Draw the PNG next to the JSON (a note when matplotlib is missing) and write the
    README draft, ``<json stem>.md``."""
    try:
        plot(path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib to draw it)")
    path.with_suffix(".md").write_text(readme)
    print(f"wrote {path} and {path.with_suffix('.md')}")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines, then a blank line."""
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return out + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def fmt(v: float | None, spec: str = ".3f") -> str:
    """A number for a table, or "n/a"."""
    return "n/a" if v is None else format(v, spec)


# ---- whole-model timing (the linear suite's and the fp8 suite's model sections) -----------
def events_ms(fn: Callable[[], object]) -> float:
    """Milliseconds between CUDA events recorded around one call of ``fn`` (host included)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


class Replay:
    """``calls`` captured once in a CUDA graph; ``ms()`` is the time of one call."""

    def __init__(self, calls: list[Callable[[], object]]) -> None:
        for c in calls:  # lazy initialisation happens outside the capture
            c()
        torch.cuda.synchronize()
        self.n = len(calls)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for c in calls:
                c()
        self.graph.replay()
        torch.cuda.synchronize()

    def ms(self) -> float:
        return events_ms(self.graph.replay) / self.n


def paired_ms(ours: Replay, ref: Replay, rounds: int = 7) -> tuple[float, float]:
    """Medians over alternating rounds, so that clock and thermal drift land on both."""
    o, r = [], []
    for _ in range(rounds):
        o.append(ours.ms())
        r.append(ref.ms())
    return statistics.median(o), statistics.median(r)


def paired_calls_ms(ours: Callable[[], object], ref: Callable[[], object], device: str,
                    calls: int = 3, rounds: int = 5, fallback_rounds: int = 10
                    ) -> tuple[float, float, str]:
    """(ours ms, ref ms, how) of one call each, in alternating rounds.

    On CUDA each side is ``calls`` calls captured in a graph (:class:`Replay`, host overhead
    excluded) and the rounds are :func:`paired_ms`'s; when a capture fails, single calls timed
    with events (host included) in ``fallback_rounds`` alternating rounds. On the CPU the
    same alternating rounds with a monotonic clock.
    """
    if device == "cuda":
        try:
            o_ms, r_ms = paired_ms(Replay([ours] * calls), Replay([ref] * calls), rounds=rounds)
            return o_ms, r_ms, "cuda graph"
        except RuntimeError:
            ours(), ref()
            timer, how = events_ms, "events (graph capture failed)"
    else:
        ours(), ref()
        timer, how = _clock_ms, "cpu clock"
    o, r = [], []
    for _ in range(fallback_rounds):
        o.append(timer(ours))
        r.append(timer(ref))
    return statistics.median(o), statistics.median(r), how


def _clock_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def gpu_busy_ms(fn: Callable[[], object]) -> tuple[float, float, list[dict[str, Any]]]:
    """(busy ms, span ms, kernel events) of one call of ``fn``, from the profiler's trace.

    Busy time counts each kernel from the later of its start and the end of every kernel
    before it, so overlapping kernels are never counted twice: a programmatic launch places
    a kernel's first blocks while its predecessor runs (where they wait), which makes the
    reported durations overlap. The span runs from the first kernel's start to the last one's
    end; span minus busy is the time the GPU sat idle, waiting for the host.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    kern = sorted((ev for ev in trace["traceEvents"]
                   if ev.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                  key=lambda ev: ev["ts"])
    if not kern:
        return 0.0, 0.0, []
    end, busy = float("-inf"), 0.0
    for ev in kern:
        start = max(ev["ts"], end)
        ev["own_us"] = max(0.0, ev["ts"] + ev["dur"] - start)
        end = max(end, ev["ts"] + ev["dur"])
        busy += ev["own_us"]
    return busy / 1e3, (end - kern[0]["ts"]) / 1e3, kern


def paired_steps_ms(ours: Callable[[], object], ref: Callable[[], object], device: str,
                    rounds: int = 11, warmup: int = 3, busy_rounds: int = 3) -> dict[str, Any]:
    """A training step of each side, timed as a training loop sees it.

    Events around single steps (host included: an eager model's step issues more kernels
    than the launch queue holds, so it cannot be queued ahead behind a sleep), ``warmup``
    steps of each first, then ``rounds`` alternating rounds; the per-round ratios' range is
    kept beside the medians. On CUDA, the GPU's busy time from ``busy_rounds`` profiled steps
    of each (:func:`gpu_busy_ms`: the kernels' own share, without the host's gaps), taken
    after the timed rounds because the profiler's hooks slow the eager step. On the CPU a
    monotonic clock, and no busy time.
    """
    timer = events_ms if device == "cuda" else _clock_ms
    for _ in range(warmup):
        ours(), ref()
    o, r = [], []
    for _ in range(rounds):
        o.append(timer(ours))
        r.append(timer(ref))
    round_ratios = sorted(b / a for a, b in zip(o, r))
    out: dict[str, Any] = dict(
        ours_ms=statistics.median(o), ref_ms=statistics.median(r),
        ratio=statistics.median(r) / statistics.median(o),
        round_ratio_range=(round_ratios[0], round_ratios[-1]))
    if device != "cuda":
        out.update(gpu_busy_ms=None, gpu_span_ms=None, gpu_busy_ratio=None,
                   timing=f"cpu clock, {rounds} alternating rounds")
        return out
    busy: dict[str, list[float]] = {"ours": [], "ref": []}
    span: dict[str, list[float]] = {"ours": [], "ref": []}
    for _ in range(busy_rounds):
        for name, fn in (("ours", ours), ("ref", ref)):
            b_ms, s_ms, _ = gpu_busy_ms(fn)
            busy[name].append(b_ms)
            span[name].append(s_ms)
    busy_ms = {k: statistics.median(v) for k, v in busy.items()}
    out.update(gpu_busy_ms=busy_ms, gpu_span_ms={k: statistics.median(v) for k, v in span.items()},
               gpu_busy_ratio=busy_ms["ref"] / busy_ms["ours"],
               timing="events (host included); GPU busy time from the profiler")
    return out
