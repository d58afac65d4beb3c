"""Int8 tensor-core GEMM over quantized weights for a batched decode step's rows (the idea of
llama.cpp's MMQ): C (M, N) float32 [+]= x̂ (M, K) · dequant(W)ᵀ, x̂ the activations in int8 with a
scale every 32 columns (quantize_x32), W read as stored.

gemm_few decodes each weight to fp16 for mma m16n8k16 (a few ALU operations a weight, again for
every 64 rows of A). Here the quants go to the tensor cores as stored bytes: Q4_K's nibbles are
int8 after one mask a 4 weights, Q6_K's 6-bit values after two more operations, Q8_0's bytes as
they are, and the block scales multiply each 32 columns' int32 sums (mma.sync m16n8k32, s8; Q6_K's
16-column scales: two m16n8k16 sums joined in int32 by their int8 scales first).

Operands: W is the m16 operand, the tokens the n8 one. Lane (g, t) = (lane >> 2, lane & 3) holds
W rows g and g + 8 of a tile; of each 32-column group (an x̂ group) it holds columns 8t .. 8t + 7
of those rows (k labels 4t..4t+3 <- columns 8t..8t+3, 16+4t..16+4t+3 <- 8t+4..8t+7), so one 8-byte
load of a W row and one of a token's x̂ give its fragments (Q6_K's k16 steps: columns 16 s + 4t
.. + 3 of sub-block s). C: rows g, g + 8 at tokens 2t, 2t + 1, so the lane's own rows' scales
and its tokens' (d, s) finish its sums:

    Q4_K: acc += float(Σ q x̂) · (d sc_j · dx) - dmin m_j · sx     (sx = dx · Σ x̂ of the group)
    Q6_K: acc += float(sc_a Σ_a + sc_b Σ_b) · (d · dx)           (q - 32 made int8 exactly)
    Q8_0: acc += float(Σ q x̂) · (d · dx)

Work: a warp owns 16 mt W rows (mt m16 tiles, mt_for's 1 or 2), a block 4 warps and NI n8 tiles
of tokens (8 NI, at most 32; more in 32-token slabs), split-K over 128-column groups: grid
(ceil(N / 64 mt), S, ceil(M / (8 NI))), NI <= 4; partial tiles to part[s], added in split order
by gemm_quant_splitk's reduce (deterministic). The next group's raw W words are in flight in
registers while this one multiplies; the block's x̂ (8 NI tokens' 128 columns and their scales a
group, written by quantize_x32 just before) comes through a 3-stage cp.async ring in shared
memory, two groups ahead, one barrier a group: read through L1 instead, each lane's x̂ loads sat
on the step's chains, and a miss to L2 stalled them (1.1-1.25x slower at 8-16 tokens).

With a W ring (ring=True, Q4_K: W_RING_TYPES; tuning.MMQ_W_RING) the block's W rows come through
the same cp.async ring as x̂, both in one commit group a K group: two groups of W in flight a block
instead of one in registers, and no registers holding the next group (a warp's lanes then read
their words from shared memory, rows WROW bytes apart so those loads fall on distinct banks). Each
row's 6-bit scales and mins are decoded once there, by the thread that copied its header, while
the block multiplies the group before (without the ring each of the four lanes holding a row
decodes them); at two token and two W tiles the build then takes 128 registers instead of 168:
four blocks an SM instead of three.

x̂ is quant_x32's QuantX32 (quantize_x32, or another kernel's int8 output).

The kernel's work is a device function of its weight, rows and output columns (body_of), which
gemm_mmq_pair.py's kernel runs for two weights in one launch; a K group's lane loads and mma
steps are gemm_mmq_step.py's.

Requirements (asserted): K a multiple of 256 (Q4_K, Q6_K) or 128 (Q8_0); N % 8 == 0.
Numpy reference: gemm_mmq_ref.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm.gemm_few import block_split
from impnb.kernels.gemm.gemm_mmq_step import ROWS, XROW, make_step, q4_k_pair_scales
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D, reduce_parts
from impnb.kernels.gemm.quant_x32 import U32_2D, QuantX32, dequantize_x32_ref, quantize_x32, quantize_x32_ref
from impnb.kernels.gemv.gemv import parts_type
from impnb.launch import launch
from impnb.quants import dequantize

WARPS = 4
THREADS = 32 * WARPS
GROUP = 128                 # K columns an iteration (the split-K unit)
MT = 2                      # m16 tiles of W a warp (a lane holds 2 MT rows): mt_for's choice
MT2_MIN_N = 8192            # mt_for: W rows past which a warp takes MT tiles (at up to 16 tokens)
MAX_NI = 4                  # n8 token tiles a block at most (32 tokens; more: grid.z, W again from L2)
# (type, ni, mt) -> register cap: two token tiles and two W tiles of Q4_K at 168 (3 blocks an SM, not
# 2: 1.0-1.5x at the 8B's shapes, 16 rows); Q6_K and Q8_0 spill there
REGS = {(T.Q4_K, 2, 2): 168}
TYPES = (T.Q4_K, T.Q6_K, T.Q8_0)
XSTAGES = 3                 # x̂ stages in the kernel's ring (and W's, with a W ring)
W_RING_TYPES = (T.Q4_K,)    # the types whose W can come through the ring
WROW = 96                   # bytes a W row of a group takes in the W ring: Q4_K's 64 bytes of quants
                            # and its superblock's 16-byte header, padded so the 8 rows a warp's
                            # 8-byte loads read at once (2 phases of 4 rows) fall on distinct banks
# (type, ni, mt) -> register cap with a W ring
RING_REGS = {(T.Q4_K, 2, 2): 128}  # two token tiles and two W tiles: four blocks an SM, no spills
# (type, ni, mt, ring) -> the registers a build takes at most (its REGS / RING_REGS cap, else the
# compiler's choice; tests/test_kernel_build.py holds each build to it): blocks_per_sm's input
REGISTERS = {
    (T.Q4_K, 1, 1, False): 90, (T.Q4_K, 1, 2, False): 151, (T.Q4_K, 2, 1, False): 118, (T.Q4_K, 2, 2, False): 168,
    (T.Q4_K, 4, 1, False): 132,
    (T.Q6_K, 1, 1, False): 91, (T.Q6_K, 1, 2, False): 155, (T.Q6_K, 2, 1, False): 117, (T.Q6_K, 2, 2, False): 203,
    (T.Q6_K, 4, 1, False): 130,
    (T.Q8_0, 1, 1, False): 95, (T.Q8_0, 1, 2, False): 166, (T.Q8_0, 2, 1, False): 119, (T.Q8_0, 2, 2, False): 202,
    (T.Q8_0, 4, 1, False): 128,
    (T.Q4_K, 1, 1, True): 67, (T.Q4_K, 1, 2, True): 96, (T.Q4_K, 2, 1, True): 81, (T.Q4_K, 2, 2, True): 128,
    (T.Q4_K, 4, 1, True): 117,
}


def gemm_mmq_ref(x: np.ndarray, raw: np.ndarray, ggml_type, c: np.ndarray | None = None) -> np.ndarray:
    """float64 x̂ · dequant(raw)ᵀ (+ c): what gemm_mmq computes up to float32 summation."""
    M = x.shape[0]
    q, ds = quantize_x32_ref(x)
    w = dequantize(np.asarray(raw).view(np.uint8).reshape(raw.shape[0], -1), T(ggml_type))
    y = dequantize_x32_ref(q, ds)[:M] @ w.reshape(raw.shape[0], -1).astype(np.float64).T
    return y if c is None else y + c


def slab_rows(M: int) -> int:
    """x̂ rows a launch of M tokens reads: M rounded up to its blocks' token slabs."""
    bm = 8 * ni_for(M)
    return -(-M // bm) * bm


# -- the GEMM --

def stage_bytes(bm: int) -> int:
    """Shared bytes of one x̂ stage of bm tokens: each token's 128 bytes of the group (rows XROW
    apart), then the group's four (d, s) pairs a token, (j, token) at bm XROW + 8 (j bm + token)."""
    return bm * XROW + 4 * bm * 8


def _stage_x(bm: int):
    units = 10 * bm  # 16-byte copies a stage: 8 a token's x̂, 2 a token's four (d, s)

    @cuda.jit(device=True, inline=True)
    def stage_x(dst, xq, xds, m0, MP, KW, grp):
        # x̂ of tokens m0 .. m0 + bm - 1 in group grp (x̂ columns 128 grp ..) -> the stage at dst
        for i in range(-(-units // THREADS)):
            u = cuda.threadIdx.x + THREADS * i
            if u < 8 * bm:
                r = u >> 3
                ptx.cp_async_16(dst + r * XROW + 16 * (u & 7), xq, (m0 + r) * KW + 32 * grp + 4 * (u & 7))
            elif u < units:
                v = u - 8 * bm
                j = v // (bm // 2)
                w = v - j * (bm // 2)
                ptx.cp_async_16(dst + bm * XROW + 8 * bm * j + 16 * w, xds, ((4 * grp + j) * MP + m0) * 2 + 4 * w)
    return stage_x


def w_stage_bytes(bn: int) -> int:
    """Shared bytes of one W stage of bn rows (Q4_K: each row's group of quants, then its header)."""
    return bn * WROW


def _stage_w(bn: int):
    assert bn % 32 == 0 and bn <= THREADS

    @cuda.jit(device=True, inline=True)
    def stage_w(dst, parts, r0, N, K, grp):
        # W rows r0 .. r0 + bn - 1 (clamped to N - 1) in group grp -> the stage at dst: a row's 64
        # bytes of quants by 4 threads, 16 bytes each, then its header by one thread
        qs, hdr = parts
        tid = cuda.threadIdx.x
        c = tid & 3
        for i in range(bn // 32):
            r = (tid >> 2) + 32 * i
            row = min(r0 + r, N - 1)
            ptx.cp_async_16(dst + r * WROW + 16 * c, qs, row * (K // 8) + 16 * grp + 4 * c)
        if tid < bn:
            row = min(r0 + tid, N - 1)
            ptx.cp_async_16(dst + tid * WROW + 64, hdr, 4 * (row * (K // 256) + (grp >> 1)))
    return stage_w


@cuda.jit(device=True, inline=True)
def _q4_k_row_shared(ws, lr, t):
    # _q4_k_row's quant words of the block's row lr from the W stage at ws, and the address of the
    # row's decoded scales there (_decode_w; make_step's shared_scales)
    a = ws + lr * WROW + 8 * t
    w0, w1 = ptx.ld_shared_v2_u32(a)
    w2, w3 = ptx.ld_shared_v2_u32(a + 32)
    return (w0, w1, w2, w3), ws + lr * WROW + 64


def _decode_w(bn: int):
    @cuda.jit(device=True, inline=True)
    def decode_w(ws, grp):
        # thread r < bn: row r's superblock header in the W stage at ws (its own copy, landed) ->
        # in its place, for pairs p = 0, 1 of group grp, q4_k_pair_scales's four values
        r = cuda.threadIdx.x
        if r < bn:
            a = ws + r * WROW + 64
            hdr = ptx.ld_shared_v4_u32(a)
            for p in range(2):
                v0, v1, v2, v3 = q4_k_pair_scales(hdr, 2 * (grp & 1) + p)
                ptx.st_shared_v4_u32(a + 16 * p, qi.f32_bits(v0), qi.f32_bits(v1), qi.f32_bits(v2), qi.f32_bits(v3))
    return decode_w


def _stage(bm: int, bn: int, ring: bool):
    """The device function staging group grp: x̂ of tokens m0 .. at xs and, with a W ring, W rows
    r0 .. at ws."""
    stage_x = _stage_x(bm)
    if not ring:
        @cuda.jit(device=True, inline=True)
        def stage(xs, ws, xq, xds, parts, m0, MP, KW, r0, N, K, grp):
            stage_x(xs, xq, xds, m0, MP, KW, grp)
        return stage
    stage_w = _stage_w(bn)

    @cuda.jit(device=True, inline=True)
    def stage_ring(xs, ws, xq, xds, parts, m0, MP, KW, r0, N, K, grp):
        stage_w(ws, parts, r0, N, K, grp)
        stage_x(xs, xq, xds, m0, MP, KW, grp)
    return stage_ring


# the block's work; the W rows' loads differ by ring (body_of): without it {rows} clamps the lane's
# rows, {first} / {next} load group g0's / the next group's words into registers and {advance}
# makes those the current; with it {rows} places the lane's rows in the block, {first} / {advance}
# decode group g0's / the next group's scales in their W stage once it has landed, and {current}
# reads the group's words from its W stage
_BODY = """
def body(xq, xds, parts, part, bx, col0, N, xs0):
    s = cuda.blockIdx.y
    M = part.shape[1]
    KW = xq.shape[1]
    K = 4 * KW
    MP = xq.shape[0]
    g0, g1, m0, warp, g, t = block_split(K // GROUP, bm)
    nb = bx * bn + warp * {warp_rows} + g  # this lane's rows: nb + 8 i (tile i // 2)
    ws0 = xs0 + XSTAGES * sbytes  # the W ring after x̂'s, with one
{rows}
    stage(xs0, ws0, xq, xds, parts, m0, MP, KW, bx * bn, N, K, g0)
    ptx.cp_async_commit()
    if g0 + 1 < g1:
        stage(xs0 + sbytes, ws0 + wbytes, xq, xds, parts, m0, MP, KW, bx * bn, N, K, g0 + 1)
    ptx.cp_async_commit()
    acc = cuda.local.array(n_acc, float32)
    for i in range(n_acc):
        acc[i] = float32(0.0)
{first}
    for grp in range(g0, g1):
{next}
        i = grp - g0
        ptx.cp_async_wait_group(1)
        cuda.syncthreads()  # the group's stages have landed; every warp is done with those it frees
        if grp + 2 < g1:
            stage(xs0 + ((i + 2) % 3) * sbytes, ws0 + ((i + 2) % 3) * wbytes, xq, xds, parts, m0, MP, KW,
                  bx * bn, N, K, grp + 2)
        ptx.cp_async_commit()
{current}
        step(({xs},), grp, xs0 + (i % 3) * sbytes, acc, t, g)
{advance}
    ptx.cp_async_wait_all()
    # -- epilogue: acc[4 mt n + 2 i + j]: row nb + 8 i, token 8 n + 2t + j --
    for n in range(ni):
        for j in range(2):
            tok = m0 + 8 * n + 2 * t + j
            if tok < M:
                for i in range({lane_rows}):
                    row = nb + 8 * i
                    if row < N:
                        part[s, tok, col0 + row] = acc[{lane_rows} * 2 * n + 2 * i + j]
"""


def body_of(ggml_type, ni: int, mt: int, ring: bool = False):
    """The device function of one block's work, body(xq, xds, parts, part, bx, col0, N, xs0): W
    rows bn bx .. of a weight of N rows (parts) against tokens bm blockIdx.z .. over split
    blockIdx.y, its partial tile into part[s] from column col0; xs0 the block's ring in shared
    memory (ring_bytes(ni, mt, ring) of it: with a W ring, W's stages follow x̂'s)."""
    assert not ring or T(ggml_type) in W_RING_TYPES, f"no W ring for {T(ggml_type).name}"
    lane_rows = 2 * mt

    def lines(fmt):  # fmt for each of the lane's rows i (offset o = 8 i in the warp's rows)
        return "\n".join(fmt.format(i=i, o=8 * i) for i in range(lane_rows))
    xs = ", ".join(f"x{i}" for i in range(lane_rows))
    if ring:
        regs = {"rows": f"    lr0 = warp * {16 * mt} + g  # the lane's rows in the block: lr0 + 8 i",
                "first": "    ptx.cp_async_wait_group(1)\n    decode_w(ws0, g0)", "next": "",
                "advance": "        if grp + 1 < g1:\n            ptx.cp_async_wait_group(1)\n"
                           "            decode_w(ws0 + ((i + 1) % 3) * wbytes, grp + 1)",
                "current": lines("        x{i} = _q4_k_row_shared(ws0 + (i % 3) * wbytes, lr0 + {o}, t)")}
    else:
        regs = {"rows": lines("    r{i} = min(nb + {o}, N - 1)"),
                "first": lines("    x{i} = load_row(parts, r{i}, K, g0, t)"),
                "next": "        gn = min(grp + 1, g1 - 1)\n" + lines("        y{i} = load_row(parts, r{i}, K, gn, t)"),
                "current": "", "advance": f"        {xs} = {', '.join(f'y{i}' for i in range(lane_rows))}"}
    src = _BODY.format(warp_rows=16 * mt, lane_rows=lane_rows, xs=xs, **regs)
    bm, bn = 8 * ni, block_rows(mt)
    scope = {"__name__": __name__, "cuda": cuda, "float32": float32, "block_split": block_split, "GROUP": GROUP,
             "load_row": ROWS[T(ggml_type)], "_q4_k_row_shared": _q4_k_row_shared,
             "step": make_step(ggml_type, ni, mt, shared_scales=ring), "decode_w": _decode_w(bn) if ring else None,
             "bm": bm, "bn": bn, "n_acc": 4 * mt * ni, "ni": ni, "ptx": ptx,
             "XSTAGES": XSTAGES, "stage": _stage(bm, bn, ring), "sbytes": stage_bytes(bm),
             "wbytes": w_stage_bytes(bn) if ring else 0}
    exec(src, scope)
    return cuda.jit(device=True, inline=True)(scope["body"])


def ring_bytes(ni: int, mt: int, ring: bool = False) -> int:
    """Shared bytes of a block's ring: x̂'s stages, then W's with a W ring."""
    return XSTAGES * (stage_bytes(8 * ni) + (w_stage_bytes(block_rows(mt)) if ring else 0))


@lru_cache(maxsize=None)
def gemm_mmq_kernel(ggml_type, ni: int, regs: int = 0, mt: int = MT, ring: bool = False, trigger: bool = False):
    """The split-K kernel of one weight type, ni n8 token tiles a block and mt m16 tiles of W a
    warp, capped at `regs` registers a thread where given; W through the cp.async ring (ring) or
    a group ahead in registers. trigger: each block lets the next kernel launch as it starts
    (griddepcontrol.launch_dependents) rather than as it exits."""
    body = body_of(ggml_type, ni, mt, ring)
    ring_words, align = ring_bytes(ni, mt, ring) // 4, ptx.SMEM_ALIGN

    # grid (ceil(N / bn), S, ceil(M / bm)), block THREADS: block (x, s, z) owns W rows bn x ..
    # and tokens bm z .., over split s of the K groups; its partial tile -> part[s] (S, M, N).
    # Launched without programmatic serialization (it never waits on the grid): the kernel before
    # it has finished when it starts.
    def _gemm_mmq_kernel(xq, xds, parts, part):
        if trigger:
            ptx.grid_dep_launch()
        smem = cuda.shared.array(ring_words, uint32, alignment=align)
        body(xq, xds, parts, part, cuda.blockIdx.x, 0, part.shape[2], ptx.smem_addr(smem, 0))

    return cuda.jit(_gemm_mmq_kernel, max_registers=regs) if regs and not ptx.SIM else cuda.jit(_gemm_mmq_kernel)


def block_rows(mt: int = MT) -> int:
    """W rows a block of mt m16 tiles a warp."""
    return 16 * mt * WARPS


def ni_for(M: int) -> int:
    """n8 token tiles a block for M tokens: 1, 2 or 4 (M > 32 in 32-token slabs)."""
    return 1 if M <= 8 else 2 if M <= 16 else MAX_NI


def mt_for(M: int, N: int) -> int:
    """m16 tiles of W a warp: MT for up to 16 tokens of a matrix of more than MT2_MIN_N rows, else
    one (twice the blocks of half the rows; four token tiles of two W tiles spill)."""
    return MT if M <= 16 and N > MT2_MIN_N else 1


def blocks_per_sm(ggml_type, ni: int, mt: int, ring: bool = False) -> int:
    """Blocks of a build an SM holds at once: its REGISTERS (a warp's registers in units of 256,
    one warp of the block on each of the SM's four 16K-register schedulers) and its ring in the
    228 KB of shared memory (1 KB more a block the driver takes)."""
    regs = REGISTERS[(T(ggml_type), ni, mt, ring)]
    return min(64 // -(-regs // 8), 228 * 1024 // (ring_bytes(ni, mt, ring) + 1024), 16)


def splits_for(M: int, N: int, K: int, sms: int = 132, mt: int | None = None, ggml_type=None,
               ring: bool | None = None) -> int:
    """Splits of a launch of M tokens on an N x K weight of ggml_type: as many as one wave of the
    build's resident blocks takes (blocks_per_sm; more splits than fill the wave start a second one,
    fewer leave SMs short of the warps that hide the loads' latency: the 8B's 16 and 32 rows
    measured), each at least two groups deep. Without a type (gemm_mmq_pair's two weights), or with
    tuning.MMQ_WAVE_SPLITS off: about two blocks an SM (four at one token and one W tile a warp)."""
    mt = mt or mt_for(M, N)
    ni = ni_for(M)
    blocks = -(-N // block_rows(mt)) * -(-M // (8 * ni))
    if ggml_type is None or not tuning.MMQ_WAVE_SPLITS:
        per_sm = 4 if (ni, mt) == (1, 1) else 2
        return max(1, min(-(-per_sm * sms // blocks), K // GROUP // 2))
    ring = ring_for(ggml_type) if ring is None else ring
    return max(1, min(blocks_per_sm(ggml_type, ni, mt, ring) * sms // blocks, K // GROUP // 2))


def supports(ggml_type, K: int) -> bool:
    t = T(ggml_type)
    return t in TYPES and K % max(GROUP, GGML_QUANT_SIZES[t][0]) == 0


def ring_for(ggml_type) -> bool:
    """Whether a weight of ggml_type takes the W ring (tuning.MMQ_W_RING, the types it has)."""
    return tuning.MMQ_W_RING and T(ggml_type) in W_RING_TYPES


def _launch(xq: QuantX32, M: int, w: PackedWeight, ys, n0: int, n1: int, part, stream, splits: int,
            accumulate: bool, ni: int | None = None, regs: int | None = None, mt: int | None = None,
            reduce: bool = True, ring: bool | None = None, trigger: bool = False):
    N, K = w.rows, w.cols
    mt = mt or mt_for(M, N)
    ni = ni or ni_for(M)
    ring = ring_for(w.ggml_type) if ring is None else ring
    regs = (RING_REGS if ring else REGS).get((T(w.ggml_type), ni, mt), 0) if regs is None else regs
    assert xq.q.shape[1] == K // 4 and xq.q.shape[0] >= -(-M // (8 * ni)) * 8 * ni and N % 8 == 0
    for y in ys:
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == M
    assert supports(w.ggml_type, K), f"no int8 GEMM for {T(w.ggml_type).name} at K={K}"
    assert 1 <= splits <= K // GROUP, f"{splits} splits of {K // GROUP} groups"
    assert part.dtype == np.float32 and part.shape == (splits, M, N) and part.is_c_contiguous()
    # an early reduce's blocks would sit waiting on the SMs the GEMM's later blocks need
    assert not (trigger and reduce), "the next kernel launched early: the partials left to a kernel that waits"
    launch(gemm_mmq_kernel(T(w.ggml_type), ni, regs, mt, ring, trigger), (-(-N // block_rows(mt)), splits, -(-M // (8 * ni))),
           THREADS, stream,
           xq.q, xq.ds, w.parts, part)
    if reduce:
        reduce_parts(part, ys, n0, n1, accumulate, stream)


def gemm_mmq(x, xq: QuantX32, w: PackedWeight, c, part, stream, splits: int, accumulate: bool = False,
             ni: int | None = None, regs: int | None = None, norm: tuple | None = None, mt: int | None = None,
             quantized: bool = False, reduce: bool = True, ring: bool | None = None):
    """c (M, N) float32 = x̂ · dequant(w)ᵀ (c += with accumulate), x (M, K) float32 quantized into
    xq first (of RMSNorm(x) * wn with norm (wn, eps); quantized: xq holds it already, written by
    another kernel, x read for its shape alone); part: a float32 scratch (splits, M, N), where
    reduce=False leaves the partial products (c untouched). ni (token tiles a block, ni_for's by
    default), regs (a register cap, REGS's or RING_REGS's by default), mt (m16 tiles of W a warp)
    and ring (W through the cp.async ring; ring_for's by default) are for scripts/bench_gemm_few.py
    and the tests."""
    M = x.shape[0]
    assert x.shape[1] == w.cols and c.shape == (M, w.rows) and not (quantized and norm is not None)
    if not quantized:
        quantize_x32(x, xq, stream, norm)
    _launch(xq, M, w, (c, c, c), w.rows, 0, part, stream, splits, accumulate, ni, regs, mt, reduce, ring)


def gemm_mmq_split(x, xq: QuantX32, w: PackedWeight, ys, part, stream, splits: int, norm: tuple | None = None,
                   reduce: bool = True, quantized: bool = False, trigger: bool = False):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = x̂ · dequant(W rows of
    i)ᵀ, each N_i a multiple of 4; xq, part, reduce and quantized as in gemm_mmq. trigger (with
    reduce=False): the next kernel, one that waits on the grid before it reads the partials, may
    launch as the GEMM's blocks start (tuning.MMQ_TRIGGER)."""
    M = x.shape[0]
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    assert not (quantized and norm is not None)
    if not quantized:
        quantize_x32(x, xq, stream, norm)
    _launch(xq, M, w, (y0, y1, y2), n0, n1, part, stream, splits, False, reduce=reduce, trigger=trigger)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemm_mmq_kernel(t, ni, (RING_REGS if ring else REGS).get((t, ni, mt), 0), mt, ring),
         types.void(U32_2D, F32_3D, parts_type(t), F32_3D), {"max_registers": REGISTERS[(t, ni, mt, ring)]})
        for ring in (False, True) for t in (W_RING_TYPES if ring else TYPES) for ni in (1, 2, 4)
        for mt in ((1, MT) if ni < MAX_NI else (1,))
    ] + [  # the batch's Q|K|V at 8 rows letting attention launch as it starts
        (gemm_mmq_kernel(T.Q4_K, 1, RING_REGS.get((T.Q4_K, 1, 1), 0), 1, True, True),
         types.void(U32_2D, F32_3D, parts_type(T.Q4_K), F32_3D), {"max_registers": REGISTERS[(T.Q4_K, 1, 1, True)]})
    ]
