"""Quick race of the grouped / scaled Hopper GEMM against torch (same run)."""
import json, sys, torch, gemmt
from gemmt._timing import paired_median_ms
dev = "cuda"
res = []
import os
def with_env(f, name, value):
    def g():
        os.environ[name] = value
        r = f()
        os.environ[name] = ""
        return r
    return g
def rec(name, flops, mine_ms, theirs_ms, ref, staged_ms=None):
    r = dict(case=name, ours_tflops=flops / mine_ms / 1e9, ref=ref, ref_tflops=flops / theirs_ms / 1e9,
             ratio=theirs_ms / mine_ms, alt_ratio=None if staged_ms is None else theirs_ms / staged_ms)
    res.append(r); print(json.dumps(r), flush=True)
E4 = torch.float8_e4m3fn
for (m, n, k) in [(8192, 28672, 8192), (4096, 14336, 4096), (2048, 4096, 4096), (16, 8192, 8192)]:
    x = torch.randn(m, k, device=dev); w = torch.randn(n, k, device=dev) / k ** 0.5
    for gran, fast in [("tensor", False), ("tensor", True), ("row", False), ("row", True), ("block", False)]:
        if gran == "block":
            qa, sa = torch.ops.gemmt.quantize_fp8(x.cpu(), "block", E4); qw, sw = torch.ops.gemmt.quantize_fp8(w.cpu(), "block_128x128", E4)
            qa, sa, qw, sw = qa.cuda(), sa.cuda(), qw.cuda(), sw.cuda(); sb = sw.t()
        else:
            qa, sa = torch.ops.gemmt.quantize_fp8(x.cpu(), gran, E4); qw, sw = torch.ops.gemmt.quantize_fp8(w.cpu(), gran, E4)
            qa, sa, qw, sw = qa.cuda(), sa.cuda(), qw.cuda(), sw.cuda(); sb = sw if gran == "tensor" else sw.reshape(1, n)
        b = qw.t()
        f1 = lambda: torch.ops.gemmt.scaled_mm(qa, b, sa, sb, None, torch.bfloat16, "none", fast)
        f2 = lambda: torch._scaled_mm(qa, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        try:
            f2()
        except Exception as e:
            print("torch refuses", gran, e); f2 = f1
        try:
            t = paired_median_ms([f1, f2, with_env(f1, "GEMMT_FP8_TILE", "128")], dev, reps=30)
            rec(f"scaled_mm {m}x{n}x{k} {gran} fast={fast}", 2 * m * n * k, t[0], t[1], "torch._scaled_mm", t[2])
        except Exception as e:
            print("ERR", gran, fast, e)
bf = torch.bfloat16
for (g, tok, h, inter) in [(8, 2048, 4096, 14336), (64, 256, 7168, 2048), (128, 64, 2048, 768), (256, 2, 2048, 768), (8, 8192, 4096, 14336), (64, 128, 2048, 1408)]:
    a = torch.randn(g * tok, h, device=dev, dtype=bf)
    w = torch.randn(g, inter, h, device=dev, dtype=bf) / h ** 0.5
    offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * tok
    b = w.transpose(1, 2)
    f1 = lambda: torch.ops.gemmt.grouped_mm(a, b, offs)
    f2 = lambda: torch._grouped_mm(a, b, offs)
    try:
        t = paired_median_ms([f1, f2, with_env(f1, "GEMMT_GROUPED_PAIR_STORE", "1")], dev, reps=30)
        rec(f"grouped fwd E{g} T{tok} {h}->{inter}", 2 * g * tok * h * inter, t[0], t[1], "torch._grouped_mm", t[2])
        gy = torch.randn(g * tok, inter, device=dev, dtype=bf)
        f1 = lambda: torch.ops.gemmt.grouped_mm(gy, w, offs)
        f2 = lambda: torch._grouped_mm(gy, w, offs)
        t = paired_median_ms([f1, f2, with_env(f1, "GEMMT_GROUPED_PAIR_STORE", "1")], dev, reps=30)
        rec(f"grouped dgrad E{g} T{tok}", 2 * g * tok * h * inter, t[0], t[1], "torch._grouped_mm", t[2])
        f1 = lambda: torch.ops.gemmt.grouped_mm(gy.t(), a, offs)
        f2 = lambda: torch._grouped_mm(gy.t(), a, offs)
        t = paired_median_ms([f1, f2, with_env(f1, "GEMMT_GROUPED_PAIR_STORE", "1")], dev, reps=30)
        rec(f"grouped wgrad E{g} T{tok}", 2 * g * tok * h * inter, t[0], t[1], "torch._grouped_mm", t[2])
    except Exception as e:
        print("ERR grouped", g, tok, e)
json.dump(res, open(sys.argv[1], "w"), indent=1)
import runpy
runpy.run_path("scripts/diag_tail.py", run_name="__main__") if False else None
sys.argv = [sys.argv[0], sys.argv[1].replace(".json", "_diag.json")]
runpy.run_path("scripts/diag_tail.py", run_name="__main__")
