"""Scores where to run stream-k on the last wave alone, from gemm_tc_selftest --sk-ab timings.

    python fit.py [-v] SK_AB_LOG...

Each SKAB line holds the measured times of five schedules (whole wide tiles, stream-k on the
last two waves, the medium and the 128x192 tile, stream-k on the last wave alone) and the
planner's pick of the build that ran it. For the rule "where the planner picks stream-k,
spread the last wave alone when the wide tiles come to fewer than W waves", for several W,
prints the mean and worst loss of the schedule picked against the fastest measured one, and
the products whose pick it changes (-v: every product under the chosen W).
"""
from __future__ import annotations

import sys

SMS = 132
NAMES = ("whole", "stream-k", "medium", "3/4", "sk-tail")
PLANNER = {("256", "whole"): "whole", ("256", "stream-k"): "stream-k",
           ("256", "sk-tail"): "sk-tail", ("128", "whole"): "medium", ("192", "whole"): "3/4"}


def load(paths: list[str]) -> list[tuple[str, float, dict[str, float], str]]:
    """(product, waves, {schedule: ms}, planner's pick) per SKAB line with all five."""
    rows = []
    for path in paths:
        for line in open(path):
            if not line.startswith("SKAB") or "sk-tail" not in line:
                continue
            f = line.split()
            times = {f[i]: float(f[i + 1]) for i in range(11, 21, 2)}
            bn, how = f[-2].split("=")[1], f[-1]
            product = f"{f[1]} {f[2]} {f[3]} ({f[4]} x {f[6]} x {f[8]})"
            rows.append((product, float(f[10]), times, PLANNER.get((bn, how), "whole")))
    return rows


def main() -> None:
    verbose = "-v" in sys.argv
    rows = load([a for a in sys.argv[1:] if a != "-v"])
    # The build that ran these took the tail for some products itself. From two waves on,
    # the committed rule had stream-k there (on the last two waves); under two, where it has
    # whole tiles of some width, which one is not in the log: those products are left out.
    committed = [(p, w, t, "stream-k" if pick == "sk-tail" else pick) for p, w, t, pick in rows
                 if pick != "sk-tail" or w >= 2]
    print(f"{len(committed)} products ({len(rows) - len(committed)} left out)")
    for limit in (0, 3, 4, 5, 6, 8, 1e9):
        losses, changed = [], []
        for product, waves, times, pick in committed:
            new = "sk-tail" if pick == "stream-k" and waves < limit else pick
            losses.append(times[new] / min(times.values()) - 1)
            if new != pick:
                changed.append(f"    {product} waves {waves:5.2f}: "
                               f"{times[new] / times[pick]:.3f} of {pick}")
        print(f"tail under {limit:g} waves: mean loss {sum(losses) / len(losses):.4f}, "
              f"worst {max(losses):.4f}, {len(changed)} picks changed")
        if verbose and limit == 5:
            print("\n".join(changed))


if __name__ == "__main__":
    main()
