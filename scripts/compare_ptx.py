#!/usr/bin/env python3
"""Compare the device code of every kernel between two revisions of the tree.

Generates PTX (``nvcc -ptx``) for every ``kernels/**/*.cu`` of each side, for each
architecture asked for, with the flags the CMake build gives the kernel library, and compares
every ``.entry`` (kernel) and ``.func`` (out-of-line device function) by mangled name. Lines
that move when code moves between files are dropped before comparing: ``.loc`` and ``.file``
(the line table that ``-lineinfo`` adds), comments, and blank lines; branch labels and local
stack names lose the function's index in its file. The per-file hash that
nvcc puts in the names of anonymous-namespace symbols is replaced so that a
kernel moved to another file keeps its name (``12_GLOBAL__N_1``, which c++filt reads as
"(anonymous namespace)").

Usage::

    python scripts/compare_ptx.py BASE_REV [NEW_REV]   # NEW_REV defaults to the working tree
    python scripts/compare_ptx.py --tree-a DIR --tree-b DIR

PTX is cached per revision and architecture under ``--cache`` so a rerun only compiles what
changed. The report lists each kernel as identical; renumbered (the same instructions and operands
once virtual registers are numbered by first use); load-split (equal once one 16-byte shared
load that NVVM splits into 16 + 8 bytes on some compilations and not on others is merged
back: nvcc 13.0 makes that choice differently on two compilations of the same file, see
--self-check); differs; added or removed. It ends with a count per state; the exit status is 1
when any kernel differs or was removed.

``--self-check`` compiles the new side a second time and lists the kernels whose PTX differs
between two compilations of the same source.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
# The flags CMakeLists.txt gives gemmt_kernels in a Release build (CMAKE_CUDA_FLAGS_RELEASE is
# -O3 -DNDEBUG; GEMMT_HAS_SM90A is defined target-wide when sm_90a is among the targets).
FLAGS = [
    "-O3",
    "-DNDEBUG",
    "-std=c++17",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fvisibility=hidden",
    '-DGEMMT_VERSION="0.1.0"',
    "-DGEMMT_HAS_SM90A",
]
DEFAULT_ARCHS = ("sm_90a", "sm_80")

# nvcc names an anonymous namespace <len>_GLOBAL__N__<hash>_<len>_<file name>_<hash>, and
# prefixes internal-linkage statics with <len>_INTERNAL_<hash>_<len>_<file name>_<hash>.
_ANON_NS = re.compile(r"\d+_(GLOBAL__N_|INTERNAL)_[0-9a-f]+_(\d+)_")
_REGISTER = re.compile(r"%(r|rd|f|fd|p|rs|h|hh|b|bd)(\d+)\b")
_REG_DECL = re.compile(r"(\.reg\s+\.\w+\s+%\w+)<\d+>")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
# Labels and local stacks are numbered by the function's position in its file.
_FILE_NUMBERED = [(re.compile(r"\$L__BB\d+_"), "$L__BB_"),
                  (re.compile(r"__local_depot\d+"), "__local_depot")]
_SYMBOL_START = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s")


@dataclass(frozen=True)
class Side:
    """One side of the comparison: a source tree and the label its PTX is cached under."""

    root: Path
    label: str


def export_rev(repo: Path, rev: str, dest: Path) -> Side:
    """Writes the tree of ``rev`` to ``dest`` and returns it labelled by its commit hash."""
    sha = subprocess.check_output(["git", "-C", str(repo), "rev-parse", rev], text=True).strip()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tmp:
        subprocess.check_call(["git", "-C", str(repo), "archive", sha, "include", "kernels"],
                              stdout=tmp)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp) as tar:
            tar.extractall(dest)
    return Side(dest, sha[:12])


def tree_label(root: Path) -> str:
    """A label for a working tree: the hash of its kernel and header sources."""
    h = hashlib.sha256()
    for p in sorted(list(root.glob("kernels/**/*")) + list(root.glob("include/**/*"))):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return "tree-" + h.hexdigest()[:12]


def sources(root: Path) -> list[Path]:
    """Every kernel translation unit of the tree, relative to its root."""
    return sorted(p.relative_to(root) for p in root.glob("kernels/**/*.cu"))


def compile_ptx(root: Path, src: Path, arch: str, out: Path) -> None:
    """Runs nvcc -ptx for one file unless its PTX is cached."""
    if out.exists():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    include = [f"-I{root / 'include'}", f"-I{root / 'kernels'}"]
    cmd = [NVCC, "-ptx", f"-arch={arch}", *FLAGS, *include, str(root / src), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {src} ({arch}):\n{res.stderr}")
    tmp.rename(out)


def strip_anon_hashes(line: str) -> str:
    """Replaces nvcc's per-file anonymous-namespace names by the usual ``12_GLOBAL__N_1``."""
    out, pos = [], 0
    for m in _ANON_NS.finditer(line):
        if m.start() < pos:
            continue
        end = m.end() + int(m.group(2))  # skip the file name, then "_<hash>"
        tail = re.match(r"_[0-9a-f]{8}", line[end:])
        out.append(line[pos:m.start()] + ("12_GLOBAL__N_1" if m.group(1) == "GLOBAL__N_" else ""))
        pos = end + (tail.end() if tail else 0)
    out.append(line[pos:])
    return "".join(out)


