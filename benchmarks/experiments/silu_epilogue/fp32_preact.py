"""The float32 Linear forward with a pre-activation output, TF32 off.

A training forward (an input that requires grad) also writes the pre-activation, which the
backward needs. With fewer tokens than outputs, gemmt runs x @ W.T transposed (C^T = W @ x^T,
copying x, not W); this times that forward against the same call without the pre-activation
(no grad) and against eager torch (F.linear + F.gelu), in the same run, and checks it
against a float64 reference.

    python benchmarks/experiments/silu_epilogue/fp32_preact.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import gemmt
from gemmt.bench_linear import _Replay, paired_ms

SHAPES = [(512, 4096, 11008), (2048, 4096, 11008), (512, 4096, 14336), (2048, 4096, 14336)]
ACT = "gelu_tanh"


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    rows = []
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda") / k ** 0.5
        b = torch.randn(n, device="cuda")
        xg = x.clone().requires_grad_()
        out = gemmt.linear(xg, w, b, ACT)
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        assert rel < 1e-5, (m, k, n, rel)
        train = _Replay([lambda: gemmt.linear(xg, w, b, ACT)] * 3)
        with torch.no_grad():
            infer = _Replay([lambda: gemmt.linear(x, w, b, ACT)] * 3)
        eager = _Replay([lambda: F.gelu(F.linear(xg, w, b), approximate="tanh")] * 3)
        t_train, t_infer = paired_ms(train, infer)
        t_train2, t_eager = paired_ms(train, eager)
        row = dict(m=m, k=k, n=n, activation=ACT, train_ms=t_train, infer_ms=t_infer,
                   train_ms_2=t_train2, eager_train_ms=t_eager, train_over_infer=t_train / t_infer,
                   eager_over_train=t_eager / t_train2, rel_err=rel)
        rows.append(row)
        print(f"{m:5d} x {k:5d} -> {n:6d}  training forward {t_train * 1e3:8.1f} us, no grad "
              f"{t_infer * 1e3:8.1f} us (x{t_train / t_infer:.3f}); eager {t_eager * 1e3:8.1f} us"
              f" (ratio {t_eager / t_train2:.3f}); rel err {rel:.1e}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           gemmt=gemmt.build_info(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
