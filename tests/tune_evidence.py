"""What the tuner's measured winners say about each planner rule (kernels/plan/plan_rules.cpp).

`python -m gemmt bench tune` times, at every point of its decode and prefill sweeps, the
default plan against the tuner's candidate schedules and records the winner
(benchmarks/results/h100_tune/, h200_tune/). This module replays those points on the CPU
plan bindings with each GPU's description: which rules decide the default plan there, what
the plan without the rule would be, whether the tuner timed that plan, and which of the two
the winner took. tests/test_plan.py checks that each rule's `tuner` entry in the table states
these counts, and that no rule is contradicted wherever it decides (such a rule is to be
retired: the tuner's winner is then the model's own plan).

    GEMMT_LIBRARY=$(ls build/cpu-only/_gemmt*.so) PYTHONPATH=python:tests \
        python tests/tune_evidence.py

prints each rule's sentence as the table's `tuner` field holds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gemmt import _native

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
SMS = 132
OCCUPANCY = {"large": 2, "medium": 3, "small": 4, "fat": 1, "narrow": 3, "skinny": 3}
# Devices as the CUDA runtime describes them (gemmt/device_info.h), shared with
# tests/test_plan.py: the H100 SXM the planners' constants were measured on, and an H200 as it
# reported itself (torch 2.11, driver 580: 60 MiB of L2, 3201 MHz x 6016 bits, 4.8 TB/s).
H100 = {"l2_bytes": 52428800, "memory_clock_khz": 2619000, "memory_bus_bits": 5120,
        "sm_clock_khz": 1980000}
H200 = {"l2_bytes": 62914560, "memory_clock_khz": 3201000, "memory_bus_bits": 6016,
        "sm_clock_khz": 1980000}
# GPU label -> (results folder, description).
GPUS = {"H100": ("h100_tune", H100), "H200": ("h200_tune", H200)}
# The tuner's limits (pytorch_wrapper/gemm_tuner.cpp: kMaxCandidates).
MAX_CANDIDATES = 24
# Rules of the SIMT family's pipelined and split-k kernels: the tune sweeps' 16-bit products
# run on tensor cores, so these never decide one of their plans.
SIMT_PIPELINED_RULES = ("stage_k_major_b_16_bit", "stage_k_major_b_float32", "swap_k_major_b",
                        "simt_split_k")
# Hopper rules applied to the kernel's problem (C^T = W x^T where the product runs swapped),
# not to the caller's.
KERNEL_PROBLEM_RULES = ("narrow_weight_stream", "narrow_split_search", "batched_decode_roofline",
                        "no_split_past_half_the_sms", "stream_k_from_two_waves",
                        "stream_k_tail_only", "long_k_last_wave", "short_k_ping_pong")

# A resolved plan: ("gemv", rows_per_block, prefetch_blocks), or the Hopper plan as
# (orientation, tile_n, splits, stream_k, stream_k_tail).
Resolved = tuple


def latest(folder: str) -> Path:
    """The newest tune_*.json of a results folder (the file names end in the date)."""
    files = sorted((RESULTS / folder).glob("tune_*.json"))
    if not files:
        raise FileNotFoundError(f"no tune_*.json in {RESULTS / folder}")
    return files[-1]


@dataclass(frozen=True)
class Point:
    """One measured product: x (tokens x in) @ W^T, W (out x in) row-major."""
    gpu: str
    section: str
    dtype: str
    m: int
    n: int
    k: int
    winner: str
    candidates: int

    @property
    def info(self) -> dict[str, int]:
        return GPUS[self.gpu][1]

    def __str__(self) -> str:
        return f"{self.gpu} {self.section} {self.dtype} {self.m}x{self.n}x{self.k}"


def points(gpu: str) -> list[Point]:
    """The records of the GPU's newest tune file."""
    doc = json.loads(latest(GPUS[gpu][0]).read_text())
    return [Point(gpu, r["section"], r["dtype"], r["tokens"], r["out_features"],
                  r["in_features"], r["winner"], r["candidates"]) for r in doc["records"]]


