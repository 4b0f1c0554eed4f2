"""Does the decode of a 1 GB vocabulary weight depend on the token count, or on the state of
the memory it streams? Runs the benchmark's decode section (``gemmt.bench_linear.run_decode``:
gemmt against cuBLAS in alternating rounds of CUDA-graph replays, two weight copies) on the
4096 -> 128256 layer three times, each on freshly allocated weights: token counts ascending,
descending, and interleaved.

    PYTHONPATH=python GEMMT_LIBRARY=... python benchmarks/experiments/decode_vocab_order/decode_vocab_order.py
"""

from __future__ import annotations

import gemmt.bench_linear as bench

ORDERS = ([1, 2, 4, 8, 16, 32, 64], [64, 32, 16, 8, 4, 2, 1], [8, 16, 8, 16, 2, 16, 2])


def main() -> None:
    """Prints the copy bandwidth, then one line per order: (tokens, gemmt us, cuBLAS us)."""
    bw = bench.copy_gbps()
    print("copy GB/s", round(bw))
    bench.LAYERS = [(4096, 128256)]
    for order in ORDERS:
        bench.DECODE_TOKENS = order
        recs = bench.run_decode(False, bw)
        times = [(r["tokens"], round(r["ours_us"], 1), round(r["ref_us"], 1)) for r in recs]
        print("ORDER", order, times, flush=True)


if __name__ == "__main__":
    main()
