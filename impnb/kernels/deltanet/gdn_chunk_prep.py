"""The state-independent half of the chunked Gated DeltaNet prefill (gdn_chunked.py): every chunk of
L tokens of every (sequence, V head) at once, written to a workspace the state kernel then reads
chunk after chunk. Per chunk, c the cumulative log decay over it, e = exp(c) (gdn_chunked.py's
header has the whole algebra; numpy twin: reference.delta_rule_wy):
    A = strictly_lower(beta_i k_i·k_j exp(c_i - c_j)),  Tm = (I + A)^-1   (fp32 triangular solve)
    W = Tm (beta e K),  U = Tm (beta V),  P = lower(Q Kᵀ exp(c_i - c_j)),  K_end = K exp(c_L - c)
Products on mma.sync m16n8k16, fp16 operands, fp32 accumulators; fragment layouts as in
attention_fa2.py's header (A row-major pairs along k, B n-major pairs along k).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import shfl_idx, warp_sum
from impnb.kernels.deltanet.gdn_step import softplus
from impnb.kernels.deltanet.slots import sequence_slots
from impnb.models.deltanet import L2_EPS

SUB = 16  # rows of a diagonal block of the triangular solve (an mma tile's height)
SMEM_ALIGN = ptx.SMEM_ALIGN
_ZERO = np.float32(0)
_ONE = np.float32(1)
_L2_EPS = np.float32(L2_EPS)


@lru_cache(maxsize=None)
def work_layout(dk: int, dv: int, L: int) -> dict:
    """A chunk's share of the workspace (one (sequence, chunk, V head) unit): word offsets into the
    uint32 array (fp16 pairs, rows unpadded) and float offsets into the float32 one.
      words: qn (L x dk) q normalised; w (L x dk) W; kend_t (dk x L) K_endᵀ; p (L x L) P
      floats: u (L x dv) U; eg (L) e"""
    words = {"qn": 0, "w": L * dk // 2, "kend_t": L * dk, "p": L * dk + dk * L // 2}
    return dict(words, unit_words=L * dk + dk * L // 2 + L * L // 2, u=0, eg=L * dv, unit_floats=L * dv + L)


def work_shape(B: int, T: int, Hv: int, dk: int, dv: int, L: int) -> tuple:
    """(uint32 words, float32 floats) of the workspace for B sequences of T rows."""
    lay = work_layout(dk, dv, L)
    units = B * (-(-T // L)) * Hv
    return units * lay["unit_words"], units * lay["unit_floats"]


@lru_cache(maxsize=None)
def smem_layout(dk: int, dv: int, L: int) -> dict:
    """Word offsets of the prep kernel's dynamic shared buffers and their row strides: rows padded
    by 4 words so the 8 rows a fragment load reads fall in distinct banks. bke_t and vt take the
    place of qn and kn once the A and P tiles have read those."""
    KS, LS = dk // 2 + 4, L // 2 + 4
    first = max(2 * L * KS, (dk + dv) * LS)
    return dict(qn=0, kn=L * KS, bke_t=0, vt=dk * LS, tm=first, KS=KS, LS=LS, words=first + L * LS)


def strip(NT: int, KSTEPS: int):
    """acc[4 NT] += A·Bᵀ for A 16 rows at word a0 (row stride sa words) and B NT * 8 rows at b0
    (stride sb), both fp16 pairs along k, over KSTEPS * 16 k: a warp's 16 x 8 NT strip."""
    @cuda.jit(device=True, inline=True)
    def run(acc, sm, a0, sa, b0, sb):
        lane = cuda.threadIdx.x & 31
        ra = a0 + (lane >> 2) * sa + (lane & 3)
        rb = b0 + (lane >> 2) * sb + (lane & 3)
        for kk in range(KSTEPS):
            x0 = sm[ra + 8 * kk]
            x1 = sm[ra + 8 * sa + 8 * kk]
            x2 = sm[ra + 8 * kk + 4]
            x3 = sm[ra + 8 * sa + 8 * kk + 4]
            for nt in range(NT):
                y0 = sm[rb + 8 * nt * sb + 8 * kk]
                y1 = sm[rb + 8 * nt * sb + 8 * kk + 4]
                f = 4 * nt
                acc[f], acc[f + 1], acc[f + 2], acc[f + 3] = ptx.mma_f16(
                    x0, x1, x2, x3, y0, y1, acc[f], acc[f + 1], acc[f + 2], acc[f + 3])
    return run


