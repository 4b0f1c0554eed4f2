"""Runs torch's F.linear (cuBLAS) on one Linear forward product a few times, for a profiler:
``python cublas_linear.py TOKENS IN OUT``."""

import sys

import torch
import torch.nn.functional as F


def main() -> None:
    """Three F.linear calls on random bf16 operands of the shape given on the command line."""
    tokens, fin, fout = (int(v) for v in sys.argv[1:4])
    x = torch.randn(tokens, fin, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(fout, fin, device="cuda", dtype=torch.bfloat16) / fin**0.5
    for _ in range(3):
        F.linear(x, w)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
