"""A gated FFN's gate|up split-K partials to the down GEMM's input in one launch: the S partial
sums of gate|up added in split order (as gemm_quant_splitk's reduce adds them), act(gate) * up
(SwiGLU or GeGLU, as activations.swiglu_fused computes it) and the product written as the down's
A operand: in fp16 (saturated, as cast_f16) for the fp16 GEMMs, or in gemm_mmq's int8 groups
(quantize_x32's QuantX32) for the int8 one. In place of the reduce, the activation and the cast
or quantization: three launches of a batch's decode step a layer, and gate|up's (T, 2F) and
act's (T, F) float32 never written.

    part (S, M, 2F) float32: gate|up's partial products, gate columns 0..F-1, up F..2F-1 (S = 1:
        the GEMM's own output)
    out: (M, F) float16, or QuantX32 (q (MP, F/4), ds (F/32, MP, 2)), rows M..MP-1 zero

Numpy reference: reduce_glu_ref (the float32 values before the cast or quantization).
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common import warp
from impnb.kernels.elementwise.activations import gelu_tanh_dev, silu_dev
from impnb.kernels.elementwise.cast import perm_pos, sat_f16
from impnb.kernels.elementwise.reference import gelu_tanh, silu
from impnb.kernels.gemm.quant_x32 import XGROUP, QuantX32
from impnb.launch import launch

THREADS = 128
ACTS = {"silu": silu_dev, "gelu": gelu_tanh_dev}


def reduce_glu_ref(part: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up of part's summed splits (in split order, float32): (M, F) float32."""
    part = np.asarray(part, np.float32)
    acc = part[0].copy()
    for s in range(1, part.shape[0]):
        acc += part[s]
    F = acc.shape[1] // 2
    g = acc[:, :F].astype(np.float64)
    return ((silu(g) if act == "silu" else gelu_tanh(g)) * acc[:, F:]).astype(np.float32)


@lru_cache(maxsize=None)
def reduce_glu_kernel(act: str, half: bool, perm: bool = False):
    """The kernel for act ("silu", "gelu") into fp16 (half: (part, out16); perm: each 64-column
    step's columns in gemm_wgmma_rs's order, cast.perm_pos) or QuantX32 ((part, q, ds))."""
    fn = ACTS[act]

    @cuda.jit(device=True, inline=True)
    def four(part, t, c):
        # act(gate) * up at columns c .. c + 3 of row t, the splits added in order
        S, M, N2 = part.shape
        F = N2 // 2
        g0, g1, g2, g3 = qi.ldg_f32x4(part, t * N2 + c)
        u0, u1, u2, u3 = qi.ldg_f32x4(part, t * N2 + F + c)
        for s in range(1, S):
            a0, a1, a2, a3 = qi.ldg_f32x4(part, (s * M + t) * N2 + c)
            b0, b1, b2, b3 = qi.ldg_f32x4(part, (s * M + t) * N2 + F + c)
            g0 += a0
            g1 += a1
            g2 += a2
            g3 += a3
            u0 += b0
            u1 += b1
            u2 += b2
            u3 += b3
        return fn(g0) * u0, fn(g1) * u1, fn(g2) * u2, fn(g3) * u3

    # grid (ceil(F / (4 x 128)), M), block 128: a thread columns 4 j .. 4 j + 3 (j its index in the
    # row) of row blockIdx.y
    def reduce_glu_f16(part, out16):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        c = 4 * (cuda.blockIdx.x * THREADS + cuda.threadIdx.x)
        if c >= part.shape[2] // 2:
            return
        v0, v1, v2, v3 = four(part, t, c)
        if perm:
            q = perm_pos(c)
            out16[t, q] = sat_f16(v0)
            out16[t, q + 1] = sat_f16(v1)
            out16[t, q + 8] = sat_f16(v2)
            out16[t, q + 9] = sat_f16(v3)
        else:
            out16[t, c] = sat_f16(v0)
            out16[t, c + 1] = sat_f16(v1)
            out16[t, c + 2] = sat_f16(v2)
            out16[t, c + 3] = sat_f16(v3)

    # grid (ceil(F / (4 x 128)), MP), block 128: as above, 8 lanes a 32-column int8 group (its amax
    # and sum over them by shuffles; _quantize_words32's values), rows M..MP-1 zero groups
    def reduce_glu_q32(part, q, ds):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        c = 4 * (cuda.blockIdx.x * THREADS + cuda.threadIdx.x)
        F = part.shape[2] // 2
        live = c < F  # whole 8-lane groups (F % 32 == 0); every lane takes the shuffles
        v0 = v1 = v2 = v3 = float32(0.0)
        if live and t < part.shape[1]:
            v0, v1, v2, v3 = four(part, t, c)
        amax = max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3)))
        for off in (1, 2, 4):
            amax = max(amax, warp.shfl_xor(amax, off))
        inv = float32(127.0) / amax if amax > float32(0.0) else float32(0.0)
        k0 = qi.rint_s32(v0 * inv)
        k1 = qi.rint_s32(v1 * inv)
        k2 = qi.rint_s32(v2 * inv)
        k3 = qi.rint_s32(v3 * inv)
        total = k0 + k1 + k2 + k3
        for off in (1, 2, 4):
            total += warp.shfl_xor(total, off)
        if not live:
            return
        q[t, c // 4] = (uint32(k0 & 0xFF) | (uint32(k1 & 0xFF) << uint32(8)) | (uint32(k2 & 0xFF) << uint32(16))
                        | (uint32(k3 & 0xFF) << uint32(24)))
        if cuda.threadIdx.x % 8 == 0:
            scale = amax / float32(127.0)
            ds[c // XGROUP, t, 0] = scale
            ds[c // XGROUP, t, 1] = scale * float32(total)

    kernel = reduce_glu_f16 if half else reduce_glu_q32
    kernel.__name__ = f"_reduce_glu_{act}_{'f16' if half else 'q32'}{'_perm' if perm else ''}_kernel"
    return cuda.jit(kernel)


def reduce_glu(part, act: str, out, stream, perm: bool = False) -> None:
    """out = act(gate) * up of part (S, M, 2F) float32's splits summed in order: out an (M, F) fp16
    array (perm: in gemm_wgmma_rs's column order, F a multiple of 64), or QuantX32 (gemm_mmq's input
    of the down; its rows past M zeroed); F a multiple of 32."""
    S, M, N2 = part.shape
    F = N2 // 2
    assert part.dtype == np.float32 and part.is_c_contiguous() and N2 % 2 == 0 and F % XGROUP == 0
    assert act in ACTS, f"no gated activation {act!r}"
    grid_x = -(-F // (4 * THREADS))
    if isinstance(out, QuantX32):
        MP = out.q.shape[0]
        assert out.q.shape == (MP, F // 4) and out.ds.shape == (F // XGROUP, MP, 2) and MP >= M
        launch(reduce_glu_kernel(act, False), (grid_x, MP), THREADS, stream, part, out.q, out.ds)
        return
    assert out.dtype == np.float16 and out.shape == (M, F) and out.is_c_contiguous() and not (perm and F % 64)
    if M:
        launch(reduce_glu_kernel(act, True, perm), (grid_x, M), THREADS, stream, part, out)


F32_3D = types.Array(types.float32, 3, "C")
SIGS = {True: types.void(F32_3D, types.Array(types.float16, 2, "C")),
        False: types.void(F32_3D, types.Array(types.uint32, 2, "C"), F32_3D)}


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(reduce_glu_kernel(act, half, perm), SIGS[half], {"max_registers": 96})
            for act in ACTS for half, perm in ((False, False), (True, False), (True, True))]