@lru_cache(maxsize=None)
def prep_kernel(dk: int, dv: int, L: int):
    WARPS = dv // 16
    THREADS = 32 * WARPS
    lay = smem_layout(dk, dv, L)
    wl = work_layout(dk, dv, L)
    KS, LS = lay["KS"], lay["LS"]
    QN, KN, BKE, VT, TM = (lay[n] for n in ("qn", "kn", "bke_t", "vt", "tm"))
    G_QN, G_W, G_KEND, G_P, UW = (wl[n] for n in ("qn", "w", "kend_t", "p", "unit_words"))
    G_EG, UF = wl["eg"], wl["unit_floats"]
    NTL, KSK, KSL = L // 8, dk // 16, L // 16
    NTW, NTV = min(8, dk // 8), min(8, dv // 8)  # n-tiles of a warp's strip of W, of U
    N_W, N_U = 4 * NTW, 4 * NTV            # accumulators a lane: a strip of W, of U
    UNITS_W = (L // 16) * (dk // (8 * NTW))      # 16-row strips of W
    UNITS = UNITS_W + (L // 16) * (dv // (8 * NTV))
    EL = (L + 31) // 32                # tokens a lane of warp 0 takes in the gates' scan
    NB = L // SUB                      # diagonal blocks of the solve
    LA = L + 1                         # fp32 row stride of A and Tm (odd: column reads spread)
    N_AT, N_M = L * LA, max(NB - 1, 1) * SUB * SUB
    tile = strip(1, KSK)               # 16 x 8 of L x L over dk
    strip_w = strip(NTW, KSL)          # 16 rows of W over the chunk
    strip_u = strip(NTV, KSL)          # 16 rows of U over the chunk
    OVERLAP = THREADS > L              # threads past the solve's L stage bke_t, vt meanwhile
    STAGERS = THREADS - L if OVERLAP else THREADS
    assert dk % 16 == 0 and dv % 32 == 0 and L % SUB == 0 and WARPS >= 2

    @cuda.jit(device=True, inline=True)
    def stage_bke_vt(sm, qkv, r0, nc, kh, n_qk, h, beta, eg, inv_k, first):
        # -- bke_t (dk x L) (beta e K)ᵀ and vt (dv x L) (beta V)ᵀ, 2 tokens a thread at a time --
        for e in range(first, (L // 2) * dk, STAGERS):
            i = 2 * (e // dk)
            d = e % dk
            k0 = qkv[r0 + i, n_qk + kh * dk + d] * inv_k[i] * beta[i] * eg[i] if i < nc else _ZERO
            k1 = qkv[r0 + i + 1, n_qk + kh * dk + d] * inv_k[i + 1] * beta[i + 1] * eg[i + 1] if i + 1 < nc else _ZERO
            sm[BKE + d * LS + i // 2] = ptx.pack_f16x2(k0, k1)
        for e in range(first, (L // 2) * dv, STAGERS):
            i = 2 * (e // dv)
            j = e % dv
            v0 = qkv[r0 + i, 2 * n_qk + h * dv + j] * beta[i] if i < nc else _ZERO
            v1 = qkv[r0 + i + 1, 2 * n_qk + h * dv + j] * beta[i + 1] if i + 1 < nc else _ZERO
            sm[VT + j * LS + i // 2] = ptx.pack_f16x2(v0, v1)

    # grid (chunks of T, Hv, B), block 32 dv / 16: chunk ci of V head h of sequence s (rows
    # s T + ci L ..; past the sequence's real rows: nothing). Its unit of the workspace is
    # (s * chunks + ci) * Hv + h. Shared, dynamic (uint32 words of fp16 pairs, smem_layout()): qn,
    # kn (L x dk) q, k normalised, then in their place bke_t (dk x L) (beta e K)ᵀ and vt (dv x L)
    # (beta V)ᵀ; tm (L x L) Tm. Static fp32: a, t (L x LA) A and Tm; m (NB - 1 blocks of SUB x
    # SUB) the solve's products; gc, eg, ed, beta, inv_q, inv_k (L) per token.
    # -- gates, scan (warp 0) / inverse norms (the others) -- barrier -- qn, kn; qn and K_endᵀ
    #    out -- barrier -- A tiles; P tiles out -- barrier -- solve's diagonal blocks (threads
    #    < L) / bke_t, vt (the others) -- barrier -- the solve's block rows (2 barriers each) --
    #    tm -- barrier -- W, U strips out --
    def gdn_chunk_prep(qkv, b, a, ssm_a, dt_bias, n_k_heads, v_tiled, slots, lengths, use_lengths,
                       pos, use_pos, work, work_f):
        ci = cuda.blockIdx.x
        h = cuda.blockIdx.y
        s = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        c = lane & 3
        Hv = cuda.gridDim.y
        NC = cuda.gridDim.x
        T = qkv.shape[0] // slots.shape[0]
        slot, n, src, dst = sequence_slots(slots, lengths, use_lengths, pos, use_pos, s, T)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        c0 = ci * L
        if c0 >= n:
            return
        nc = min(L, n - c0)
        r0 = s * T + c0
        unit = (s * NC + ci) * Hv + h
        gw = unit * UW
        gf = unit * UF
        A_h = ssm_a[h]
        bias = dt_bias[h]
        n_qk = n_k_heads * dk
        kh = h % n_k_heads if v_tiled else h // (Hv // n_k_heads)
        sm = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        a_s = cuda.shared.array(N_AT, float32)
        t_s = cuda.shared.array(N_AT, float32)
        m_s = cuda.shared.array(N_M, float32)
        gc = cuda.shared.array(L, float32)
        eg = cuda.shared.array(L, float32)
        ed = cuda.shared.array(L, float32)
        beta = cuda.shared.array(L, float32)
        inv_q = cuda.shared.array(L, float32)
        inv_k = cuda.shared.array(L, float32)

        # -- gates and their scan (warp 0); q, k inverse norms (warps 1..) --
        if warp == 0:
            gl = cuda.local.array(EL, float32)
            run = _ZERO
            for u in range(EL):
                i = lane * EL + u
                x = _ZERO
                bt = _ZERO
                if i < nc:
                    x = A_h * softplus(a[r0 + i, h] + bias)
                    bt = _ONE / (_ONE + math.exp(-b[r0 + i, h]))
                if i < L:
                    beta[i] = bt
                run += x
                gl[u] = run
            incl = run
            for off in (1, 2, 4, 8, 16):
                y = shfl_idx(incl, max(lane - off, 0))
                if lane >= off:
                    incl += y
            last = shfl_idx(incl, 31)
            for u in range(EL):
                i = lane * EL + u
                if i < L:
                    cum = incl - run + gl[u]
                    gc[i] = cum
                    eg[i] = math.exp(cum)
                    ed[i] = math.exp(last - cum)
                    work_f[gf + G_EG + i] = eg[i]
        else:
            for i in range(warp - 1, L, WARPS - 1):
                sq = _ZERO
                sk = _ZERO
                if i < nc:
                    for m in range(dk // 32):
                        xq = qkv[r0 + i, kh * dk + lane + 32 * m]
                        xk = qkv[r0 + i, n_qk + kh * dk + lane + 32 * m]
                        sq += xq * xq
                        sk += xk * xk
                sq = warp_sum(sq)
                sk = warp_sum(sk)
                if lane == 0:
                    inv_q[i] = _ONE / math.sqrt(sq + _L2_EPS) if i < nc else _ZERO
                    inv_k[i] = _ONE / math.sqrt(sk + _L2_EPS) if i < nc else _ZERO
        cuda.syncthreads()
        # -- qn, kn (L x dk), bke_t (dk x L); qn and K_endᵀ out: a thread's 2 tokens x 2 dims --
        for e in range(tid, (L // 2) * (dk // 2), THREADS):
            i = 2 * (e // (dk // 2))
            d2 = e % (dk // 2)
            d = 2 * d2
            q00 = q01 = q10 = q11 = k00 = k01 = k10 = k11 = _ZERO
            if i < nc:
                q00 = qkv[r0 + i, kh * dk + d] * inv_q[i]
                q01 = qkv[r0 + i, kh * dk + d + 1] * inv_q[i]
                k00 = qkv[r0 + i, n_qk + kh * dk + d] * inv_k[i]
                k01 = qkv[r0 + i, n_qk + kh * dk + d + 1] * inv_k[i]
            if i + 1 < nc:
                q10 = qkv[r0 + i + 1, kh * dk + d] * inv_q[i + 1]
                q11 = qkv[r0 + i + 1, kh * dk + d + 1] * inv_q[i + 1]
                k10 = qkv[r0 + i + 1, n_qk + kh * dk + d] * inv_k[i + 1]
                k11 = qkv[r0 + i + 1, n_qk + kh * dk + d + 1] * inv_k[i + 1]
            q0 = ptx.pack_f16x2(q00, q01)
            q1 = ptx.pack_f16x2(q10, q11)
            sm[QN + i * KS + d2] = q0
            sm[QN + (i + 1) * KS + d2] = q1
            work[gw + G_QN + i * (dk // 2) + d2] = q0
            work[gw + G_QN + (i + 1) * (dk // 2) + d2] = q1
            sm[KN + i * KS + d2] = ptx.pack_f16x2(k00, k01)
            sm[KN + (i + 1) * KS + d2] = ptx.pack_f16x2(k10, k11)
            work[gw + G_KEND + d * (L // 2) + i // 2] = ptx.pack_f16x2(k00 * ed[i], k10 * ed[i + 1])
            work[gw + G_KEND + (d + 1) * (L // 2) + i // 2] = ptx.pack_f16x2(k01 * ed[i], k11 * ed[i + 1])
        cuda.syncthreads()
        # -- A (fp32, shared) and P (fp16, out) tiles of 16 x 8 over dk, the warps in turn --
        for t in range(warp, 2 * NB * NTL, WARPS):
            which = t // (NB * NTL)
            mt = (t % (NB * NTL)) // NTL
            nt = t % NTL
            i_lo = 16 * mt + g
            if 8 * nt > 16 * mt + 15:  # above the diagonal: A unread, P zero
                if which == 1:
                    work[gw + G_P + i_lo * (L // 2) + 4 * nt + c] = 0
                    work[gw + G_P + (i_lo + 8) * (L // 2) + 4 * nt + c] = 0
                continue
            tacc = cuda.local.array(4, float32)
            for f in range(4):
                tacc[f] = _ZERO
            tile(tacc, sm, (QN if which == 1 else KN) + 16 * mt * KS, KS, KN + 8 * nt * KS, KS)
            for hi in range(2):
                i = i_lo + 8 * hi
                j = 8 * nt + 2 * c
                x_a = tacc[2 * hi]
                x_b = tacc[2 * hi + 1]
                if which == 0:
                    a_s[i * LA + j] = beta[i] * x_a * math.exp(gc[i] - gc[j]) if j < i else _ZERO
                    a_s[i * LA + j + 1] = beta[i] * x_b * math.exp(gc[i] - gc[j + 1]) if j + 1 < i else _ZERO
                else:
                    p_a = x_a * math.exp(gc[i] - gc[j]) if j <= i else _ZERO
                    p_b = x_b * math.exp(gc[i] - gc[j + 1]) if j + 1 <= i else _ZERO
                    work[gw + G_P + i * (L // 2) + 4 * nt + c] = ptx.pack_f16x2(p_a, p_b)
        cuda.syncthreads()
        # -- Tm = (I + A)^-1: each diagonal block by forward substitution, a column a thread --
        if tid < L:
            blk = SUB * (tid // SUB)
            cc = tid % SUB
            for r in range(SUB):
                x = _ONE if r == cc else _ZERO
                for m in range(cc, r):
                    x -= a_s[(blk + r) * LA + blk + m] * t_s[(blk + m) * LA + blk + cc]
                t_s[(blk + r) * LA + blk + cc] = x
        elif OVERLAP:
            stage_bke_vt(sm, qkv, r0, nc, kh, n_qk, h, beta, eg, inv_k, tid - L)
        cuda.syncthreads()
        if not OVERLAP:
            stage_bke_vt(sm, qkv, r0, nc, kh, n_qk, h, beta, eg, inv_k, tid)
            cuda.syncthreads()
        # -- then block row bi: M_j = sum_k A_bi,k Tm_k,j (j < bi), Tm_bi,j = -Tm_bi,bi M_j --
        for bi in range(1, NB):
            for e in range(tid, bi * SUB * SUB, THREADS):
                bj = e // (SUB * SUB)
                r = (e // SUB) % SUB
                cc = e % SUB
                x = _ZERO
                for m in range(SUB * bj, SUB * bi):
                    x += a_s[(SUB * bi + r) * LA + m] * t_s[m * LA + SUB * bj + cc]
                m_s[e] = x
            cuda.syncthreads()
            for e in range(tid, bi * SUB * SUB, THREADS):
                bj = e // (SUB * SUB)
                r = (e // SUB) % SUB
                cc = e % SUB
                x = _ZERO
                for m in range(SUB):
                    x -= t_s[(SUB * bi + r) * LA + SUB * bi + m] * m_s[bj * SUB * SUB + m * SUB + cc]
                t_s[(SUB * bi + r) * LA + SUB * bj + cc] = x
            cuda.syncthreads()
        for e in range(tid, L * L // 2, THREADS):
            i = e // (L // 2)
            j = 2 * (e % (L // 2))
            sm[TM + i * LS + j // 2] = ptx.pack_f16x2(t_s[i * LA + j] if j <= i else _ZERO,
                                                     t_s[i * LA + j + 1] if j + 1 <= i else _ZERO)
        cuda.syncthreads()
        # -- W = Tm (beta e K) (fp16 out), U = Tm (beta V) (fp32 out), 16-row strips by the warps --
        for t in range(warp, UNITS, WARPS):
            if t < UNITS_W:
                mt = t // (dk // (8 * NTW))
                n0 = 8 * NTW * (t % (dk // (8 * NTW)))
                acc_w = cuda.local.array(N_W, float32)
                for f in range(N_W):
                    acc_w[f] = _ZERO
                strip_w(acc_w, sm, TM + 16 * mt * LS, LS, BKE + n0 * LS, LS)
                for nt in range(NTW):
                    col = (n0 + 8 * nt + 2 * c) // 2
                    row = 16 * mt + g
                    work[gw + G_W + row * (dk // 2) + col] = ptx.pack_f16x2(acc_w[4 * nt], acc_w[4 * nt + 1])
                    work[gw + G_W + (row + 8) * (dk // 2) + col] = ptx.pack_f16x2(acc_w[4 * nt + 2],
                                                                                  acc_w[4 * nt + 3])
            else:
                tu = t - UNITS_W
                mt = tu // (dv // (8 * NTV))
                n0 = 8 * NTV * (tu % (dv // (8 * NTV)))
                acc_u = cuda.local.array(N_U, float32)
                for f in range(N_U):
                    acc_u[f] = _ZERO
                strip_u(acc_u, sm, TM + 16 * mt * LS, LS, VT + n0 * LS, LS)
                for nt in range(NTV):
                    col = n0 + 8 * nt + 2 * c
                    row = 16 * mt + g
                    work_f[gf + row * dv + col] = acc_u[4 * nt]
                    work_f[gf + row * dv + col + 1] = acc_u[4 * nt + 1]
                    work_f[gf + (row + 8) * dv + col] = acc_u[4 * nt + 2]
                    work_f[gf + (row + 8) * dv + col + 1] = acc_u[4 * nt + 3]

    gdn_chunk_prep.__name__ = f"_gdn_chunk_prep_k{dk}_v{dv}_l{L}_kernel"
    return cuda.jit(gdn_chunk_prep)
