"""Prefill attention over the paged fp16 KV cache: correct, simple, not yet fast.

T query tokens of one sequence at positions pos[t] (pos0 .. pos0 + T - 1 for a prompt chunk)
against every cached key 0 .. pos[t] (causal, optional sliding window and softcap), GQA,
online softmax in float32. Chunked prefill works because keys are read from the cache, which
already holds this chunk's K/V (kv_write first). A tensor-core version will replace it.
"""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels import ptx
from impnb.kernels.attention_decode import HEAD_DIMS, NEG
from impnb.kernels.kv_cache import PAGE_SIZES
from impnb.kernels.norm import warp_sum
from impnb.launch import launch

NT = 128
NW = NT // 32
_ZERO = np.float32(0)
_ONE = np.float32(1)


def _make_prefill_kernel(D: int):
    NPL = D // 32  # dims per lane
    ACC = (NW, D)

    # grid (T, H), block 128 (4 warps): a block owns query row (t, h). Warp w takes keys
    # lo + w, lo + w + 4, ... <= pos[t] and keeps its own online softmax (m, l, acc); lane owns
    # dims lane + 32 * i, so K/V rows are read coalesced and q·k is a warp_sum.
    # shared: ms, ls f32[4] and accs f32[4][D] to merge the warps at the end.
    def prefill_kernel(q, k_pool, v_pool, block_table, pos, out, scale, window, softcap):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.x
        h = cuda.blockIdx.y
        kh = h // (q.shape[1] // k_pool.shape[2])
        page_size = k_pool.shape[1]
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        qp = pos[t]
        lo = max(0, qp - window + 1) if window > 0 else 0

        qr = cuda.local.array(NPL, types.float32)
        acc = cuda.local.array(NPL, types.float32)
        for i in range(NPL):
            qr[i] = q[t, h, lane + 32 * i] * scale
            acc[i] = _ZERO
        m = NEG
        l = _ZERO

        # -- this warp's keys: score, online softmax, P·V --
        for key in range(lo + warp, qp + 1, NW):
            page = block_table[key // page_size]
            off = key % page_size
            x = _ZERO
            for i in range(NPL):
                x += qr[i] * types.float32(k_pool[page, off, kh, lane + 32 * i])
            x = warp_sum(x)
            if softcap > _ZERO:
                x = softcap * math.tanh(x / softcap)
            m_new = max(m, x)
            a = math.exp(m - m_new)
            p = math.exp(x - m_new)
            l = l * a + p
            for i in range(NPL):
                acc[i] = acc[i] * a + p * types.float32(v_pool[page, off, kh, lane + 32 * i])
            m = m_new

        # -- merge the warps (a warp without keys has m = NEG, l = 0, acc = 0) --
        ms = cuda.shared.array(NW, types.float32)
        ls = cuda.shared.array(NW, types.float32)
        accs = cuda.shared.array(ACC, types.float32)
        if lane == 0:
            ms[warp] = m
            ls[warp] = l
        for i in range(NPL):
            accs[warp, lane + 32 * i] = acc[i]
        cuda.syncthreads()
        mx = NEG
        for w in range(NW):
            mx = max(mx, ms[w])
        total = _ZERO
        for w in range(NW):
            total += math.exp(ms[w] - mx) * ls[w]
        inv = _ONE / total
        for d in range(cuda.threadIdx.x, D, NT):
            o = _ZERO
            for w in range(NW):
                o += math.exp(ms[w] - mx) * accs[w, d]
            out[t, h, d] = o * inv

    prefill_kernel.__name__ = f"_prefill_d{D}_kernel"
    return cuda.jit(prefill_kernel)


_PREFILL_KERNELS = {D: _make_prefill_kernel(D) for D in HEAD_DIMS}


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def attention_prefill(q, k_pool, v_pool, block_table, pos, out, scale: float,
                      window: int | None, softcap: float | None, stream) -> None:
    """out (T, H, D) = causal attention of q (T, H, D) float32 at positions pos (T,) int32.

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16 already hold keys 0 .. max(pos);
    block_table (max_pages,) int32 of this sequence. window None or > 0; softcap None or > 0.
    """
    for a, dt, nd, name in ((q, np.float32, 3, "q"), (out, np.float32, 3, "out"),
                            (k_pool, np.float16, 4, "k_pool"), (v_pool, np.float16, 4, "v_pool"),
                            (block_table, np.int32, 1, "block_table"), (pos, np.int32, 1, "pos")):
        _check(a, dt, nd, name)
    T, H, D = q.shape
    assert out.shape == q.shape and pos.shape == (T,), "out or pos shape"
    assert D in HEAD_DIMS and k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "head dims"
    assert k_pool.shape[1] in PAGE_SIZES and H % k_pool.shape[2] == 0, "pages or heads"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    if T:
        launch(_PREFILL_KERNELS[D], (T, H), NT, stream, q, k_pool, v_pool, block_table, pos, out,
               np.float32(scale), np.int32(window or 0), np.float32(softcap or 0.0))


_SIG = (types.float32[:, :, ::1], types.float16[:, :, :, ::1], types.float16[:, :, :, ::1],
        types.int32[::1], types.int32[::1], types.float32[:, :, ::1],
        types.float32, types.int32, types.float32)
BUILD_SIGNATURES = [(kernel, _SIG, {"max_registers": 128}) for kernel in _PREFILL_KERNELS.values()]
