"""A prompt chunk of a Gated DeltaNet layer after its conv on the tensor cores: the delta rule in
chunks of L tokens in the WY / UT form (flash-linear-attention's chunk_gated_delta_rule), the
gated RMSNorm fused. Same arguments and result as gdn_prefill.py (its drop-in for long chunks);
numpy twin: reference.gdn_chunked_ref (reference.delta_rule_wy says the algebra).

Per chunk of L tokens of one (sequence, V head), c the cumulative log decay, e = exp(c):
    A = strictly_lower(beta_i k_i·k_j exp(c_i - c_j)), Tm = (I + A)^-1   (fp32 triangular solve)
    Xᵀ = Vᵀ - (Sᵀ Kᵀ) e;  v_newᵀ = (beta X)ᵀ Tmᵀ
    oᵀ = q_scale ((Sᵀ Qᵀ) e + v_newᵀ Pᵀ),  P = lower(Q Kᵀ exp(c_i - c_j))
    Sᵀ = exp(c_L) Sᵀ + v_newᵀ K_end,  K_end = K exp(c_L - c)
Products run on mma.sync m16n8k16 with fp16 operands (q, k normalised, Sᵀ, P, Tm, beta X, v_new
rounded to fp16) and fp32 accumulators; the state stays fp32 in registers across the launch's
chunks. Every product of the per-warp part has its rows in dv (Sᵀ, Xᵀ, v_newᵀ, oᵀ), so warp w
owns dv rows 16 w .. 16 w + 15 of all of them and needs only its own rows of shared memory
between them: block barriers are for the chunk's staging, A / P, the solve and the norm.
Fragment layouts: attention_fa2.py's header (A row-major pairs along k, B n-major pairs along k).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import shfl_idx, shfl_xor, warp_sum, warp_sync
from impnb.kernels.deltanet.gdn_step import check_gdn_args, silu, softplus
from impnb.kernels.deltanet.slots import prompt_rows, sequence_slots
from impnb.kernels.deltanet.reference import gdn_chunked_ref  # noqa: F401  (the numpy twin)
from impnb.launch import launch
from impnb.models.deltanet import CHUNK, L2_EPS

SUB = 16  # rows of a diagonal block of the triangular solve (an mma tile's height)
SMEM_ALIGN = ptx.SMEM_ALIGN
_ZERO = np.float32(0)
_ONE = np.float32(1)
_L2_EPS = np.float32(L2_EPS)


@lru_cache(maxsize=None)
def layout(dk: int, dv: int, L: int) -> dict:
    """Word offsets (uint32: two fp16) of the dynamic shared buffers and their row strides: rows
    padded by 4 words so the 8 rows a fragment load reads fall in distinct banks."""
    KS, LS = dk // 2 + 4, L // 2 + 4
    sizes = {"qn": L * KS, "kn": L * KS, "st": dv * KS, "kend_t": dk * LS, "p": L * LS, "tm": L * LS,
             "vt": dv * LS}
    off, at = {}, 0
    for name, n in sizes.items():
        off[name] = at
        at += n
    return dict(off, KS=KS, LS=LS, words=at)


def _strip(NT: int, KSTEPS: int):
    """acc[4 NT] += A·Bᵀ for A 16 rows at word a0 (row stride sa words) and B NT * 8 rows at b0
    (stride sb), both fp16 pairs along k, over KSTEPS * 16 k: a warp's 16 x 8 NT strip."""
    @cuda.jit(device=True, inline=True)
    def strip(acc, sm, a0, sa, b0, sb):
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
    return strip


