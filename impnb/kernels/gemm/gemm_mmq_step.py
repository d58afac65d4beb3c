"""gemm_mmq's work on one 128-column K group (kernels/gemm/gemm_mmq.py's docstring has the
operand layout and each type's sums): a lane's loads of a W row's group as stored (ROWS, one per
type), and the group's mma steps generated as straight-line code (make_step), which gemm_mmq's
block body runs on x̂ from its shared ring and gemm_mmq_grouped's on the gathered rows of one
token tile.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.quant_blocks_k import k_scales

XROW = 160                  # bytes a token's x̂ row of a group takes in the shared stage (128 + 32:
                            # a warp's 8-byte fragment loads fall on distinct banks)
LO4 = qi.LO4
LO2 = qi.LO2
S6_BIAS = np.uint32(0x60606060)   # (q + 96) ^ 128 = q - 32 in int8, byte-wise for q < 64
SIGN8 = qi.SIGN8


@cuda.jit(device=True, inline=True)
def _s8(word, b):
    # byte b of word as a signed int32
    v = int32(qi.shr32(word, 8 * b) & 0xFF)
    return int32(v - 256) if v > 127 else v


@cuda.jit(device=True, inline=True)
def _q4_k_row(parts, r, K, grp, t):
    # row r's group grp: qs words (pair 0: w0, w1; pair 1: w2, w3) at columns 8t.., its superblock's header
    qs, hdr = parts
    base = r * (K // 8) + 16 * grp + 2 * t
    w0, w1 = qi.ldg_u32x2(qs, base)
    w2, w3 = qi.ldg_u32x2(qs, base + 8)
    h0, h1, h2, h3 = qi.ldg_u32x4_l1(hdr, 4 * (r * (K // 256) + (grp >> 1)))
    return (w0, w1, w2, w3), (h0, h1, h2, h3)


@cuda.jit(device=True, inline=True)
def q4_k_pair_scales(hdr, P):
    # (d sc, dmin m, d sc', dmin m') of sub-blocks 2P and 2P + 1 of a Q4_K superblock's header words
    sc0, mn0, sc1, mn1 = k_scales(hdr, 2 * P)
    d = qi.f16_to_f32(hdr[0] & qi.HALF)
    dm = qi.f16_to_f32(hdr[0] >> 16)
    return d * sc0, dm * mn0, d * sc1, dm * mn1


@cuda.jit(device=True, inline=True)
def _q4_k_scales(raw, P):
    # q4_k_pair_scales of the row's superblock (raw[1]: its header words)
    return q4_k_pair_scales(raw[1], P)


@cuda.jit(device=True, inline=True)
def _q4_k_scales_shared(raw, P):
    # _q4_k_scales's four values of pair P from the row's W stage in shared memory, where
    # gemm_mmq's W ring decoded them (raw[1]: the address of the row's decoded pairs)
    return ptx.ld_shared_v4_f32(raw[1] + 16 * (P & 1))


@cuda.jit(device=True, inline=True)
def _q6_k_row(parts, r, K, grp, t):
    # row r's half-superblock grp: ql words (columns 16m + 4t.., m < 4), qh words, 8 int8 scales, d
    ql, qh, sc, d = parts
    lb = r * (K // 8) + 16 * grp + t
    hb = r * (K // 16) + 8 * grp + t
    s0, s1 = qi.ldg_u32x2_l1(sc, r * (K // 16) + 8 * grp)
    return ((qi.ldg_u32_l1(ql, lb), qi.ldg_u32_l1(ql, lb + 4), qi.ldg_u32_l1(ql, lb + 8), qi.ldg_u32_l1(ql, lb + 12)),
            (qi.ldg_u32_l1(qh, hb), qi.ldg_u32_l1(qh, hb + 4)), (s0, s1), float32(d[r * (K // 256) + (grp >> 1)]))


@cuda.jit(device=True, inline=True)
def _q6_k_quants(raw, i):
    # sub-block i's 4 values of this lane (columns 16 i + 4t ..) as int8 q - 32
    q = (qi.shr32(raw[0][i & 3], 4 * (i >> 2)) & LO4) | ((qi.shr32(raw[1][i & 1], 2 * (i >> 1)) & LO2) << 4)
    return (q + S6_BIAS) ^ SIGN8


@cuda.jit(device=True, inline=True)
def _q8_0_row(parts, r, K, grp, t):
    # row r's group grp: 4 blocks' words at columns 8t.. (w[2j], w[2j + 1] of block j) and their scales
    qs, d = parts
    base = r * (K // 4) + 32 * grp + 2 * t
    w0, w1 = qi.ldg_u32x2(qs, base)
    w2, w3 = qi.ldg_u32x2(qs, base + 8)
    w4, w5 = qi.ldg_u32x2(qs, base + 16)
    w6, w7 = qi.ldg_u32x2(qs, base + 24)
    db = r * (K // 32) + 4 * grp
    return (w0, w1, w2, w3, w4, w5, w6, w7), (float32(d[db]), float32(d[db + 1]), float32(d[db + 2]),
                                              float32(d[db + 3]))


# -- each type's step over one group, generated as straight-line code (loops over constants stay
#    rolled in numba, and the loads, mma and epilogue of a chain then serialize) --

# dense: the group's x̂ stage in shared memory at xs (the kernel's ring); grouped (one token tile
# whose rows are gathered, x̂ from global memory): the lane's token row xrow (its B fragment's) and
# the rows d0, d1 of tokens 2t, 2t + 1 (its C columns')
_STEP_ARGS = "rows, grp, xs, acc, t, g"
_GROUPED_STEP_ARGS = "rows, grp, xq, xds, acc, xrow, d0, d1, MP, KW, t"


def _x_loads(L, n, j, both, grouped, bm):
    # token tile n's x̂ fragments and (d, s) of tokens 2t, 2t + 1 in x̂ group j of the K group:
    # dense from the stage (xa{n} the lane's row there, xd{n} its tokens' pairs of group 0),
    # grouped from xq, xds at group 4 grp + j
    if grouped:
        pair, one = "qi.ldg_u32x2_l1(xq, {})", "qi.ldg_u32_l1(xq, {})"
        at = (f"xr{n} + 8 * (4 * grp + {j})", f"xr{n} + 8 * (4 * grp + {j}) + 4")
    else:
        pair, one = "ptx.ld_shared_v2_u32({})", "ptx.ld_shared_u32({})"
        at = (f"xa{n} + {32 * j}", f"xa{n} + {32 * j + 16}")
    if both:
        L.append(f"    b0, b1 = {pair.format(at[0])}")
    else:
        L += [f"    be = {one.format(at[0])}", f"    bo = {one.format(at[1])}"]
    if not grouped:
        L.append(f"    dx0, sx0, dx1, sx1 = ptx.ld_shared_v4_f32(xd{n} + {8 * j * bm})")
        return
    L.append(f"    u0, u1 = qi.ldg_u32x2_l1(xds, 2 * ((4 * grp + {j}) * MP + d0))")
    L.append(f"    u2, u3 = qi.ldg_u32x2_l1(xds, 2 * ((4 * grp + {j}) * MP + d1))")
    L.append("    dx0, sx0, dx1, sx1 = qi.as_f32(u0), qi.as_f32(u1), qi.as_f32(u2), qi.as_f32(u3)")


def _acc(L, o, c, f, mins=None):
    # acc[o + i] += float(c_i) * (f_row * dx_tok) (- m_row * sx_tok): i = 0, 1 row g; 2, 3 row g + 8
    for i in range(4):
        fr, tok = f[i >> 1], i & 1
        L.append(f"    acc[{o + i}] += float32({c[i]}) * ({fr} * dx{tok})")
        if mins:
            L.append(f"    acc[{o + i}] -= {mins[i >> 1]} * sx{tok}")


def _step_source(ggml_type, ni: int, mt: int, grouped: bool = False) -> str:
    # lane rows x0 .. x{2 mt - 1}: tile i holds rows 2i (g) and 2i + 1 (g + 8); acc[4 mt n + 4 i ..]
    rows, tiles = range(2 * mt), range(mt)
    assert ni == 1 or not grouped
    bm = 8 * ni
    L = [f"def step({_GROUPED_STEP_ARGS if grouped else _STEP_ARGS}):"]
    L += [f"    x{r} = rows[{r}]" for r in rows]
    for n in range(ni):
        if grouped:
            L.append(f"    xr{n} = xrow * KW + {1 if ggml_type == T.Q6_K else 2} * t")
        else:
            L.append(f"    xa{n} = xs + {8 * n * XROW} + g * {XROW} + {4 if ggml_type == T.Q6_K else 8} * t")
            L.append(f"    xd{n} = xs + {bm * XROW + 64 * n} + 16 * t")
    if ggml_type == T.Q4_K:
        for p in range(2):
            L += [f"    s{r} = _q4_k_scales(x{r}, 2 * (grp & 1) + {p})" for r in rows]
            for hi in range(2):
                L += [f"    a{i}_{j} = qi.shr32(x{2 * i + (j & 1)}[0][{2 * p + (j >> 1)}], {4 * hi}) & LO4"
                      for i in tiles for j in range(4)]
                for n in range(ni):
                    _x_loads(L, n, 2 * p + hi, True, grouped, bm)
                    for i in tiles:
                        L.append(f"    c0, c1, c2, c3 = ptx.mma_s8_k32(a{i}_0, a{i}_1, a{i}_2, a{i}_3, b0, b1, "
                                 "0, 0, 0, 0)")
                        _acc(L, 4 * mt * n + 4 * i, ("c0", "c1", "c2", "c3"),
                             (f"s{2 * i}[{2 * hi}]", f"s{2 * i + 1}[{2 * hi}]"),
                             (f"s{2 * i}[{2 * hi + 1}]", f"s{2 * i + 1}[{2 * hi + 1}]"))
    elif ggml_type == T.Q6_K:
        for pr in range(4):
            L += [f"    e{r} = _q6_k_quants(x{r}, {2 * pr})" for r in rows]
            L += [f"    o{r} = _q6_k_quants(x{r}, {2 * pr + 1})" for r in rows]
            L += [f"    se{r} = _s8(x{r}[2][{pr >> 1}], {2 * (pr & 1)})" for r in rows]
            L += [f"    so{r} = _s8(x{r}[2][{pr >> 1}], {2 * (pr & 1) + 1})" for r in rows]
            for n in range(ni):
                _x_loads(L, n, pr, False, grouped, bm)
                for i in tiles:
                    r0, r1 = 2 * i, 2 * i + 1
                    L.append(f"    c0, c1, c2, c3 = ptx.mma_s8_k16(e{r0}, e{r1}, be, 0, 0, 0, 0)")
                    L.append(f"    f0, f1, f2, f3 = ptx.mma_s8_k16(o{r0}, o{r1}, bo, 0, 0, 0, 0)")
                    sums = [f"int32(se{r0 if k < 2 else r1} * c{k} + so{r0 if k < 2 else r1} * f{k})" for k in range(4)]
                    _acc(L, 4 * mt * n + 4 * i, sums, (f"x{r0}[3]", f"x{r1}[3]"))
    else:
        for j in range(4):
            for n in range(ni):
                _x_loads(L, n, j, True, grouped, bm)
                for i in tiles:
                    r0, r1 = 2 * i, 2 * i + 1
                    L.append(f"    c0, c1, c2, c3 = ptx.mma_s8_k32(x{r0}[0][{2 * j}], x{r1}[0][{2 * j}], "
                             f"x{r0}[0][{2 * j + 1}], x{r1}[0][{2 * j + 1}], b0, b1, 0, 0, 0, 0)")
                    _acc(L, 4 * mt * n + 4 * i, ("c0", "c1", "c2", "c3"), (f"x{r0}[1][{j}]", f"x{r1}[1][{j}]"))
    return "\n".join(L) + "\n"


def make_step(ggml_type, ni: int, mt: int, grouped: bool = False, shared_scales: bool = False):
    """The device function of one K group's mma steps (_step_source), for gemm_mmq's kernel (x̂
    from the block's shared stage) or, grouped, the routed experts' (kernels/moe/gemm_mmq_grouped.py);
    shared_scales: Q4_K's rows' scales read decoded from the W ring (a row's second item its address
    there) rather than decoded from its header."""
    scope = {"__name__": __name__, "qi": qi, "ptx": ptx, "float32": float32, "int32": int32, "LO4": LO4,
             "_q4_k_scales": _q4_k_scales_shared if shared_scales else _q4_k_scales,
             "_q6_k_quants": _q6_k_quants, "_s8": _s8}
    exec(_step_source(T(ggml_type), ni, mt, grouped), scope)
    return cuda.jit(device=True, inline=True)(scope["step"])


ROWS = {T.Q4_K: _q4_k_row, T.Q6_K: _q6_k_row, T.Q8_0: _q8_0_row}  # a lane's loads of a W row's K group
