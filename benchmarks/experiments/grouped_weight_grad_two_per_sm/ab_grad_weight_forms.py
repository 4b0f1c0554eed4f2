"""A/B: the weight gradient's split of K (2-D x 2-D grouped_mm) on one CTA an SM (256-wide
tile, staged C: the plan) against two CTAs an SM (128-wide, C from registers) and one CTA
with the 128-wide tile."""
import json, os, sys
import torch
import gemmt
from gemmt import _bench_kit as kit

FORMS = {"plan": {}, "two_per_sm": {"GEMMT_GROUPED_PER_SM": "2"},
         "tile128": {"GEMMT_GROUPED_TILE": "128"}}
KEYS = ("GEMMT_GROUPED_PER_SM", "GEMMT_GROUPED_TILE")

def call(env, a, b, offs):
    def run():
        for k in KEYS:
            os.environ.pop(k, None)
        os.environ.update(env)
        return torch.ops.gemmt.grouped_mm(a, b, offs)
    return run

torch.manual_seed(0)
cases = [  # name, experts, slots per expert, rows of a (out rows), cols of b
    ("mixtral_gate_up", 8, 1024, 28672, 4096), ("mixtral_down", 8, 1024, 4096, 14336),
    ("mixtral_gate_up_128", 8, 128, 28672, 4096), ("mixtral_gate_up_4096", 8, 4096, 28672, 4096),
    ("qwen3_gate_up", 128, 256, 1536, 2048), ("qwen3_down", 128, 256, 2048, 768),
    ("dbrx_gate_up", 16, 512, 21504, 6144), ("deepseek_gate_up", 256, 64, 4096, 7168),
]
out = []
for name, e, tpe, m, n in cases:
    counts = torch.distributions.Multinomial(e * tpe, torch.ones(e)).sample().long()
    offs = counts.cumsum(0).to(torch.int32).cuda()
    slots = int(counts.sum())
    g = torch.randn(slots, m, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(slots, n, device="cuda", dtype=torch.bfloat16)
    a, b = g.t(), x
    cands = {f: call(env, a, b, offs) for f, env in FORMS.items()}
    ms, err = kit.time_candidates(cands, "cuda", rounds=15, warmup=3, budget_s=3.0)
    ref = cands["plan"]().float()
    diffs = {f: (cands[f]().float() - ref).abs().max().item() for f in FORMS}
    flops = 2.0 * slots * m * n
    rec = dict(case=name, experts=e, tokens_per_expert=tpe, m=m, n=n,
               ms=ms, tflops={f: kit.tflops(flops, ms[f]) for f in FORMS}, max_abs_diff=diffs, errors=err)
    out.append(rec)
    print(name, {f: round(ms[f], 3) if ms[f] else None for f in FORMS},
          {f: round(ms["plan"] / ms[f], 3) if ms[f] else None for f in FORMS}, diffs, err, flush=True)
    del g, x, a, b, ref
    torch.cuda.empty_cache()
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "records": out},
          open(sys.argv[1], "w"), separators=(",", ":"))
