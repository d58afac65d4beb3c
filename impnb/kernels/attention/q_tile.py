"""The query tile's loader the tensor-core attention kernels share (attention_fa2, its decode form,
attention_wgmma): float32 query rows, scaled, to fp16 or bf16 in shared memory."""

from functools import lru_cache

from numba import cuda, float32, uint32

from impnb.kernels.common import ptx


@lru_cache(maxsize=None)
def q_tile_loader(D: int, BM: int, threads: int, offset, bf16: bool = False, group: bool = False):
    """A device function q_tile(q, sq, t0, h, qscale): Q rows t0 .. t0 + BM - 1 of head h (q (T, H,
    D) float32) times qscale, to fp16 (bf16) in shared memory, 16-byte chunk ch of tile row r at
    sq + offset(r, ch); a block of `threads` loads QB chunks of 8 values a thread (16-byte loads)
    before converting any; rows past T are zeros. group: q_tile(q, sq, h0, G, qscale) loads heads
    h0 .. h0 + G - 1 of row 0 as the tile's rows (rows past G are zeros)."""
    CH = D // 8
    Q_CHUNKS = BM * CH // threads  # 16-byte fp16 chunks of the Q tile per thread
    QB = min(Q_CHUNKS, 8)          # ... loaded per round
    QV = 8 * QB                    # their float32 values
    pack = ptx.pack_bf16x2 if bf16 else ptx.pack_f16x2
    assert Q_CHUNKS % QB == 0

    @cuda.jit(device=True, inline=True)
    def q_tile(q, sq, t0, h, qscale):
        T = q.shape[0]
        H = q.shape[1]
        tid = cuda.threadIdx.x
        for b in range(Q_CHUNKS // QB):
            qv = cuda.local.array(QV, float32)
            for u in range(QB):
                idx = tid + threads * (QB * b + u)
                r = idx // CH
                if group:  # t0: the first head, h: the heads
                    base = (t0 + min(r, h - 1)) * D + 8 * (idx - r * CH)
                else:
                    base = (min(t0 + r, T - 1) * H + h) * D + 8 * (idx - r * CH)
                for v in range(2):
                    qv[8 * u + 4 * v], qv[8 * u + 4 * v + 1], qv[8 * u + 4 * v + 2], qv[8 * u + 4 * v + 3] = \
                        ptx.ld_global_cg_v4_f32(q, base + 4 * v)
            for u in range(QB):
                idx = tid + threads * (QB * b + u)
                r = idx // CH
                live = r < h if group else t0 + r < T
                w = cuda.local.array(4, uint32)
                for i in range(4):
                    w[i] = pack(qv[8 * u + 2 * i] * qscale, qv[8 * u + 2 * i + 1] * qscale) if live else 0
                ptx.st_shared_v4_u32(sq + offset(r, idx - r * CH), w[0], w[1], w[2], w[3])

    return q_tile