def _lib() -> Any:
    return _native.load()


def sm90(p: Point, tile_n: int = 0, splits: int = 0, orient: int = 0,
         swapped_problem: bool = False) -> Optional[Resolved]:
    """The Hopper plan of the point (or of its swapped problem), with the tuner's forcings."""
    m, n = (p.n, p.m) if swapped_problem else (p.m, p.n)
    q = _lib().plan_sm90(p.dtype, m, n, p.k, (p.k, 1), (1, p.k), n, (0, 0, 0), SMS,
                         tile_n=tile_n, splits=splits, orient=orient, device_info=p.info)
    if not q["supported"]:
        return None
    return ("swapped" if q["c_trans"] else "given", q["tile_n"], q["splits"], q["stream_k"],
            q["stream_k_tail"])


def gemv(p: Point) -> Optional[Resolved]:
    q = _lib().plan_simt("gemv", p.dtype, p.m, p.n, p.k, (p.k, 1), (1, p.k), p.n, (0, 0, 0),
                         SMS, OCCUPANCY, "", -1, 9, device_info=p.info)
    return ("gemv", q["rows_per_block"], q["prefetch_blocks"]) if q["supported"] else None


def applies(name: str, p: Point, swapped_problem: bool = False) -> bool:
    m, n = (p.n, p.m) if swapped_problem else (p.m, p.n)
    return _lib().plan_rule_applies(name, p.dtype, m, n, p.k, (p.k, 1), (1, p.k), n, (0, 0, 0),
                                    SMS, device_info=p.info)


_ORIENTS = {"auto": 0, "given": 1, "swapped": 2}


def resolve(p: Point, plan: str) -> Optional[Resolved]:
    """The plan a tuner plan string (gemm_tuner.h: Plan::str) runs at the point."""
    if plan == "gemv":
        return gemv(p)
    if plan in ("mma_sync", "decode"):
        return (plan,)
    family, *forced = plan.split(":")
    if family != "wgmma":
        raise ValueError(f"{p}: unknown plan {plan!r}")
    kw = {}
    for part in forced:
        key, value = part.split("=")
        if key == "bn":
            kw["tile_n"] = int(value)
        elif key == "splits":
            kw["splits"] = int(value)
        else:
            kw["orient"] = _ORIENTS[value]
    return sm90(p, **kw)


def default_family(p: Point) -> str:
    """gemm_pick: gemv for one token unless streams_single_row, else the Hopper kernel."""
    return "wgmma" if p.m != 1 or applies("streams_single_row", p) else "gemv"


