"""Dequantize a whole packed weight to a row-major fp16 (rows, cols) buffer for the cuBLAS prefill path.

Values are those of `gguf.quants.dequantize` rounded to fp16 (round to nearest even), bit for bit.
Numpy reference: `dequant_ref`.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_blocks32 as qb32
from impnb.kernels.common import quant_blocks_fp4 as qbf
from impnb.kernels.common import quant_blocks_k as qbk
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch
from impnb.quants import dequantize

BLOCK = 256

# type -> (load, exact decoder, column of a half-chunk): see quant_blocks32.py, quant_blocks_k.py
DECODERS = {
    T.Q8_0: (qb32.q8_0_load, qb32.q8_0_run, qb32.block32_k),
    T.Q4_0: (qb32.q4_0_load, qb32.q4_0_run, qb32.block32_k),
    T.Q4_1: (qb32.q4_1_load, qb32.q4_1_run, qb32.block32_k),
    T.Q5_0: (qb32.q5_0_load, qb32.q5_0_run, qb32.block32_k),
    T.Q4_K: (qbk.q4_k_load, qbk.q4_k_run, qbk.k4_k),
    T.Q5_K: (qbk.q5_k_load, qbk.q5_k_run, qbk.k4_k),
    T.Q6_K: (qbk.q6_k_load, qbk.q6_k_run, qbk.q6_k_k),
    T.MXFP4: (qbf.mxfp4_load, qbf.mxfp4_run, qb32.block32_k),
    T.NVFP4: (qbf.nvfp4_load, qbf.nvfp4_run, qb32.block32_k),
    T.F16: (qb32.f16_load, qb32.f16_run, qb32.block32_k),
    T.F32: (qb32.f32_load, qb32.f32_run, qb32.block32_k),
}


def dequant_ref(w: np.ndarray, ggml_type: T) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes) -> fp16 (N, K)."""
    raw = np.asarray(w).view(np.uint8).reshape(w.shape[0], -1)
    return dequantize(raw, ggml_type).reshape(w.shape[0], -1).astype(np.float16)


@cuda.jit(device=True, inline=True)
def pack_f16x2(a, b):
    return qi.f32_to_f16_bits(a) | (qi.f32_to_f16_bits(b) << 16)


def q4_k_f16x2_ref(w: np.ndarray) -> np.ndarray:
    """Raw Q4_K weight bytes (N, row_bytes) -> fp16 (N, K) as quant_blocks_k.q4_k_words makes them:
    q * fp16(d sc) + fp16(-dmin mn) rounded once to fp16 (float64 holds it exactly)."""
    raw = np.asarray(w).view(np.uint8).reshape(w.shape[0], -1)
    blocks = raw.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
    sc_b = blocks[:, 4:16].astype(np.int64)
    sc = np.empty((len(blocks), 8), np.int64)
    mn = np.empty((len(blocks), 8), np.int64)
    sc[:, :4] = sc_b[:, 0:4] & 63
    mn[:, :4] = sc_b[:, 4:8] & 63
    sc[:, 4:] = (sc_b[:, 8:12] & 0xF) | ((sc_b[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (sc_b[:, 8:12] >> 4) | ((sc_b[:, 4:8] >> 6) << 4)
    s16 = (d * sc).astype(np.float32).astype(np.float16).astype(np.float64)
    m16 = (-(dmin * mn)).astype(np.float32).astype(np.float16).astype(np.float64)
    qs = blocks[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)  # sub-block 2g, 2g + 1
    out = (q * s16[:, :, None] + m16[:, :, None]).astype(np.float16)
    return out.reshape(w.shape[0], -1)


def q6_k_f16x2_ref(w: np.ndarray) -> np.ndarray:
    """Raw Q6_K weight bytes (N, row_bytes) -> fp16 (N, K) as quant_blocks_k.q6_k_words makes them:
    (q - 32) * fp16(d sc) + 0 rounded once to fp16 (the + 0 as the fma's: a zero product is +0)."""
    raw = np.asarray(w).view(np.uint8).reshape(w.shape[0], -1)
    blocks = raw.reshape(-1, 210).copy()
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float64)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float64)
    unit = blocks.copy()  # the quants alone: d = 1, every scale 1
    unit[:, 192:208] = 1
    unit[:, 208:210] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    q = dequantize(unit, T.Q6_K).reshape(-1, 16, 16).astype(np.float64)  # 16 groups of 16 a block
    s16 = (d * sc).astype(np.float32).astype(np.float16).astype(np.float64)
    out = (q * s16[:, :, None] + 0.0).astype(np.float16)
    return out.reshape(w.shape[0], -1)


F16X2_REFS = {T.Q4_K: q4_k_f16x2_ref, T.Q6_K: q6_k_f16x2_ref}  # numpy twins of quant_blocks_k's f16x2 decoders


def _make_dequant(load, run, col):
    # grid (ceil(N*K/32 / 256),), block 256: thread g owns global chunk g (32 weights of one row),
    # writes its two halves of 16 fp16 values as 2 x 16-byte stores each. out: (N, K/2) uint32
    # view of the fp16 (N, K) buffer.
    @cuda.jit
    def _dequant_kernel(parts, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        cpr = out.shape[1] // 16
        g = cuda.grid(1)
        if g >= out.shape[0] * cpr:
            return
        row = g // cpr
        c = g - row * cpr
        raw = load(parts, g)
        w = cuda.local.array(16, float32)
        for h in range(2):
            s = run(raw, c, h, w)
            base = row * out.shape[1] + col(c, h) // 2
            for v in range(2):
                o = 8 * v
                qi.stg_x4(out, base + 4 * v,
                          pack_f16x2(w[o] * s, w[o + 1] * s), pack_f16x2(w[o + 2] * s, w[o + 3] * s),
                          pack_f16x2(w[o + 4] * s, w[o + 5] * s), pack_f16x2(w[o + 6] * s, w[o + 7] * s))

    return _dequant_kernel


@lru_cache(maxsize=None)
def dequant_kernel(ggml_type: T):
    return _make_dequant(*DECODERS[T(ggml_type)])


def dequant(w: PackedWeight, out, stream):
    """out (rows, cols) float16 = dequantized w."""
    assert out.shape == (w.rows, w.cols) and out.dtype == np.float16 and out.is_c_contiguous()
    out32 = out.view(np.uint32)
    n_chunks = w.rows * w.cols // 32
    launch(dequant_kernel(w.ggml_type), (n_chunks + BLOCK - 1) // BLOCK, BLOCK, stream, w.parts, out32)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (dequant_kernel(t), types.void(parts_type(t), types.Array(types.uint32, 2, "C")),
         {"max_registers": 96})
        for t in DECODERS
    ]
