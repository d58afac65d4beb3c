"""gemm_wgmma_rs's lane layout in numpy: the quants each lane (t) reads for a 64-column (Q4_K) or
128-column (Q6_K) step, decoded as its row_frags decodes them, equal gguf's dequantization at the
columns perm_columns puts in those fragment slots (random weights, a quarter of the blocks random
bytes); so A permuted by permute_a meets each weight at its own column."""

import numpy as np
from gguf import GGMLQuantizationType as T, quants

from impnb.kernels.gemm.gemm_wgmma_rs_block import perm_columns, permute_a
from tests.test_repack import make_weight

K = 768


def _q4_k_scales(b, j):
    s = b[4:16].astype(np.int32)
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def test_perm_columns_is_a_permutation_and_permute_a_applies_it():
    perm = perm_columns()
    assert sorted(perm) == list(range(64))
    a = np.arange(2 * 128, dtype=np.float16).reshape(2, 128)
    assert np.array_equal(permute_a(a)[:, 64:], a[:, 64 + perm])


def test_q4_k_lanes():
    raw = make_weight(T.Q4_K, 1, K, np.random.default_rng(1)).reshape(-1)
    deq = quants.dequantize(raw.reshape(1, -1), T.Q4_K).reshape(-1)
    blk = raw.reshape(K // 256, 144)
    perm = perm_columns()
    for st in range(K // 64):
        b, p = blk[st // 4], st % 4
        d, dm = (float(v) for v in b[0:4].view(np.float16))
        qs = b[16 + 32 * p:48 + 32 * p].astype(np.int32)
        for t in range(4):  # lane t: bytes 8t .. 8t + 7 of the step, low then high nibbles
            got = {}
            for hi in range(2):
                sc, m = _q4_k_scales(b, 2 * p + hi)
                for i in range(8):
                    got[32 * hi + 8 * t + i] = d * sc * ((qs[8 * t + i] >> (4 * hi)) & 15) - dm * m
            slots = [q for q in range(64) if (q % 8) // 2 == t]  # the fragment positions lane t holds
            assert sorted(perm[slots]) == sorted(got)
            for c, v in got.items():
                np.testing.assert_allclose(v, deq[64 * st + c], rtol=1e-3, atol=1e-6)


def test_q6_k_lanes():
    raw = make_weight(T.Q6_K, 1, K, np.random.default_rng(2)).reshape(-1)
    deq = quants.dequantize(raw.reshape(1, -1), T.Q6_K).reshape(-1)
    blk = raw.reshape(K // 256, 210)
    ql, qh = blk[:, 0:128].reshape(-1).astype(np.int32), blk[:, 128:192].reshape(-1).astype(np.int32)
    sc = blk[:, 192:208].view(np.int8).reshape(-1).astype(np.float32)
    d = blk[:, 208:210].copy().view(np.float16).astype(np.float32).reshape(-1)
    perm = perm_columns()
    for s in range(K // 128):
        qlw, qhw, scw = ql[64 * s:64 * s + 64], qh[32 * s:32 * s + 32], sc[16 * (s >> 1):16 * (s >> 1) + 16]
        for hi in range(2):  # the step's two 64-column halves
            sw = scw[8 * (s & 1) + 4 * hi:8 * (s & 1) + 4 * hi + 4]
            for t in range(4):
                sh = 4 * hi
                lo = (((qlw[8 * t:8 * t + 8] >> sh) & 15) | (((qhw[8 * t:8 * t + 8] >> sh) & 3) << 4)) - 32
                up = (((qlw[32 + 8 * t:40 + 8 * t] >> sh) & 15) | (((qhw[8 * t:8 * t + 8] >> (sh + 2)) & 3) << 4)) - 32
                got = {8 * t + i: lo[i] * sw[t >> 1] * d[s >> 1] for i in range(8)}
                got.update({32 + 8 * t + i: up[i] * sw[2 + (t >> 1)] * d[s >> 1] for i in range(8)})
                slots = [q for q in range(64) if (q % 8) // 2 == t]
                assert sorted(perm[slots]) == sorted(got)
                for c, v in got.items():
                    np.testing.assert_allclose(v, deq[128 * s + 64 * hi + c], rtol=1e-3, atol=1e-6)
