"""Embedding lookup: out[t, :] = dequant(token_embd row ids[t]) * scale, float32 out.

Reuses the exact block decoders of quant_blocks32.py / quant_blocks_k.py, so each value is
bit-equal to numpy's `dequantize(row) * float32(scale)`. Numpy reference: `embedding_ref`.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemm.dequant import DECODERS
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch
from impnb.quants import dequantize

BLOCK = 64
EMBEDDING_TYPES = (T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.Q4_1, T.MXFP4, T.NVFP4, T.F16, T.F32)


def embedding_ref(table: np.ndarray, ggml_type: T, ids: np.ndarray, scale: float) -> np.ndarray:
    """Raw GGUF table bytes (vocab, row_bytes), ids (T,) -> float32 (T, d)."""
    rows = np.asarray(table).view(np.uint8).reshape(table.shape[0], -1)[ids]
    return dequantize(rows, ggml_type).reshape(len(ids), -1) * np.float32(scale)


def _make_embedding(load, run, col):
    # grid (ceil(d/32 / 64), T), block 64: thread (c, t) owns chunk c (32 values) of token t's row,
    # written as 8 x 16-byte stores. An id outside [0, n_rows) gives a NaN row.
    @cuda.jit
    def _embedding_kernel(parts, ids, out, n_rows, scale):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        K = out.shape[1]
        cpr = K // 32
        if c >= cpr:
            return
        row = ids[t]
        w = cuda.local.array(16, float32)
        if row < 0 or row >= n_rows:
            nan = float32(np.nan)
            for h in range(2):
                for v in range(4):
                    qi.stg_x4(out, t * K + col(c, h) + 4 * v, nan, nan, nan, nan)
            return
        g = row * cpr + c
        raw = load(parts, g)
        for h in range(2):
            s = run(raw, c, h, w)
            base = t * K + col(c, h)
            for v in range(4):
                o = 4 * v
                qi.stg_x4(out, base + o, (w[o] * s) * scale, (w[o + 1] * s) * scale,
                          (w[o + 2] * s) * scale, (w[o + 3] * s) * scale)

    return _embedding_kernel


@lru_cache(maxsize=None)
def embedding_kernel(ggml_type: T):
    ggml_type = T(ggml_type)
    if ggml_type not in EMBEDDING_TYPES:
        raise ValueError(f"embedding: {ggml_type.name} tables are not supported")
    return _make_embedding(*DECODERS[ggml_type])


def embedding(table: PackedWeight, ids, out, scale: float, stream):
    """out (T, d) float32 = rows ids (T,) int32 of table, times scale."""
    n_tok = ids.shape[0]
    assert out.shape == (n_tok, table.cols) and out.dtype == np.float32 and out.is_c_contiguous()
    assert ids.dtype == np.int32
    grid = ((table.cols // 32 + BLOCK - 1) // BLOCK, n_tok)
    launch(embedding_kernel(table.ggml_type), grid, BLOCK, stream,
           table.parts, ids, out, np.int32(table.rows), np.float32(scale))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (embedding_kernel(t), types.void(parts_type(t), types.Array(types.int32, 1, "C"),
                                         types.Array(types.float32, 2, "C"), types.int32, types.float32),
         {"max_registers": 96})
        for t in EMBEDDING_TYPES
    ]
