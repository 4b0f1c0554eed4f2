"""Reads the SKAB lines of `gemm_tc_selftest --sk-ab` logs and asks how well the Hopper
planner's stream-k rule fits them.

    python benchmarks/experiments/stream_k_schedules/analyze.py LOG [LOG...]

For every product: stream-k against whole wide tiles (and, in four-way logs, the medium and
128x192 tiles). Then the rule of `stream_k_cost_us` / `best_splits` in
kernels/plan/sm90_plan.cpp, with its stream-k part scaled by a piece rate p (the committed
model has p = 1 and a 0.97 margin), scored on the measured times: the mean regret (time lost
against the faster of whole tiles and stream-k) and the products where the pick is more than
1% off. Last, the piece rate each product implies: the p at which the model's ratio equals
the measured one. With gemmt importable (a CPU build is enough), four-way logs are also
scored against what the library's planner picks among the four schedules.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

SMS = 132
KB_US_WIDE = 0.56  # kKbUsWide
UNIT_FIXED_KB = 3.0  # kUnitFixedKb
SK_FIXED_US = 4.5  # kStreamKFixedUs


@dataclass
class Product:
    name: str
    m: int
    n: int
    k: int
    times: dict[str, float]  # schedule -> median ms


def parse(path: str) -> list[Product]:
    out = []
    for line in open(path):
        if not line.startswith("SKAB"):
            continue
        t = line.split()
        m, n, k = int(t[4]), int(t[6]), int(t[8])
        times = {}
        for key in ("whole", "stream-k", "medium", "3/4"):
            if key in t:
                times[key] = float(t[t.index(key) + 1])
        out.append(Product(" ".join(t[1:4]), m, n, k, times))
    return out


def model_ratio(p: Product, rate: float) -> float:
    """The model's stream-k time over its whole-tile time (inf where stream-k is not used)."""
    tiles = math.ceil(p.m / 128) * math.ceil(p.n / 256)
    if tiles < 2 * SMS or tiles % SMS == 0:
        return math.inf
    nk = math.ceil(p.k / 64)
    dp_waves = tiles // SMS - 1
    sk_kb = (tiles - dp_waves * SMS) * nk / SMS
    whole = math.ceil(tiles / SMS) * (nk + UNIT_FIXED_KB) * KB_US_WIDE
    sk = (dp_waves * (nk + UNIT_FIXED_KB) + rate * (sk_kb + 2 * UNIT_FIXED_KB)) * KB_US_WIDE
    return (sk + SK_FIXED_US) / whole


def implied_rate(p: Product) -> float:
    """The piece rate at which the model's ratio equals the measured stream-k / whole."""
    lo, hi = 0.0, 4.0
    target = p.times["stream-k"] / p.times["whole"]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_ratio(p, mid) < target else (lo, mid)
    return (lo + hi) / 2


def score(products: list[Product], rate: float, margin: float) -> tuple[float, int, int]:
    regret, off, picks = 0.0, 0, 0
    for p in products:
        sk = model_ratio(p, rate) < margin
        picks += sk
        chosen = p.times["stream-k" if sk else "whole"]
        best = min(p.times["whole"], p.times["stream-k"])
        regret += (chosen - best) / best
        off += chosen > 1.01 * best
    return 100 * regret / len(products), off, picks


def main() -> None:
    products = [p for path in sys.argv[1:] for p in parse(path)]
    print(f"{len(products)} products from {len(sys.argv) - 1} log(s)\n")
    print(f"{'product':30s} {'m':>6s} {'n':>6s} {'k':>6s} {'waves':>6s} {'sk/whole':>8s} "
          f"{'best':>9s} {'model(1)':>8s} {'rate':>5s}")
    for p in products:
        waves = math.ceil(p.m / 128) * math.ceil(p.n / 256) / SMS
        best = min(p.times, key=p.times.get)
        print(f"{p.name:30s} {p.m:6d} {p.n:6d} {p.k:6d} {waves:6.2f} "
              f"{p.times['stream-k'] / p.times['whole']:8.3f} {best:>9s} "
              f"{model_ratio(p, 1.0):8.3f} {implied_rate(p):5.2f}")
    print("\nrule (piece rate, margin): mean regret against the faster of whole and stream-k, "
          "picks more than 1% off, stream-k picks")
    for rate in (1.0, 1.1, 1.2, 1.3, 1.4):
        for margin in (0.97, 0.98, 0.99, 1.0):
            r, off, picks = score(products, rate, margin)
            mark = "  <- committed" if (rate, margin) == (1.0, 0.97) else ""
            print(f"  p={rate:.1f} margin={margin:.2f}: {r:5.2f}%  {off:3d} off  {picks:3d} "
                  f"stream-k{mark}")
    planner_regret(products)


def planner_regret(products: list[Product]) -> None:
    """What the library's planner (kernels/plan/sm90_plan.cpp, on a 132-SM H100) picks for
    the four-way products, against the fastest of the four schedules measured."""
    four = [p for p in products if len(p.times) == 4]
    if not four:
        return
    try:
        from gemmt import _native
        lib = _native.load()
    except Exception as exc:  # noqa: BLE001 - the tables above stand alone
        print(f"\n(planner not scored: gemmt not importable: {exc})")
        return
    print("\nplanner's pick among the four schedules against the fastest measured:")
    total, off = 0.0, 0
    for p in four:
        what = p.name.split()[0]
        a_col, b_col = what == "wgrad", what == "fwd"
        a = (1, p.m) if a_col else (p.k, 1)  # (stride_m, stride_k)
        b = (1, p.k) if b_col else (p.n, 1)  # (stride_k, stride_n)
        plan = lib.plan_sm90("bfloat16", p.m, p.n, p.k, a, b, p.n, (0, 0, 0), SMS)
        pick = {256: "stream-k" if plan["stream_k"] else "whole", 128: "medium",
                192: "3/4"}.get(plan["tile_n"], "whole")
        best = min(p.times, key=p.times.get)
        lost = p.times[pick] / p.times[best] - 1
        total += lost
        off += lost > 0.01
        flag = "" if lost <= 0.01 else f"  {100 * lost:.1f}% slower than {best}"
        print(f"  {p.name:30s} planner {pick:8s}{flag}")
    print(f"  mean loss {100 * total / len(four):.2f}%, {off} of {len(four)} picks more than 1% "
          "off")


if __name__ == "__main__":
    main()
