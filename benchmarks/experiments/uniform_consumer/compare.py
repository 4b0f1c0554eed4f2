"""Compares a ``python -m gemmt bench linear`` JSON with earlier runs of other kernels, product
by product: ``python compare.py NEW.json BASE.json [BASE.json ...]``. Every ratio in these files
is against PyTorch in its own run, so a change of kernels shows as a change of ratio. Prints, per
section and token count, the mean relative change of the new ratio against the mean of the base
runs' ratios for the same product, and the fused section's forward and backward ratios."""

import json
import statistics
import sys
from collections import defaultdict


def _key(r: dict) -> tuple:
    """Identifies one measured product (or one fused / model case) across runs."""
    fields = ("section", "case", "phase", "dtype", "tokens", "in_features", "out_features",
              "activation", "batch", "seq")
    return tuple(r.get(f) for f in fields)


def _ratios(path: str) -> dict:
    """Maps each record's key to its ratio (for fused records: forward and backward)."""
    out = {}
    for r in json.load(open(path))["records"]:
        if r["section"] == "fused":
            out[_key(r) + ("fwd",)] = r["fwd_vs_eager"]
            out[_key(r) + ("bwd",)] = r["bwd_vs_eager"]
        elif "ratio" in r:
            out[_key(r)] = r["ratio"]
    return out


def main() -> None:
    """Prints the per-group mean change of ratio and the new run's summary."""
    new = _ratios(sys.argv[1])
    bases = [_ratios(p) for p in sys.argv[2:]]
    groups = defaultdict(list)
    for k, v in new.items():
        old = [b[k] for b in bases if k in b]
        if not old:
            continue
        section, tokens = k[0], k[4]
        tag = k[-1] if section == "fused" else (tokens if section == "prefill" else "")
        groups[(section, str(tag))].append(v / statistics.mean(old) - 1.0)
    for (section, tag), d in sorted(groups.items()):
        print(f"{section:8s} {tag:6s} n={len(d):3d} mean change {100 * statistics.mean(d):+5.1f}%"
              f"  min {100 * min(d):+5.1f}%  max {100 * max(d):+5.1f}%")
    print(json.dumps(json.load(open(sys.argv[1]))["summary"], indent=1))


if __name__ == "__main__":
    main()
