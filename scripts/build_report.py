"""What a build took and what its module is made of.

    python scripts/build_report.py BUILD_DIR [--json out.json]

Reads BUILD_DIR/.ninja_log (the last build's compile time of every translation unit, and
the wall time from the first start to the last end) and the module's size, split into its
device code (the .nv_fatbin section: the kernels' cubins), host code and the rest, with
each kernel object's share of the device code.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys


def ninja_times(build_dir: str) -> tuple[list[tuple[float, str, float]], float]:
    """(seconds, output, start in seconds) of each step of the last build, longest first, and
    its wall time."""
    path = os.path.join(build_dir, ".ninja_log")
    entries: dict[str, tuple[int, int]] = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 4:
                continue
            start, end, _, out = int(parts[0]), int(parts[1]), parts[2], parts[3]
            entries[out] = (start, end)  # a rebuilt step's later entry replaces the earlier
    if not entries:
        return [], 0.0
    # The last build: the entries after the latest restart of the clock (ninja's times are
    # relative to each build's start; a new build starts again from zero).
    steps = sorted(((e - s) / 1000.0, out, s / 1000.0) for out, (s, e) in entries.items())
    steps.reverse()
    wall = (max(e for _, e in entries.values()) - min(s for s, _ in entries.values())) / 1000.0
    return steps, wall


def write_weights(path: str, steps: list[tuple[float, str, float]]) -> None:
    """Each compiled source file's seconds, longest first: "<seconds> <path>" lines, the path
    relative to the source tree (an object CMakeFiles/<target>.dir/<path>.o)."""
    lines = ["# Compile seconds of each source file in one cold build, longest first: CMake lists",
             "# the kernel library's and the module's sources in this order (CMakeLists.txt,",
             "# gemmt_longest_first). Written by scripts/build_report.py --weights; a file it does",
             "# not list goes after the listed ones."]
    for s, out, _ in steps:
        if ".dir/" in out and out.endswith(".o"):
            lines.append(f"{s:.1f} {out.split('.dir/', 1)[1][:-2]}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def section_sizes(path: str) -> dict[str, int]:
    """Sizes of the ELF sections of a file (readelf), by name."""
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True).stdout
    sizes: dict[str, int] = {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("["):
            continue
        fields = line.split("]", 1)[1].split()
        if len(fields) >= 5:
            try:
                sizes[fields[0]] = int(fields[4], 16)
            except ValueError:
                continue
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--weights", metavar="FILE",
                        help="write each source file's compile seconds here, longest first "
                             "(the table cmake/compile_seconds.txt that orders the sources)")
    args = parser.parse_args(argv)

    steps, wall = ninja_times(args.build_dir)
    modules = sorted(glob.glob(os.path.join(args.build_dir, "_gemmt*.so")))
    report: dict[str, object] = {"build_dir": args.build_dir, "wall_s": wall,
                                 "steps": [{"s": s, "output": o, "start_s": t}
                                           for s, o, t in steps]}
    print(f"build: {len(steps)} steps, {wall:.1f} s from the first start to the last end")
    for s, o, t in steps[: args.top]:
        print(f"  {s:7.1f} s  (from {t:5.1f} s)  {o}")
    if args.weights:
        write_weights(args.weights, steps)
    if modules:
        mod = modules[0]
        sections = section_sizes(mod)
        total = os.path.getsize(mod)
        fatbin = sections.get(".nv_fatbin", 0)
        text = sections.get(".text", 0)
        report["module"] = {"path": mod, "bytes": total, "nv_fatbin": fatbin, "text": text}
        print(f"module {os.path.basename(mod)}: {total / 1e6:.1f} MB "
              f"(device code {fatbin / 1e6:.1f} MB, host code {text / 1e6:.1f} MB, "
              f"other {(total - fatbin - text) / 1e6:.1f} MB)")
    objects = glob.glob(os.path.join(args.build_dir, "**", "*.cu.o"), recursive=True)
    per_object = sorted(((section_sizes(o).get(".nv_fatbin", 0), o) for o in objects),
                        reverse=True)
    report["objects"] = [{"nv_fatbin": b, "object": o} for b, o in per_object]
    if per_object:
        print("device code by kernel object:")
        for b, o in per_object[: args.top]:
            print(f"  {b / 1e6:7.2f} MB  {os.path.relpath(o, args.build_dir)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
