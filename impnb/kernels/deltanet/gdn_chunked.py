"""A prompt chunk of a Gated DeltaNet layer after its conv on the tensor cores: the delta rule in
chunks of L tokens in the WY / UT form (flash-linear-attention's chunk_gated_delta_rule), the
gated RMSNorm fused. Same arguments and result as gdn_prefill.py (its drop-in for long chunks);
numpy twin: reference.gdn_chunked_ref (reference.delta_rule_wy says the algebra).

Per chunk of L tokens of one (sequence, V head), c the cumulative log decay, e = exp(c):
    A = strictly_lower(beta_i k_i·k_j exp(c_i - c_j)), Tm = (I + A)^-1   (fp32 triangular solve)
    W = Tm (beta e K),  U = Tm (beta V),  P = lower(Q Kᵀ exp(c_i - c_j)),  K_end = K exp(c_L - c)
    v_newᵀ = Uᵀ - Sᵀ Wᵀ
    oᵀ = q_scale ((Sᵀ Qᵀ) e + v_newᵀ Pᵀ)
    Sᵀ = exp(c_L) Sᵀ + v_newᵀ K_end
Two launches: gdn_chunk_prep.py computes the first line's state-independent matrices for every
chunk at once into a workspace; the state kernel here then walks each (sequence, V head)'s chunks
in order with Sᵀ in registers, the next chunk's matrices streaming into shared memory (cp.async)
while it computes the current one. Products run on mma.sync m16n8k16 with fp16 operands (Q, W,
K_end, P, Sᵀ, v_new rounded to fp16) and fp32 accumulators. Every product has its rows in dv (Sᵀ,
v_newᵀ, oᵀ), so warp w owns dv rows 16 w .. 16 w + 15 of all of them and needs only its own rows of
Sᵀ and v_newᵀ: block barriers are for the chunk's staged matrices and the norm.
Fragment layouts: attention_fa2.py's header (A row-major pairs along k, B n-major pairs along k).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import shfl_xor, warp_sync
from impnb.kernels.deltanet.gdn_chunk_prep import prep_kernel, smem_layout as prep_smem, strip, work_layout, work_shape
from impnb.kernels.deltanet.gdn_step import check_gdn_args, silu
from impnb.kernels.deltanet.slots import prompt_rows, sequence_slots
from impnb.kernels.deltanet.reference import gdn_chunked_ref  # noqa: F401  (the numpy twin)
from impnb.launch import launch
from impnb.models.deltanet import CHUNK

SMEM_ALIGN = ptx.SMEM_ALIGN
_ZERO = np.float32(0)
_ONE = np.float32(1)

@lru_cache(maxsize=None)
def layout(dk: int, dv: int, L: int) -> dict:
    """Word offsets (uint32: two fp16) of the state kernel's dynamic shared buffers and their row
    strides: rows padded by 4 words so the 8 rows a fragment load reads fall in distinct banks.
    st, vt: Sᵀ, v_newᵀ (dv rows); zs (L x dv floats) the chunk's z; a stage (two of them, `stage`
    words apart): qn, w (L x dk), kend_t (dk x L), p (L x L) of a chunk, as the workspace holds
    them (its eg: a static array)."""
    KS, LS = dk // 2 + 4, L // 2 + 4
    sizes = {"st": dv * KS, "vt": dv * LS, "zs": L * dv, "qn": L * KS, "w": L * KS, "kend_t": dk * LS, "p": L * LS}
    off, at = {}, 0
    for name, n in sizes.items():
        off[name] = at
        at += n
    stage = at - off["qn"]
    return dict(off, KS=KS, LS=LS, stage=stage, words=at + stage)


@lru_cache(maxsize=None)
def chunked_kernel(dk: int, dv: int, L: int):
    WARPS = dv // 16
    THREADS = 32 * WARPS
    lay = layout(dk, dv, L)
    wl = work_layout(dk, dv, L)
    KS, LS, STAGE = lay["KS"], lay["LS"], lay["stage"]
    ST, VT, ZS, QN, WN, KEND, PP = (lay[n] for n in ("st", "vt", "zs", "qn", "w", "kend_t", "p"))
    G_QN, G_W, G_KEND, G_P, UW = (wl[n] for n in ("qn", "w", "kend_t", "p", "unit_words"))
    G_EG, UF = wl["eg"], wl["unit_floats"]
    NTK, NTL = dk // 8, L // 8         # n-tiles over dk, over the chunk's tokens
    KSK, KSL = dk // 16, L // 16       # k steps over dk, over the chunk's tokens
    N_S, N_ACC, N_RED, N_EG = 4 * NTK, 4 * NTL, WARPS * L, 2 * L
    VEC_K, VEC_L = dk // 8, L // 8     # 16-byte vectors a row of dk, of L fp16
    N_VEC = 2 * L * VEC_K + dk * VEC_L + L * VEC_L + L // 4  # a stage's vectors
    strip_dk = strip(NTL, KSK)         # (16 dv rows) x L tokens over dk
    strip_l = strip(NTL, KSL)          # (16 dv rows) x L tokens over the chunk
    strip_s = strip(NTK, KSL)          # (16 dv rows) x dk over the chunk
    assert dk % 16 == 0 and dv % 32 == 0 and L % 16 == 0

    @cuda.jit(device=True, inline=True)
    def stage_in(sm, egs, st, work, work_f, gw, gf):
        # -- a chunk's qn, w, kend_t, p, eg: the block's 16-byte cp.asyncs into stage st (0, 1) --
        base = STAGE * st
        for e in range(cuda.threadIdx.x, N_VEC, THREADS):
            if e < 2 * L * VEC_K:  # qn then w: L rows of dk
                m = e // (L * VEC_K)
                r = (e % (L * VEC_K)) // VEC_K
                v = e % VEC_K
                ptx.cp_async_16(ptx.smem_addr(sm, base + QN + m * (WN - QN) + r * KS + 4 * v), work,
                                gw + (G_W if m else G_QN) + r * (dk // 2) + 4 * v)
            elif e < 2 * L * VEC_K + dk * VEC_L:  # kend_t: dk rows of L
                f = e - 2 * L * VEC_K
                ptx.cp_async_16(ptx.smem_addr(sm, base + KEND + (f // VEC_L) * LS + 4 * (f % VEC_L)), work,
                                gw + G_KEND + (f // VEC_L) * (L // 2) + 4 * (f % VEC_L))
            elif e < 2 * L * VEC_K + dk * VEC_L + L * VEC_L:  # p: L rows of L
                f = e - 2 * L * VEC_K - dk * VEC_L
                ptx.cp_async_16(ptx.smem_addr(sm, base + PP + (f // VEC_L) * LS + 4 * (f % VEC_L)), work,
                                gw + G_P + (f // VEC_L) * (L // 2) + 4 * (f % VEC_L))
            else:  # eg: L floats
                f = e - 2 * L * VEC_K - dk * VEC_L - L * VEC_L
                ptx.cp_async_16(ptx.smem_addr(egs, L * st + 4 * f), work_f, gf + G_EG + 4 * f)
        ptx.cp_async_commit()

    @cuda.jit(device=True, inline=True)
    def z_in(sm, z, r0, nc, h):
        # -- the chunk's z rows of head h (nc real ones) into zs, the block's 16-byte cp.asyncs --
        for e in range(cuda.threadIdx.x, nc * (dv // 4), THREADS):
            i = e // (dv // 4)
            v = e % (dv // 4)
            ptx.cp_async_16(ptx.smem_addr(sm, ZS + i * dv + 4 * v), z, (r0 + i) * z.shape[1] + h * dv + 4 * v)
        ptx.cp_async_commit()

    # grid (Hv, B), block 32 dv / 16: V head h of sequence s (rows s T .. s T + T - 1, state slot
    # slots[s]); warp w owns rows 16 w .. 16 w + 15 of Sᵀ (dv x dk, fp32 C fragments in
    # registers for the whole launch) and of each chunk's v_newᵀ, oᵀ (dv x L).
    # shared, dynamic (uint32 words of fp16 pairs, layout()): st (dv x dk) Sᵀ; vt (dv x L)
    # v_newᵀ; zs (L x dv floats) the chunk's z; two stages of a chunk's qn, w (L x dk), kend_t
    # (dk x L), p (L x L), eg (L floats).
    # Static fp32: eg (2 stages x L) a chunk's e; red (WARPS x L) the norm's partials.
    # -- chunk 0 staged -- per chunk: its stage waited -- Sᵀ to st (own rows) -- barrier -- its z,
    #    then the next chunk, staged -- v_newᵀ to vt (own rows) -- oᵀ, norm partials; z waited --
    #    barrier -- out; Sᵀ updated --
    # The loads a lane makes from global memory (U, z) are issued together, not between stores
    # that could alias them: each would otherwise be a round trip to L2 on the chunk's path.
    def gdn_chunked(qkv, z, norm_w, eps, q_scale, state, slots, lengths, use_lengths, pos, use_pos,
                    work, work_f, out):
        h = cuda.blockIdx.x
        s = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        c = lane & 3
        v0 = 16 * warp
        Hv = cuda.gridDim.x
        T = qkv.shape[0] // slots.shape[0]
        NC = (T + L - 1) // L
        slot, n, src, dst = sequence_slots(slots, lengths, use_lengths, pos, use_pos, s, T)
        sm = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        smf = cuda.shared.array(0, float32, alignment=SMEM_ALIGN)  # the same bytes, as floats
        egs = cuda.shared.array(N_EG, float32)
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
        col = h * dv + v0 + g  # this lane's dv rows' column in z and out (+ 8)
        unit0 = s * NC * Hv + h
        if n > 0:
            stage_in(sm, egs, 0, work, work_f, unit0 * UW, unit0 * UF)

        for ci in range((n + L - 1) // L):
            c0 = ci * L
            nc = min(L, n - c0)
            r0 = s * T + c0
            base = STAGE * (ci & 1)
            eb = L * (ci & 1)
            unit = unit0 + ci * Hv
            ptx.cp_async_wait_group(0)
            # -- Sᵀ to st (fp16, own rows) --
            for nt in range(NTK):
                sm[ST + (v0 + g) * KS + 4 * nt + c] = ptx.pack_f16x2(S[4 * nt], S[4 * nt + 1])
                sm[ST + (v0 + g + 8) * KS + 4 * nt + c] = ptx.pack_f16x2(S[4 * nt + 2], S[4 * nt + 3])
            cuda.syncthreads()  # the stage is in; every warp is past the chunk before's reads
            z_in(sm, z, r0, nc, h)
            if c0 + L < n:
                stage_in(sm, egs, 1 - (ci & 1), work, work_f, (unit + Hv) * UW, (unit + Hv) * UF)
            # -- v_newᵀ = Uᵀ - Sᵀ Wᵀ (acc = -Uᵀ + Sᵀ Wᵀ), to vt (own rows) --
            for nt in range(NTL):
                for e in range(4):
                    i = 8 * nt + 2 * c + (e & 1)
                    acc[4 * nt + e] = -work_f[unit * UF + i * dv + v0 + g + 8 * (e >> 1)]
            strip_dk(acc, sm, ST + v0 * KS, KS, base + WN, KS)
            for nt in range(NTL):
                sm[VT + (v0 + g) * LS + 4 * nt + c] = ptx.pack_f16x2(-acc[4 * nt], -acc[4 * nt + 1])
                sm[VT + (v0 + g + 8) * LS + 4 * nt + c] = ptx.pack_f16x2(-acc[4 * nt + 2], -acc[4 * nt + 3])
            warp_sync()
            # -- oᵀ = (Sᵀ Qᵀ) e + v_newᵀ Pᵀ; the squares' sums of each token's column --
            for f in range(N_ACC):
                acc[f] = _ZERO
            strip_dk(acc, sm, ST + v0 * KS, KS, base + QN, KS)
            for nt in range(NTL):
                for e in range(4):
                    acc[4 * nt + e] *= egs[eb + 8 * nt + 2 * c + (e & 1)]
            strip_l(acc, sm, VT + v0 * LS, LS, base + PP, LS)
            for nt in range(NTL):
                for e in range(2):
                    y = acc[4 * nt + e] * acc[4 * nt + e] + acc[4 * nt + 2 + e] * acc[4 * nt + 2 + e]
                    y += shfl_xor(y, 4)
                    y += shfl_xor(y, 8)
                    y += shfl_xor(y, 16)
                    if g == 0:
                        red[warp * L + 8 * nt + 2 * c + e] = y
            if c0 + L < n:
                ptx.cp_async_wait_group(1)  # z in; the next chunk's stage may still be on its way
            else:
                ptx.cp_async_wait_group(0)
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
                        out[r0 + i, col] = acc[4 * nt + e] * f * w_lo * silu(smf[ZS + i * dv + v0 + g])
                        out[r0 + i, col + 8] = acc[4 * nt + 2 + e] * f * w_hi * silu(smf[ZS + i * dv + v0 + g + 8])
            # -- Sᵀ = exp(c_L) Sᵀ + v_newᵀ K_end --
            dl = egs[eb + nc - 1]
            for f in range(N_S):
                S[f] *= dl
            strip_s(S, sm, VT + v0 * LS, LS, base + KEND, LS)

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
                v_tiled: bool, out, stream, lengths=None, pos=None, chunk: int = CHUNK, work=None) -> None:
    """gdn_prefill's arguments and result (see there), in chunks of `chunk` tokens on the tensor
    cores: dk a multiple of 16 up to 128, dv of 32 up to 128. work: (uint32, float32) device
    arrays of at least work_shape(B, T, Hv, dk, dv, chunk) elements (None: allocated here, which
    a graph capture must not do)."""
    B, T, Hv, dk, dv = check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads, out)
    assert dk % 16 == 0 and chunk % 16 == 0, (dk, chunk)
    lengths, use_lengths, pos, use_pos = prompt_rows(slots, B, T, lengths, pos)
    n_words, n_floats = work_shape(B, T, Hv, dk, dv, chunk)
    if work is None:
        work = (cuda.device_array(n_words, np.uint32), cuda.device_array(n_floats, np.float32))
    words, floats = work
    assert words.dtype == np.uint32 and floats.dtype == np.float32
    assert words.shape[0] >= n_words and floats.shape[0] >= n_floats, "gdn_chunked: workspace too small"
    launch(prep_kernel(dk, dv, chunk), (-(-T // chunk), Hv, B), 2 * dv, stream, qkv, b, a, ssm_a, dt_bias,
           np.int32(n_k_heads), np.int32(bool(v_tiled)), slots, lengths, use_lengths, pos, use_pos, words, floats,
           shared_bytes=4 * prep_smem(dk, dv, chunk)["words"])
    launch(chunked_kernel(dk, dv, chunk), (Hv, B), 2 * dv, stream, qkv, z, norm_w, np.float32(eps),
           np.float32(dk ** -0.5), state, slots, lengths, use_lengths, pos, use_pos, words, floats, out,
           shared_bytes=4 * layout(dk, dv, chunk)["words"])


_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]
_I1 = types.int32[::1]
_I = types.int32
PREP_SIG = (_F2, _F2, _F2, _F1, _F1, _I, _I, _I1, _I1, _I, _I1, _I, types.uint32[::1], _F1)
SIG = (_F2, _F2, _F1, types.float32, types.float32, types.float32[:, :, :, ::1], _I1, _I1, _I, _I1, _I,
       types.uint32[::1], _F1, _F2)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py): Qwen3.5 /
    3.6's head dims at the chunk the forward uses; the kernels are made here, not at import."""
    mma = {"max_registers": 255, "ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]}
    return [(prep_kernel(128, 128, CHUNK), PREP_SIG, mma), (chunked_kernel(128, 128, CHUNK), SIG, mma)]