@lru_cache(maxsize=None)
def chunked_kernel(dk: int, dv: int, L: int):
    WARPS = dv // 16
    THREADS = 32 * WARPS
    lay = layout(dk, dv, L)
    KS, LS = lay["KS"], lay["LS"]
    QN, KN, ST, KEND, PP, TM, VT = (lay[n] for n in ("qn", "kn", "st", "kend_t", "p", "tm", "vt"))
    NTK, NTL = dk // 8, L // 8         # n-tiles over dk, over the chunk's tokens
    KSK, KSL = dk // 16, L // 16       # k steps over dk, over the chunk's tokens
    N_S, N_ACC = 4 * NTK, 4 * NTL      # accumulators a lane: Sᵀ, a dv x L product
    EL = (L + 31) // 32                # tokens a lane of warp 0 takes in the gates' scan
    NB = L // SUB                      # diagonal blocks of the solve
    LA = L + 1                         # fp32 row stride of A and Tm (odd: column reads spread)
    N_AT, N_M, N_RED = L * LA, max(NB - 1, 1) * SUB * SUB, WARPS * L  # static buffers' floats
    strip_dk = _strip(NTL, KSK)        # (16 dv rows) x L tokens over dk
    strip_l = _strip(NTL, KSL)         # (16 dv rows) x L tokens over the chunk
    strip_s = _strip(NTK, KSL)         # (16 dv rows) x dk over the chunk
    tile = _strip(1, KSK)              # 16 x 8 of L x L over dk
    assert dk % 16 == 0 and dv % 32 == 0 and L % SUB == 0

    # grid (Hv, B), block 32 dv / 16: V head h of sequence s (rows s T .. s T + T - 1, state slot
    # slots[s]); warp w owns rows 16 w .. 16 w + 15 of Sᵀ (dv x dk, fp32 C fragments in
    # registers for the whole launch) and of each chunk's Xᵀ, v_newᵀ, oᵀ (dv x L).
    # shared, dynamic (uint32 words of fp16 pairs, layout()): qn, kn (L x dk) q, k normalised;
    # st (dv x dk) Sᵀ; kend_t (dk x L) K_endᵀ; p (L x L) P; tm (L x L) Tm; vt (dv x L) beta Xᵀ,
    # then v_newᵀ. Static fp32: a, t (L x LA) A and Tm; m (NB - 1 blocks of SUB x SUB) the solve's
    # products; gc, eg, ed, beta, inv_q, inv_k (L) per token; red (WARPS x L) the norm's partials.
    # -- per chunk: Sᵀ to st -- gates, scan (warp 0) / inverse norms (the others) -- barrier --
    #    -- qn, kn, kend_t -- barrier -- Xᵀ to vt (own rows); A, P tiles -- barrier -- solve
    #    (NB diagonal blocks, then block rows, 2 barriers each) -- tm -- barrier -- v_newᵀ, oᵀ,
    #    norm partials -- barrier -- out; Sᵀ updated -- barrier --
    def gdn_chunked(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, q_scale, n_k_heads, v_tiled, state,
                    slots, lengths, use_lengths, pos, use_pos, out):
        h = cuda.blockIdx.x
        s = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        c = lane & 3
        v0 = 16 * warp
        Hv = state.shape[1]
        T = qkv.shape[0] // slots.shape[0]
        slot, n, src, dst = sequence_slots(slots, lengths, use_lengths, pos, use_pos, s, T)
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
        red = cuda.shared.array(N_RED, float32)
        S = cuda.local.array(N_S, float32)  # Sᵀ rows v0 + g, + 8; columns 8 nt + 2 c, + 1
        acc = cuda.local.array(N_ACC, float32)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        for nt in range(NTK):
            for e in range(4):
                d = 8 * nt + 2 * c + (e & 1)
                S[4 * nt + e] = state[src, h, d, v0 + g + 8 * (e >> 1)] if slot >= 0 else _ZERO
        w_lo = norm_w[v0 + g]
        w_hi = norm_w[v0 + g + 8]
        col = h * dv + v0 + g  # this lane's dv rows' column in v, z and out (+ 8)

        for c0 in range(0, n, L):
            nc = min(L, n - c0)
            r0 = s * T + c0
            # -- Sᵀ to st (fp16, own rows) --
            for nt in range(NTK):
                sm[ST + (v0 + g) * KS + 4 * nt + c] = ptx.pack_f16x2(S[4 * nt], S[4 * nt + 1])
                sm[ST + (v0 + g + 8) * KS + 4 * nt + c] = ptx.pack_f16x2(S[4 * nt + 2], S[4 * nt + 3])
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
                        ci = incl - run + gl[u]
                        gc[i] = ci
                        eg[i] = math.exp(ci)
                        ed[i] = math.exp(last - ci)
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
            # -- qn, kn (L x dk), kend_t (dk x L): a thread's 2 tokens x 2 dims at a time --
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
                sm[QN + i * KS + d2] = ptx.pack_f16x2(q00, q01)
                sm[QN + (i + 1) * KS + d2] = ptx.pack_f16x2(q10, q11)
                sm[KN + i * KS + d2] = ptx.pack_f16x2(k00, k01)
                sm[KN + (i + 1) * KS + d2] = ptx.pack_f16x2(k10, k11)
                sm[KEND + d * LS + i // 2] = ptx.pack_f16x2(k00 * ed[i], k10 * ed[i + 1])
                sm[KEND + (d + 1) * LS + i // 2] = ptx.pack_f16x2(k01 * ed[i], k11 * ed[i + 1])
            cuda.syncthreads()
            # -- Xᵀ = Vᵀ - (Sᵀ Kᵀ) e, times beta, to vt (own rows) --
            for f in range(4 * NTL):
                acc[f] = _ZERO
            strip_dk(acc, sm, ST + v0 * KS, KS, KN, KS)
            for nt in range(NTL):
                for hi in range(2):
                    i = 8 * nt + 2 * c
                    v_a = qkv[r0 + i, 2 * n_qk + col + 8 * hi] if i < nc else _ZERO
                    v_b = qkv[r0 + i + 1, 2 * n_qk + col + 8 * hi] if i + 1 < nc else _ZERO
                    x_a = (v_a - acc[4 * nt + 2 * hi] * eg[i]) * beta[i]
                    x_b = (v_b - acc[4 * nt + 2 * hi + 1] * eg[i + 1]) * beta[i + 1]
                    sm[VT + (v0 + g + 8 * hi) * LS + 4 * nt + c] = ptx.pack_f16x2(x_a, x_b)
            # -- A (fp32) and P (fp16) tiles of 16 x 8 over dk, the warps in turn --
            for t in range(warp, 2 * NB * NTL, WARPS):
                which = t // (NB * NTL)
                mt = (t % (NB * NTL)) // NTL
                nt = t % NTL
                i_lo = 16 * mt + g
                if 8 * nt > 16 * mt + 15:  # above the diagonal: A unread, P zero
                    if which == 1:
                        sm[PP + i_lo * LS + 4 * nt + c] = 0
                        sm[PP + (i_lo + 8) * LS + 4 * nt + c] = 0
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
                        sm[PP + i * LS + 4 * nt + c] = ptx.pack_f16x2(p_a, p_b)
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
            # -- v_newᵀ = (beta X)ᵀ Tmᵀ, back to vt (own rows) --
            for f in range(4 * NTL):
                acc[f] = _ZERO
            strip_l(acc, sm, VT + v0 * LS, LS, TM, LS)
            warp_sync()
            for nt in range(NTL):
                sm[VT + (v0 + g) * LS + 4 * nt + c] = ptx.pack_f16x2(acc[4 * nt], acc[4 * nt + 1])
                sm[VT + (v0 + g + 8) * LS + 4 * nt + c] = ptx.pack_f16x2(acc[4 * nt + 2], acc[4 * nt + 3])
            warp_sync()
            # -- oᵀ = (Sᵀ Qᵀ) e + v_newᵀ Pᵀ; the squares' sums of each token's column --
            for f in range(4 * NTL):
                acc[f] = _ZERO
            strip_dk(acc, sm, ST + v0 * KS, KS, QN, KS)
            for nt in range(NTL):
                for e in range(4):
                    acc[4 * nt + e] *= eg[8 * nt + 2 * c + (e & 1)]
            strip_l(acc, sm, VT + v0 * LS, LS, PP, LS)
            for nt in range(NTL):
                for e in range(2):
                    y = acc[4 * nt + e] * acc[4 * nt + e] + acc[4 * nt + 2 + e] * acc[4 * nt + 2 + e]
                    y += shfl_xor(y, 4)
                    y += shfl_xor(y, 8)
                    y += shfl_xor(y, 16)
                    if g == 0:
                        red[warp * L + 8 * nt + 2 * c + e] = y
            cuda.syncthreads()
            # -- out = rms_norm(o) * w * silu(z) for the chunk's real tokens --
            for nt in range(NTL):
                for e in range(2):
                    i = 8 * nt + 2 * c + e
                    if i < nc:
                        total = _ZERO
                        for w in range(WARPS):
                            total += red[w * L + i]
                        inv = _ONE / math.sqrt(total * q_scale * q_scale / np.float32(dv) + eps)
                        f = q_scale * inv
                        out[r0 + i, col] = acc[4 * nt + e] * f * w_lo * silu(z[r0 + i, col])
                        out[r0 + i, col + 8] = acc[4 * nt + 2 + e] * f * w_hi * silu(z[r0 + i, col + 8])
            # -- Sᵀ = exp(c_L) Sᵀ + v_newᵀ K_end --
            dl = eg[nc - 1]
            for f in range(4 * NTK):
                S[f] *= dl
            strip_s(S, sm, VT + v0 * LS, LS, KEND, LS)
            cuda.syncthreads()

        for t in range(n, T):
            out[s * T + t, col] = _ZERO
            out[s * T + t, col + 8] = _ZERO
        if slot >= 0:
            for nt in range(NTK):
                for e in range(4):
                    state[dst, h, 8 * nt + 2 * c + (e & 1), v0 + g + 8 * (e >> 1)] = S[4 * nt + e]

    gdn_chunked.__name__ = f"_gdn_chunked_k{dk}_v{dv}_l{L}_kernel"
    return cuda.jit(gdn_chunked)


def gdn_chunked(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
                v_tiled: bool, out, stream, lengths=None, pos=None, chunk: int = CHUNK) -> None:
    """gdn_prefill's arguments and result (see there), in chunks of `chunk` tokens on the tensor
    cores: dk a multiple of 16 up to 128, dv of 32 up to 128."""
    B, T, Hv, dk, dv = check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads, out)
    assert dk % 16 == 0 and chunk % SUB == 0, (dk, chunk)
    lengths, use_lengths, pos, use_pos = prompt_rows(slots, B, T, lengths, pos)
    launch(chunked_kernel(dk, dv, chunk), (Hv, B), 2 * dv, stream, qkv, z, b, a, ssm_a, dt_bias, norm_w,
           np.float32(eps), np.float32(dk ** -0.5), np.int32(n_k_heads), np.int32(bool(v_tiled)),
           state, slots, lengths, use_lengths, pos, use_pos, out,
           shared_bytes=4 * layout(dk, dv, chunk)["words"])


_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]
_I1 = types.int32[::1]
SIG = (_F2, _F2, _F2, _F2, _F1, _F1, _F1, types.float32, types.float32, types.int32, types.int32,
       types.float32[:, :, :, ::1], _I1, _I1, types.int32, _I1, types.int32, _F2)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py): Qwen3.5 /
    3.6's head dims at the chunk the forward uses; the kernels are made here, not at import."""
    return [(chunked_kernel(128, 128, CHUNK), SIG,
             {"max_registers": 255, "ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]})]