def normalise(text: str) -> str:
    """PTX without line-table entries, comments, blank lines and per-file namespace hashes."""
    text = _BLOCK_COMMENT.sub("", text)
    lines = []
    for line in text.splitlines():
        line = line.split("//", 1)[0].rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith(".loc") or stripped.startswith(".file"):
            continue
        line = strip_anon_hashes(line)
        for pattern, repl in _FILE_NUMBERED:
            line = pattern.sub(repl, line)
        lines.append(line)
    return "\n".join(lines)


def renumber_registers(body: str) -> str:
    """The body with virtual registers numbered by first use, per class, and the declared
    register counts dropped: two bodies equal after this differ only in how NVVM numbered
    its virtual registers, not in any instruction or operand."""
    seen: dict[tuple[str, str], int] = {}
    per_class: dict[str, int] = {}

    def sub(m: re.Match[str]) -> str:
        key = (m.group(1), m.group(2))
        if key not in seen:
            seen[key] = per_class.get(key[0], 0)
            per_class[key[0]] = seen[key] + 1
        return f"%{m.group(1)}{seen[key]}"

    return _REGISTER.sub(sub, _REG_DECL.sub(r"\1<*>", body))


_SPLIT_V4 = re.compile(
    r'\t\.pragma "used_bytes_mask 255";\n'
    r"\tld\.shared\.v4\.f32 \t\{(%f\d+), (%f\d+), %f\d+, %f\d+\}, \[([^\]+]+)\+?(\d*)\];\n"
    r"\tld\.shared\.v2\.f32 \t\{(%f\d+), (%f\d+)\}, \[([^\]+]+)\+?(\d*)\];")


def merge_split_loads(body: str) -> str:
    """Undoes one choice NVVM makes differently from run to run on the same source: a 16-byte
    shared load of which only the low 8 bytes are used (marked "used_bytes_mask 255") followed
    by an 8-byte load of the high half, instead of one 16-byte load of all four values."""

    def sub(m: re.Match[str]) -> str:
        a0, a1, base, off, b0, b1, base2, off2 = m.groups()
        off_i, off2_i = int(off or 0), int(off2 or 0)
        if base != base2 or off2_i != off_i + 8:
            return m.group(0)
        suffix = f"+{off_i}" if off else ""
        return f"\tld.shared.v4.f32 \t{{{a0}, {a1}, {b0}, {b1}}}, [{base}{suffix}];"

    return _SPLIT_V4.sub(sub, body)


