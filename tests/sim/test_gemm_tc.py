"""ptx.py's intrinsics and the gemm_tc tiles in numba's CUDA simulator, on ptx_sim.py's Python twins.

The twins encode the same PTX ISA tables as the GPU probes, so these runs check the kernels'
logic -- swizzled addressing, lane-to-fragment addressing, pipeline waits (a cp.async lands only
at the wait_group retiring it here), M/N edges, the quantized decode into shared memory, the
epilogue -- and the GPU tests' own harness. Whether the hardware agrees with the tables is for
tests/gpu/test_ptx.py on a GPU. Sizes are tiny: every CUDA thread is a Python thread here.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_tc import gemm_f16, gemm_ref
from impnb.kernels.gemm.gemm_tc_quant import gemm_quant
from tests.gpu import test_gemm_tc as gemm_tests
from tests.gpu import test_ptx as probes


def test_intrinsic_probes():
    for dtype in ("f16", "bf16"):
        probes.test_mma_a_fragment(dtype)
        probes.test_mma_b_fragment(dtype)
        probes.test_mma_c_fragment(dtype)
        probes.test_mma_product(dtype)
    for n in (1, 2, 4):
        for trans in (False, True):
            probes.test_ldmatrix(n, trans)
    probes.test_cp_async()
    probes.test_global_v4_and_v2()
    for k in (32, 16):
        probes.test_mma_s8(k)
    probes.test_shared_addresses_and_v4()
    probes.test_pack_f16x2_bf16x2()


def test_tile_fragments():
    probes.test_tile_fragments((64, 128, 2, 4))


def test_gemm_f16_small():
    """Two M tiles with a ragged edge, a 4-slot ring over 5 stages (wraps), accumulate."""
    rng = np.random.default_rng(0)
    M, N, K = 70, 8, 160
    tile = (64, 128, 2, 4, 4)
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    a = rng.standard_normal((M, K)).astype(np.float16)
    c0 = rng.standard_normal((M, N)).astype(np.float32)

    def fn(a_, w_, c_, s, accumulate):
        gemm_f16(a_, w_, c_, s, accumulate, tile=tile)

    got = gemm_tests.run(fn, a, cuda.to_device(w16), M, N, c0)
    gemm_tests.check(got, gemm_ref(a, w16, c=c0.astype(np.float64)), a, w16, K, c0)


def test_gemm_quant_small():
    M, N, K = 5, 8, 256
    raw, w16, w = gemm_tests.weight(T.Q4_K, N, K)
    a = np.random.default_rng(1).standard_normal((M, K)).astype(np.float16)

    def fn(a_, w_, c_, s, accumulate):
        gemm_quant(a_, w_, c_, s, accumulate, bm=64)

    got = gemm_tests.run(fn, a, w, M, N)
    gemm_tests.check(got, gemm_ref(a, raw, T.Q4_K), a, w16, K)


def test_gemm_splitk_small():
    """Two M tiles (a ragged edge), K in 3 uneven splits (2, 3, 3 chunks of 32, a split's range
    inside a Q4_K block), accumulate; the reduce in split order."""
    from tests.gpu.test_gemm_splitk import check_splitk

    check_splitk(T.Q4_K, 70, 8, 256, 3, 1.0, seed=2, accumulate=True)


def test_gemm_splitk_split_small():
    """Stacked rows into three outputs at 4-column boundaries; 2 splits."""
    from tests.gpu.test_gemm_splitk import check_splitk_split

    check_splitk_split(T.Q8_0, 3, (8, 4, 4), 128, 2, seed=3)


def test_gemm_few_small():
    """The few-row GEMM: one m tile with a ragged edge (5 rows), W rows past N clamped, K in 2
    splits of one group each, accumulate; Q4_K's chunk order (k4_k)."""
    from tests.gpu.test_gemm_few import check_few

    check_few(T.Q4_K, 5, 8, 256, 2, 1.0, seed=4, accumulate=True)


def test_gemm_few_slabs_and_orders():
    """Four m tiles and a second 64-row slab (70 rows); Q6_K's and Q8_0's chunk orders; stacked outputs."""
    from tests.gpu.test_gemm_few import check_few, check_few_split

    check_few(T.Q6_K, 70, 8, 256, 1, 10.0, seed=5)
    check_few(T.Q8_0, 20, 16, 256, 1, 0.1, seed=6)
    check_few_split(T.Q8_0, 3, (8, 4, 4), 128, 1, seed=7)


def test_gemm_mmq_small():
    """The int8 few-row GEMM: one token tile with a ragged edge (5 tokens), W rows past N clamped,
    K in 2 splits of one group each, accumulate; x̂ bit for bit; each type's lane addressing."""
    from tests.gpu.test_gemm_mmq import check_mmq

    check_mmq(T.Q4_K, 5, 8, 256, 2, 1.0, seed=4, accumulate=True)
    check_mmq(T.Q6_K, 3, 16, 256, 1, 10.0, seed=5)
    check_mmq(T.Q8_0, 6, 8, 256, 2, 0.1, seed=6)


def test_gemm_mmq_slabs_and_split():
    """Two token tiles (12 tokens) and stacked outputs."""
    from tests.gpu.test_gemm_mmq import check_mmq, check_mmq_split

    check_mmq(T.Q4_K, 12, 8, 256, 1, 1.0, seed=7)
    check_mmq_split(T.Q8_0, 3, (8, 4, 4), 128, 1, seed=8)
    check_mmq(T.Q6_K, 5, 40, 256, 2, 1.0, seed=9, mt=2)  # two W tiles a warp (mt_for's one at these sizes)


def test_gemm_mmq_w_ring():
    """W through the cp.async ring with x̂: the ring wrapping (8 groups in one split), rows past N,
    two W tiles a warp and two token tiles, odd splits."""
    from tests.gpu.test_gemm_mmq import check_mmq

    check_mmq(T.Q4_K, 5, 40, 1024, 1, 1.0, seed=13, accumulate=True, ring=True)
    check_mmq(T.Q4_K, 12, 72, 768, 2, 10.0, seed=14, mt=2, ring=True)


def test_gemm_mmq_pair():
    """A Q4_K Q|K and a Q6_K V in one launch: block rows of each weight, V's columns after Q|K's."""
    from tests.gpu.test_gemm_mmq import check_mmq_pair

    check_mmq_pair(5, 72, 24, 40, 256, 2, 1.0, seed=10)


def test_gemm_mmq_normed():
    """x's pre-norm fused into its int8 quantization (the block's row sum), then the product."""
    from tests.gpu.test_gemm_mmq import check_mmq_normed

    check_mmq_normed(T.Q8_0, 3, 8, 256, seed=9)


def test_gemm_mmq_grouped():
    """The routed experts' grouped int8 GEMM: a GLU over gate|up (x̂ of the tokens), plain (x̂ of
    the grouped rows), experts over two tiles, ragged output slabs."""
    from tests.gpu.test_gemm_mmq_grouped import check_grouped

    check_grouped(T.Q4_K, 5, 2 * 40, 256, 9, 2, 1, seed=3, x_div=True, std=0.01)
    check_grouped(T.Q6_K, 4, 70, 256, 6, 2, 0, seed=4, x_div=False, std=10.0)
    check_grouped(T.Q8_0, 4, 36, 128, 5, 2, 0, seed=5, x_div=True, std=0.1)
