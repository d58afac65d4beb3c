"""The residual tail of a decode GEMV: the grid's last block adds the GEMV's output y into the
residual stream x and writes the next normed input h, so no norm kernel follows the GEMV in the
decode graph. After attn_output / ffn_down; the kernels it replaces (norm.rms_norm_add,
norm.rms_norm_post_add) are its reference:
  x[t] += y[t]                      (ADD)
  x[t] += RMSNorm(y[t]) * w_post    (POST_ADD, Gemma's post-norms)
  h[t]  = RMSNorm(x[t]) * w_next
quant_tail, after a kernel that adds its rows into x itself (the routed experts' down): the last
block writes the next layer's input in quantize_x's int8 form, RMSNorm(x[t]) * w_next, for the
dp4a GEMV that takes it (no quantize_x launch between). make_tail works the rows with the whole
block, one after another (one token's GEMVs). Residual.unfused is the same update by the norm kernels.
Every block publishes its rows of y (a threadfence) and takes a ticket from `counter` (an atomic
increment that wraps to 0 at the grid size, so the counter is zero again for the next use); the
block holding the last ticket reads y through L2 (ld.global.cg: L1 is not coherent across SMs).
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, uint32

from impnb.kernels.common.warp import block_sum
from impnb.kernels.elementwise import norm
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.quant_x import GROUP, quantize16, quantize_x

ADD = 1
POST_ADD = 2


@cuda.jit(device=True, inline=True)
def last_block(counter):
    """1 in every thread of the grid's (1-D) last block to get here, else 0; after this block's
    stores of the GEMV output. As cooperative groups' grid sync: the barrier orders the block's
    stores before thread 0's fence and ticket, and thread 0's fence after a last ticket orders the
    block's reads after it."""
    return last_of(counter, uint32(cuda.gridDim.x))


@cuda.jit(device=True, inline=True)
def last_of(counter, n):
    """last_block among n blocks that each call it once (counter wraps to 0 after the n-th)."""
    last = cuda.shared.array(1, int32)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.threadfence()
        last[0] = 1 if cuda.atomic.inc(counter, 0, n - 1) == n - 1 else 0
        if last[0]:
            cuda.threadfence()
    cuda.syncthreads()
    return last[0]


class Residual(NamedTuple):
    """x (T, D) += y or RMSNorm(y) * w_post (w_post None: ADD), then h (T, D) = RMSNorm(x) * w_next;
    float32 device arrays; counter (1,) uint32, zero between uses."""
    x: object
    h: object
    w_next: object
    w_post: object
    eps: float
    counter: object
    hq: object = None  # quant_x.QuantX: h's int8 form written too, for the dp4a GEMV that reads h next

    @property
    def mode(self) -> int:
        return ADD if self.w_post is None else POST_ADD

    def unfused(self, y, stream) -> None:
        """The same update by the norm kernel (after a GEMM, or where no tail runs); hq written by
        the post-norm's kernel, or by quantize_x after the other."""
        if self.w_post is None:
            norm.rms_norm_add(self.x, y, self.w_next, self.h, self.eps, stream)
            if self.hq is not None:
                quantize_x(self.h, self.hq, stream)
        else:
            norm.rms_norm_post_add(self.x, y, self.w_post, self.w_next, self.h, self.eps, stream, out_q=self.hq)

    def args(self, y) -> tuple:
        """The tail's kernel arguments after the GEMV's own."""
        D = self.x.shape[1]
        assert self.x.shape == self.h.shape == y.shape and D % 4 == 0, (self.x.shape, y.shape)
        for a in (self.x, self.h, self.w_next) + ((self.w_post,) if self.w_post is not None else ()):
            assert a.dtype == np.float32 and a.is_c_contiguous()
        assert self.counter.dtype == np.uint32 and self.counter.shape == (1,)
        w_post = self.w_next if self.w_post is None else self.w_post
        return self.x, w_post, self.w_next, self.h, np.float32(self.eps), self.counter


@cuda.jit(device=True, inline=True)
def inv_rms(ss, D, eps):
    """1 / rms of a row of D floats whose squares sum to ss."""
    return float32(1.0) / math.sqrt(ss / float32(D) + eps)


def make_tail(mode: int):
    """Device function tail(y, x, w_post, w_next, h, eps, counter) for every block of a 1-D grid
    of 32k threads a block, called after the block's stores of y; mode ADD or POST_ADD."""
    assert mode in (ADD, POST_ADD)

    @cuda.jit(device=True, inline=True)
    def tail(y, x, w_post, w_next, h, eps, counter):
        if last_block(counter) == 0:
            return
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        red = cuda.shared.array(32, float32)
        D = x.shape[1]
        for t in range(x.shape[0]):
            # -- POST_ADD: 1 / rms of y[t] --
            scale = float32(1.0)
            if mode == POST_ADD:
                ss = float32(0.0)
                for i in range(4 * tid, D, 4 * nt):
                    y0, y1, y2, y3 = ptx.ld_global_cg_v4_f32(y, t * D + i)
                    ss += (y0 * y0 + y1 * y1) + (y2 * y2 + y3 * y3)
                scale = inv_rms(block_sum(ss, red), D, eps)
            # -- x[t] += y[t] (scaled, times w_post), summing the new x² --
            ss = float32(0.0)
            for i in range(4 * tid, D, 4 * nt):
                yv = ptx.ld_global_cg_v4_f32(y, t * D + i)
                for j in range(4):
                    v = yv[j]
                    if mode == POST_ADD:
                        v = v * scale * w_post[i + j]
                    v += x[t, i + j]
                    x[t, i + j] = v
                    ss += v * v
            inv = inv_rms(block_sum(ss, red), D, eps)
            # -- h[t] = x[t] / rms * w_next (the same thread's own columns of x) --
            for i in range(4 * tid, D, 4 * nt):
                for j in range(4):
                    h[t, i + j] = x[t, i + j] * inv * w_next[i + j]

    return tail


@cuda.jit(device=True, inline=True)
def quant_tail(x, w_next, eps, q, d, s, counter):
    """For every block of a 1-D grid of 32k threads a block, after the block's stores into x:
    the last block writes RMSNorm(x[t]) * w_next in int8 into q, d, s (quant_x.QuantX's arrays,
    quantize16's rounding) for each row t, reading x through L2."""
    if last_block(counter) == 0:
        return
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    red = cuda.shared.array(32, float32)
    v = cuda.local.array(GROUP, float32)
    D = x.shape[1]
    for t in range(x.shape[0]):
        ss = float32(0.0)
        for i in range(4 * tid, D, 4 * nt):
            x0, x1, x2, x3 = ptx.ld_global_cg_v4_f32(x, t * D + i)
            ss += (x0 * x0 + x1 * x1) + (x2 * x2 + x3 * x3)
        inv = float32(1.0) / math.sqrt(block_sum(ss, red) / float32(D) + eps)
        for g in range(tid, D // GROUP, nt):
            for j in range(GROUP // 4):
                c = GROUP * g + 4 * j
                x0, x1, x2, x3 = ptx.ld_global_cg_v4_f32(x, t * D + c)
                w0, w1, w2, w3 = qi.ldg_f32x4(w_next, c)
                v[4 * j], v[4 * j + 1] = x0 * inv * w0, x1 * inv * w1
                v[4 * j + 2], v[4 * j + 3] = x2 * inv * w2, x3 * inv * w3
            q[t, 4 * g], q[t, 4 * g + 1], q[t, 4 * g + 2], q[t, 4 * g + 3], d[t, g], s[t, g] = quantize16(v)