def candidates(p: Point) -> list[str]:
    """The tuner's candidate list for the point (pytorch_wrapper/gemm_tuner.cpp: candidates),
    default first, as plan strings."""
    lib = _lib()
    default = default_family(p)
    out = [default]

    def supported(plan: str) -> bool:
        if plan == "mma_sync":
            return True  # 16-bit, aligned: the sm_80 kernel takes every such product
        if plan == "decode":
            return lib.plan_decode(p.dtype, p.m, p.n, p.k, (p.k, 1), (1, p.k), p.n, (0, 0, 0),
                                   SMS, 9, device_info=p.info)["supported"]
        return resolve(p, plan) is not None

    def add(plan: str) -> None:
        if len(out) < MAX_CANDIDATES and plan not in out and supported(plan):
            out.append(plan)

    for plan in ("wgmma", "mma_sync", "decode"):
        add(plan)
    if p.m == 1 or p.n == 1:
        add("gemv")
    auto = sm90(p)
    if auto is None:
        return out
    planner_orient = 2 if auto[0] == "swapped" else 1
    names = {1: "given", 2: "swapped"}
    k_blocks = -(-p.k * 2 // 128)
    extra = []
    for orient in (planner_orient, 3 - planner_orient):
        for bn in (256, 192, 128, 64):
            if not (default == "wgmma" and bn == auto[1] and orient == planner_orient):
                add(f"wgmma:bn={bn}:splits=0:orient={names[orient]}")
            rows, cols = (p.n, p.m) if orient == 2 else (p.m, p.n)
            tiles = -(-rows // 128) * -(-cols // bn)
            if tiles * 2 <= SMS:
                extra.append(f"wgmma:bn={bn}:splits=1:orient={names[orient]}")
                fill = min(SMS // max(tiles, 1), k_blocks)
                if fill >= 2:
                    extra.append(f"wgmma:bn={bn}:splits={fill}:orient={names[orient]}")
            elif bn == 256:
                extra += [f"wgmma:bn=256:splits={s}:orient={names[orient]}" for s in (-1, -4)]
    for plan in extra:
        add(plan)
    return out


@dataclass
class Tally:
    """One rule on one GPU: the points where it decides the default plan, and the winners."""
    in_class: int = 0  # points in the rule's class (its predicate), deciding or not
    decides: int = 0   # points where the default plan is the rule's decision, not the model's
    kept: int = 0      # winners that keep the rule's decision
    without: int = 0   # winners that take the decision the plan without the rule makes
    other: int = 0     # winners in another family or otherwise neither
    timed: int = 0     # points where the tuner timed the plan without the rule
    exact_without: int = 0  # winners equal to the whole plan without the rule
    examples: list[str] = field(default_factory=list)


def _tally_point(name: str, p: Point, t: Tally) -> None:
    fam = default_family(p)
    default = sm90(p) if fam == "wgmma" else gemv(p)
    won = resolve(p, p.winner)
    swapped = fam == "wgmma" and default is not None and default[0] == "swapped"
    timed = [resolve(p, c) for c in candidates(p)]

    def count(keeps: Optional[bool], without_plan: Optional[Resolved]) -> None:
        t.decides += 1
        if without_plan is not None and without_plan in timed:
            t.timed += 1
        if without_plan is not None and won == without_plan:
            t.exact_without += 1
        if keeps is None:
            t.other += 1
        elif keeps:
            t.kept += 1
        else:
            t.without += 1
            t.examples.append(f"{p}: {p.winner}")

    if name in SIMT_PIPELINED_RULES:
        t.in_class += applies(name, p)
        return
    if name == "streams_single_row":
        if applies(name, p):
            t.in_class += 1
            count(won is not None and won[0] != "gemv", gemv(p))
        return
    if name in ("gemv_l2_prefetch", "gemv_warps_per_row"):
        if fam == "gemv" and applies(name, p):
            t.in_class += 1
            # The tuner times gemv in one form: the plan without the rule is never a candidate.
            count(won == default if won is not None and won[0] == "gemv" else None, None)
        return
    if fam != "wgmma" or default is None:
        return
    inside = applies(name, p, swapped_problem=swapped and name in KERNEL_PROBLEM_RULES)
    if not inside:
        return
    t.in_class += 1
    gemv_won = won is not None and won[0] == "gemv"
    if name == "swap_for_small_m":
        without_plan = sm90(p, orient=1)
        count(None if gemv_won else won[0] == "swapped", without_plan)
    elif name == "small_m_given_one_wave":
        without_plan = sm90(p, orient=2)
        count(None if gemv_won else won[0] == "given", without_plan)
    elif name == "stream_k_from_two_waves":
        if default[3]:  # stream-k taken; without the rule, whole tiles (not timed at 256)
            count(None if gemv_won else bool(won[3]), sm90(p, tile_n=256, splits=1))
    elif name in ("stream_k_tail_only", "long_k_last_wave"):
        if default[4]:
            count(None if gemv_won else bool(won[4]), None)
    elif name == "batched_decode_roofline":
        # The rule opens the split search past half of the SMs. Where the default is not
        # split past half of the SMs the search found nothing better than the model's plan,
        # which is then also the plan without the rule: it decides nothing there.
        rows, cols = (p.n, p.m) if swapped else (p.m, p.n)
        past_half = -(-rows // 128) * -(-cols // default[1]) * 2 > SMS
        if default[2] > 1 and past_half:
            count(None if gemv_won else won[2] > 1, None)
    elif name == "narrow_split_search":
        # The rule weighs the narrow tile at its best split: where the default is such a
        # split, a winner that runs narrow tiles in k-slices (whatever their count) keeps the
        # decision; one that runs another width or whole narrow tiles takes the plan without it.
        if default[1] == 64 and default[2] > 1:
            count(None if gemv_won or won is None or len(won) < 3
                  else won[1] == 64 and won[2] > 1, None)
    elif name == "no_split_past_half_the_sms":
        # Without the rule the split search would be open at the chosen width; the tuner's
        # candidates split only widths whose tiles fill at most half of the SMs, so that plan
        # is never timed, and no winner can split past half of the SMs.
        if gemv_won or won is None:
            count(None, None)
        else:
            rows, cols = (p.n, p.m) if won[0] == "swapped" else (p.m, p.n)
            past_half = -(-rows // 128) * -(-cols // won[1]) * 2 > SMS
            count(not (won[2] > 1 and past_half), None)
    else:
        # narrow_weight_stream, short_k_ping_pong, epilogue_takes_medium, swap_for_tf32: the
        # default plan is the rule's decision wherever the product is in the class.
        count(None if gemv_won else won == default, None)


def tally(name: str) -> dict[str, Tally]:
    """The rule's tally on each GPU's newest tune sweep."""
    out = {}
    for gpu in GPUS:
        t = Tally()
        for p in points(gpu):
            _tally_point(name, p, t)
        out[gpu] = t
    return out


def classify(tallies: dict[str, Tally]) -> str:
    """'a': decides no measured plan; 'b': every winner where it decides keeps its decision
    (or is in another family); 'c': every winner takes the decision without the rule (retire
    it); 'd': both."""
    kept = sum(t.kept for t in tallies.values())
    without = sum(t.without for t in tallies.values())
    if sum(t.decides for t in tallies.values()) == 0:
        return "a"
    if without == 0:
        return "b"
    return "c" if kept == 0 else "d"


# What each rule's plan without it is called in its sentence.
WITHOUT_PLAN = {"streams_single_row": "gemv", "swap_for_small_m": "the product as given",
                "stream_k_from_two_waves": "whole wide tiles",
                "no_split_past_half_the_sms": "a split there",
                "gemv_warps_per_row": "one warp a row"}


def sentence(name: str, tallies: dict[str, Tally]) -> str:
    """The start of the rule's `tuner` entry: its class, then per GPU the counts, naming the
    results folders."""
    cls = classify(tallies)
    timed = sum(t.timed for t in tallies.values())
    label = {"a": "(a) decides none of the tuned plans",
             "b": "(b) confirmed" if timed else "(b) not contradicted, its alternative untimed",
             "c": "(c) contradicted", "d": "(d) mixed"}[cls]
    if name in SIMT_PIPELINED_RULES:
        label += " (the sweeps' products run on the Hopper kernel)"
    without = WITHOUT_PLAN.get(name, "the plan without it")
    parts = []
    for gpu, t in tallies.items():
        folder = GPUS[gpu][0]
        if t.decides == 0:
            parts.append(f"{folder} in class at {t.in_class} points, deciding none")
            continue
        text = (f"{folder} decides {t.decides} points: the winner keeps it at {t.kept}, "
                f"takes {without} at {t.without}")
        if t.exact_without and t.exact_without != t.without:
            text += f" ({t.exact_without} exactly the plan without it)"
        if t.other:
            text += f", neither at {t.other}"
        text += f"; {without} timed at {t.timed}"
        parts.append(text)
    return label + ". " + ". ".join(parts)


def main() -> None:
    rules = [r["name"] for r in _lib().plan_rules()]
    for gpu in GPUS:
        print(f"{gpu}: {latest(GPUS[gpu][0]).relative_to(RESULTS.parent.parent)}")
    for name in rules:
        t = tally(name)
        print(f"{name}: {sentence(name, t)}")
        for gpu, tt in t.items():
            for e in tt.examples:
                print(f"    without the rule: {e}")


if __name__ == "__main__":
    main()