def symbols(ptx: str) -> dict[str, str]:
    """Maps each .entry / .func defined in normalised PTX to its text (signature and body)."""
    out: dict[str, str] = {}
    lines = ptx.splitlines()
    i = 0
    while i < len(lines):
        m = _SYMBOL_START.match(lines[i])
        if not m:
            i += 1
            continue
        start, depth, seen_body = i, 0, False
        while i < len(lines):
            depth += lines[i].count("{") - lines[i].count("}")
            if "{" in lines[i]:
                seen_body = True
            if lines[i].rstrip().endswith(";") and not seen_body and depth == 0:
                break  # a declaration (prototype), not a definition
            i += 1
            if seen_body and depth == 0:
                break
        if seen_body:  # lines[start:i] is the definition; i is the line after its "}"
            text = "\n".join(lines[start:i])
            name = re.search(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", text).group(1)
            out[f"{m.group(1)} {name}"] = text
        else:
            i += 1
    return out


def collect(side: Side, archs: list[str], cache: Path, jobs: int) -> dict[str, dict[str, str]]:
    """arch -> {symbol: text} over every file of the side (compiling what is not cached)."""
    files = sources(side.root)
    work = [(src, arch, cache / side.label / arch / (str(src) + ".ptx"))
            for arch in archs for src in files]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for f in [pool.submit(compile_ptx, side.root, s, a, o) for s, a, o in work]:
            f.result()
    result: dict[str, dict[str, str]] = {a: {} for a in archs}
    for src, arch, out in work:
        for name, body in symbols(normalise(out.read_text())).items():
            prev = result[arch].get(name)
            if prev is not None and prev != body:
                name = f"{name} [{src}]"  # the same symbol compiled differently in two files
            result[arch][name] = body
    return result


def demangle(names: list[str]) -> dict[str, str]:
    """Readable names through c++filt when it is installed."""
    raw = [n.split(" ", 1)[1].split(" [")[0] for n in names]
    try:
        res = subprocess.run(["c++filt"], input="\n".join(raw), capture_output=True, text=True,
                             check=True)
        return dict(zip(names, res.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: r for n, r in zip(names, raw)}


def compare(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]],
            verbose: bool) -> tuple[list[str], bool]:
    """Report lines per architecture and whether every kernel of `a` is unchanged in `b`."""
    lines: list[str] = []
    ok = True
    for arch in a:
        sa, sb = a[arch], b[arch]
        names = sorted(set(sa) | set(sb))
        readable = demangle(names)
        counts = {"identical": 0, "renumbered": 0, "load-split": 0, "differs": 0, "added": 0,
                  "removed": 0}
        lines.append(f"== {arch}: {len(sa)} symbols before, {len(sb)} after")
        for n in names:
            if n not in sb:
                state = "removed"
            elif n not in sa:
                state = "added"
            elif sa[n] == sb[n]:
                state = "identical"
            elif renumber_registers(sa[n]) == renumber_registers(sb[n]):
                state = "renumbered"
            elif (renumber_registers(merge_split_loads(sa[n])) ==
                  renumber_registers(merge_split_loads(sb[n]))):
                state = "load-split"
            else:
                state = "differs"
            counts[state] += 1
            if state in ("differs", "removed"):
                ok = False
            if verbose or state != "identical":
                lines.append(f"{state:10s} {n.split(' ', 1)[0]:5s} {readable[n]}")
        lines.append(f"-- {arch}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev_a", nargs="?", help="base git revision")
    ap.add_argument("rev_b", nargs="?", help="new git revision (default: the working tree)")
    ap.add_argument("--tree-a", type=Path, help="base source tree instead of a revision")
    ap.add_argument("--tree-b", type=Path, help="new source tree instead of a revision")
    ap.add_argument("--arch", action="append", help="sm_90a, sm_80, ... (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path("build/ptx_compare"))
    ap.add_argument("--verbose", action="store_true", help="list identical kernels too")
    ap.add_argument("--output", type=Path, help="also write the report here")
    ap.add_argument("--self-check", action="store_true",
                    help="compile the new side twice and list kernels whose PTX differs")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    archs = args.arch or list(DEFAULT_ARCHS)
    cache = args.cache.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if args.tree_a:
            side_a = Side(args.tree_a.resolve(), tree_label(args.tree_a.resolve()))
        elif args.rev_a:
            side_a = export_rev(repo, args.rev_a, Path(tmp) / "a")
        else:
            ap.error("give a base revision or --tree-a")
        if args.tree_b:
            side_b = Side(args.tree_b.resolve(), tree_label(args.tree_b.resolve()))
        elif args.rev_b:
            side_b = export_rev(repo, args.rev_b, Path(tmp) / "b")
        else:
            side_b = Side(repo, tree_label(repo))
        a = collect(side_a, archs, cache, args.jobs)
        b = collect(side_b, archs, cache, args.jobs)
        again = None
        if args.self_check:
            again = collect(Side(side_b.root, side_b.label + "-again"), archs, cache, args.jobs)
    lines, ok = compare(a, b, args.verbose)
    if again is not None:
        lines.append("== self-check: the new side compiled twice")
        for arch in b:
            unstable = sorted(n for n in b[arch] if again[arch].get(n) != b[arch][n])
            readable = demangle(unstable)
            lines.append(f"-- {arch}: {len(unstable)} of {len(b[arch])} symbols differ between "
                         "two compilations of the same source")
            lines += [f"unstable   {readable[n]}" for n in unstable]
    header = [f"PTX comparison {side_a.label} -> {side_b.label}",
              "flags: nvcc -ptx " + " ".join(FLAGS),
              "ignored: .loc/.file lines, comments, blank lines, anonymous-namespace file hashes, "
              "per-file numbering of labels and local stacks"]
    report = "\n".join(header + lines) + "\n"
    sys.stdout.write(report)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
