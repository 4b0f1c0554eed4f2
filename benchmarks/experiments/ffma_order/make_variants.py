"""Writes gemm_simt_exp.cu: kernels/gemm_simt.cu as of commit b397723 with an ORDER template
parameter that selects the FFMA order of the interior instances (see README.md).

    git show b397723:kernels/gemm_simt.cu | python make_variants.py > gemm_simt_exp.cu
"""
import sys

ORDERS = {
    0: "for j: for i",  # column by column (the b397723 order)
    1: "for i: for j",  # row by row
    2: "for i: for j (reversed on odd i)",  # row snake
    3: "for j: for i (reversed on odd j)",  # column snake
    4: "for 4-row block: for j: for i in block",
    5: "for 4-column half: for i: for j in half",
    6: "for row pair: for j: for i in pair",
    7: "for column pair: for i: for j in pair",
    8: "for column pair: for i (snake): for j in pair (snake)",
    9: "for 4-row block: for j (snake): for i in block (snake)",
    10: "column snake from the last column",
}

BODY = {
    0: "for (int j = 0; j < TN; ++j) for (int i = 0; i < TM; ++i) F(i, j);",
    1: "for (int i = 0; i < TM; ++i) for (int j = 0; j < TN; ++j) F(i, j);",
    2: "for (int i = 0; i < TM; ++i) for (int jj = 0; jj < TN; ++jj) F(i, (i & 1) ? TN - 1 - jj : jj);",
    3: "for (int j = 0; j < TN; ++j) for (int ii = 0; ii < TM; ++ii) F((j & 1) ? TM - 1 - ii : ii, j);",
    4: "for (int ib = 0; ib < TM / 4; ++ib) for (int j = 0; j < TN; ++j) for (int i = ib * 4; i < ib * 4 + 4; ++i) F(i, j);",
    5: "for (int jh = 0; jh < TN / 4; ++jh) for (int i = 0; i < TM; ++i) for (int j = jh * 4; j < jh * 4 + 4; ++j) F(i, j);",
    6: "for (int ip = 0; ip < TM / 2; ++ip) for (int j = 0; j < TN; ++j) for (int i = 2 * ip; i < 2 * ip + 2; ++i) F(i, j);",
    7: "for (int jp = 0; jp < TN / 2; ++jp) for (int i = 0; i < TM; ++i) for (int j = 2 * jp; j < 2 * jp + 2; ++j) F(i, j);",
    8: "for (int jp = 0; jp < TN / 2; ++jp) for (int ii = 0; ii < TM; ++ii) for (int jj = 0; jj < 2; ++jj) F((jp & 1) ? TM - 1 - ii : ii, 2 * jp + ((ii & 1) ? 1 - jj : jj));",
    9: "for (int ib = 0; ib < TM / 4; ++ib) for (int jj = 0; jj < TN; ++jj) for (int ii = 0; ii < 4; ++ii) F(ib * 4 + ((jj & 1) ? 3 - ii : ii), (ib & 1) ? TN - 1 - jj : jj);",
    10: "for (int jj = 0; jj < TN; ++jj) for (int ii = 0; ii < TM; ++ii) F((jj & 1) ? TM - 1 - ii : ii, TN - 1 - jj);",
}


def ffma_order() -> str:
    out = ["template <int ORDER, int TM, int TN>",
           "__device__ __forceinline__ void ffma_order(float (&acc)[TM][TN], const float* a, const float* b) {",
           "#define F(I, J) acc[I][J] = fmaf(a[I], b[J], acc[I][J])"]
    for o, body in BODY.items():
        out.append(f"  {'if' if o == 0 else '} else if'} constexpr (ORDER == {o}) {{  // {ORDERS[o]}")
        out.append("#pragma unroll")
        out.append("    " + body.replace(") for", ")\n#pragma unroll\n    for"))
    out += ["  }", "#undef F", "}", ""]
    return "\n".join(out)


def main() -> None:
    s = sys.stdin.read()
    head = "template <class T, class Cfg, int AMODE, int BMODE, bool INTERIOR, bool STREAMK = false>\n__global__"
    assert head in s
    s = s.replace(head, ffma_order() + head.replace("STREAMK = false>", "STREAMK = false, int ORDER = 0>"))
    loop = """        if constexpr (INTERIOR) {
#pragma unroll
          for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i][j] = fmaf(af[kk & 1][i], bf[kk & 1][j], acc[i][j]);
        } else {"""
    assert loop in s
    s = s.replace(loop, """        if constexpr (INTERIOR) {
          ffma_order<ORDER>(acc, af[kk & 1], bf[kk & 1]);
        } else {""")
    # The stream-k instance may also run whole tiles (blocks after the first sk.blocks), so
    # that one launch can hold both kinds ("skinst_dp" variants time its main loop alone).
    for a, b in [
        ("struct StreamKParams {\n", "struct StreamKParams {\n  int blocks;\n"),
        ("""  if constexpr (STREAMK) {
    it = p.sk.begin(blockIdx.x);
    it_end = p.sk.begin(static_cast<int64_t>(blockIdx.x) + 1);
  }""", """  if constexpr (STREAMK) {
    if (blockIdx.x < p.sk.blocks) {
      it = p.sk.begin(blockIdx.x);
      it_end = p.sk.begin(static_cast<int64_t>(blockIdx.x) + 1);
    }
  }"""),
        ("""    if constexpr (STREAMK) {
      sk_tile = static_cast<int>(it / p.sk.k_tiles);""", """    if (STREAMK && blockIdx.x >= p.sk.blocks) {
      swizzle_tile<kRasterGroup>(blockIdx.x - p.sk.blocks, p.tiles_m, p.tiles_n, tm, tn);
      k_begin = 0;
      k_end = p.k;
    } else if constexpr (STREAMK) {
      sk_tile = static_cast<int>(it / p.sk.k_tiles);"""),
    ]:
        assert a in s
        s = s.replace(a, b)
    sys.stdout.write(s)


if __name__ == "__main__":
    main()
