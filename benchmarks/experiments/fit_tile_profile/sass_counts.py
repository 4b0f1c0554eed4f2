"""Counts instructions of interest per kernel in a cuobjdump -sass listing read from stdin:
``cuobjdump -sass instances_bf16.cu.o | python sass_counts.py``. One line per Hopper GEMM
instance: HGMMA, R2UR (vector-to-uniform moves), and all instructions."""

import re
import sys


def main() -> None:
    """Reads the listing from stdin and prints one line of counts per kernel."""
    name, counts = None, {}
    rows = []
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                rows.append((name, counts))
            name, counts = m.group(1), {"HGMMA": 0, "R2UR": 0, "all": 0}
            continue
        if name and re.search(r"/\*[0-9a-f]{4,}\*/\s+\S", line):
            counts["all"] += 1
            for op in ("HGMMA", "R2UR"):
                if re.search(r"\b" + op + r"\b", line):
                    counts[op] += 1
    if name:
        rows.append((name, counts))
    for name, c in rows:
        m = re.search(r"sm90_gemm_kernelILi(\d+)ELb(\d)ELb(\d)ELi(\d)ELi(\d+)E", name)
        label = "kind=%s amn=%s bmn=%s cl=%s bn=%s" % m.groups() if m else name[:60]
        print(f"{label:40s} HGMMA {c['HGMMA']:4d}  R2UR {c['R2UR']:5d}  all {c['all']:6d}")


if __name__ == "__main__":
    main()
