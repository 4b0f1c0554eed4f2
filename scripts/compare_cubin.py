"""Compares the device code of kernels between two sets of object files: the .text.<kernel>
section of every cubin in their .nv_fatbin (uncompressed: compile without --compress-mode),
matched by kernel name with the per-file hash of anonymous namespaces dropped.

    python scripts/compare_cubin.py BEFORE.o[,MORE.o] AFTER.o[,MORE.o] NAME_SUBSTRING

Prints how many kernels whose name contains NAME_SUBSTRING each side has, whether the names
agree, and how many are byte-identical. Needs only objcopy (no cuobjdump).
"""
import re, struct, subprocess, sys

def cubins(obj):
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", obj, obj + ".fb"], check=True)
    data = open(obj + ".fb", "rb").read()
    out = []
    for m in re.finditer(rb"\x7fELF\x02\x01", data):
        out.append(data[m.start():])
    return out

def texts(elf):
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        secs.append((name, typ, off, size))
    stro = secs[shstrndx][2]
    d = {}
    for name, typ, off, size in secs:
        n = elf[stro + name: elf.index(b"\0", stro + name)].decode()
        if n.startswith(".text."):
            # Names of anonymous-namespace entities carry a per-file hash: keep what follows.
            key = n[6:]
            m = re.search(r"_GLOBAL__N__\w+?_cu_[0-9a-f]+(_\d+)?", key)
            if m:  # the kernel's name proper starts after the length digits that follow
                key = re.sub(r"^\d+", "", key[m.end():]) if m.group(1) is None else key[m.end():]
            d[key] = elf[off: off + size]
    return d

def load(objs):
    d = {}
    for o in objs:
        for c in cubins(o):
            d.update(texts(c))
    return d

before = load(sys.argv[1].split(","))
after = load(sys.argv[2].split(","))
pat = sys.argv[3]
kb = {k for k in before if pat in k}
ka = {k for k in after if pat in k}
print(f"{pat}: {len(kb)} kernels before, {len(ka)} after, same names: {kb == ka}; "
      f"byte-identical code: {sum(before[k] == after[k] for k in kb & ka)} of {len(kb & ka)}")
