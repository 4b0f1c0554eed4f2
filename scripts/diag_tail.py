import json, sys, torch, gemmt
res = {}
torch.manual_seed(0)
for variant in ["inf", "inf_a", "nan", "zero"]:
    for a_layout in ["contig", "mmajor"]:
        m = n = 128
        x = torch.randn(200, m, device="cuda", dtype=torch.bfloat16)
        a = x.t().contiguous() if a_layout == "contig" else x.t()
        b = torch.randn(200, n, device="cuda", dtype=torch.bfloat16)
        fill = {"inf": float("inf"), "inf_a": float("inf"), "nan": float("nan"), "zero": 0.0}[variant]
        if variant == "inf_a":
            x[120:] = fill
            a = x.t().contiguous() if a_layout == "contig" else x.t()
        else:
            b[120:] = fill
        offs = torch.tensor([70, 120], device="cuda", dtype=torch.int32)
        out = torch.ops.gemmt.grouped_mm(a, b, offs).float().cpu()
        A, B = a.float().cpu(), b.float().cpu()
        ref = torch.stack([A[:, :70] @ B[:70], A[:, 70:120] @ B[70:120]])
        bad = ~torch.isfinite(out)
        r = dict(nonfinite=int(bad.sum()), nonfinite_rows=sorted(set(bad.nonzero()[:, 1].tolist()))[:10],
                 nonfinite_groups=sorted(set(bad.nonzero()[:, 0].tolist())),
                 maxerr_g0=float((out[0] - ref[0]).abs().nan_to_num(1e30).max()),
                 maxerr_g1=float((out[1] - ref[1]).abs().nan_to_num(1e30).max()))
        res[f"{variant}/{a_layout}"] = r
        print(variant, a_layout, r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
