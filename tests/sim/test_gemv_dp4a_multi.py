"""The multi-token dp4a GEMV in numba's CUDA simulator on tiny shapes, through
tests/gpu/test_gemv_dp4a_multi.py's checks (dp4a through its plain-Python twin)."""

from gguf import GGMLQuantizationType as T

from impnb.kernels.gemv.gemv_dp4a import SILU
from impnb.kernels.gemv.gemv_variants import Variant
from tests.gpu import test_gemv_dp4a as g
from tests.gpu import test_gemv_dp4a_multi as m


def test_plain_and_accumulate():
    m.check_case(T.Q4_K, 5, 256, 3, 10.0, seed=1, variant=Variant(32, 1, 4))
    m.check_case(T.Q8_0, 3, 64, 2, 0.1, seed=2, variant=Variant(32, 2, 2), accumulate=True)
    m.check_case(T.NVFP4, 5, 128, 3, 1.0, seed=5, variant=Variant(32, 1, 4))  # x̂ permuted for its words
    # rows narrower than a warp's chunks (SmolLM2's 576 columns: 18 of 32 lanes work), T = 8
    m.check_case(T.Q4_1, 7, 96, 8, 3.0, seed=6, variant=Variant(32, 1, 2))
    m.check_case(T.Q8_0, 5, 160, 6, 0.5, seed=7, variant=Variant(32, 2, 4))


def test_split_and_glu():
    m.check_split(T.Q6_K, (5, 3, 2), 256, 2, 1.0, seed=3, variant=Variant(32, 2, 4))
    g.check_glu(T.Q4_K, 3, 256, 2, SILU, seed=4, variant=Variant(64, 1, 2), run=m.multi)


def test_grouped():
    m.check_grouped(T.Q4_K, 5, 2 * 3, 256, 7, 2, 3, SILU, Variant(32, 1, 2), seed=8)
    m.check_grouped(T.Q6_K, 4, 5, 256, 6, 3, 2, 0, Variant(32, 1, 4), seed=9, x_div=False, std=10.0)


def test_grouped_in_slot_order():
    """A token a tile over tiles in slot order, the tiles along the grid's x (tile_x)."""
    m.check_grouped(T.Q4_K, 5, 2 * 16, 256, 7, 2, 1, SILU, Variant(32, 1, 8), seed=15, std=0.1, quant=True,
                    slot_order=True)
    m.check_grouped(T.Q6_K, 4, 40, 768, 6, 3, 1, 0, Variant(8, 2, 8), seed=16, x_div=False, std=10.0, early=True,
                    slot_order=True)


def test_grouped_int8_output():
    """A token a tile with its output's int8 form: gate|up's 16 outputs a block, the down's 32."""
    m.check_grouped(T.Q4_K, 5, 2 * 16, 256, 7, 2, 1, SILU, Variant(32, 1, 8), seed=10, std=0.1, quant=True)
    m.check_grouped(T.Q6_K, 4, 32, 256, 6, 3, 1, 0, Variant(32, 1, 8), seed=11, x_div=False, std=10.0, quant=True)


def test_grouped_spans_within_a_warp():
    """A token a tile over groups of 8 and 16 lanes: the down's 768 columns (24 chunks, three a lane
    at span 8, the next chunk's loads in flight), rows past the last group's clamped; gate|up at
    span 16 writing its int8 form (64 outputs a block)."""
    m.check_grouped(T.Q6_K, 4, 40, 768, 6, 3, 1, 0, Variant(8, 2, 8), seed=12, x_div=False, std=10.0)
    m.check_grouped(T.Q4_K, 3, 2 * 20, 768, 5, 2, 1, 0, Variant(8, 1, 4), seed=13, x_div=False)
    m.check_grouped(T.Q4_K, 5, 2 * 64, 512, 7, 2, 1, SILU, Variant(16, 1, 8), seed=14, std=0.1, quant=True)


def test_grouped_down_early():
    """The down's build that reads its tiles and first chunk before its wait, over 8 lanes a group."""
    m.check_grouped(T.Q6_K, 4, 40, 256, 6, 3, 1, 0, Variant(8, 2, 8), seed=15, x_div=False, std=10.0, early=True)


def test_l2_prefetches():
    """The plain builds with their rows prefetched into L2 before the wait: outputs as without, and
    the prefetches (recorded by the simulator's twin, which checks their operands as the hardware
    takes them) covering exactly W's rows, the last block's clamped ones too."""
    m.check_case(T.Q4_K, 21, 256, 2, 1.0, seed=21, variant=Variant(32, 1, 4), l2=True)
    m.check_case(T.Q4_K, 2 * 9, 256, 2, 1.0, seed=22, variant=Variant(32, 1, 2), l2=True, glu=SILU)
    m.check_case(T.Q6_K, 13, 256, 2, 1.0, seed=27, variant=Variant(32, 2, 4), l2=True)
    m.check_case(T.Q5_0, 7, 64, 3, 1.0, seed=28, variant=Variant(64, 1, 2), l2=True)
    m.check_case(T.Q8_0, 5, 64, 2, 1.0, seed=29, variant=Variant(32, 1, 2), l2=False)  # none sent


def test_x_flat_equals_indexed(monkeypatch):
    """x̂'s scales and sums read at flat offsets (tuning.X_FLAT): the same outputs bit for bit, on
    a plain build at 8 rows, a GLU, a grouped gate|up with its int8 output and a down reading its
    tiles early over 8 lanes."""
    m.check_x_flat(monkeypatch, lambda: m.plain_y(T.Q4_K, 5, 512, 8, 1.0, 41, Variant(32, 1, 2)))
    m.check_x_flat(monkeypatch, lambda: m.plain_y(T.Q4_K, 2 * 3, 256, 3, 0.5, 42, Variant(32, 2, 2), glu=SILU))
    m.check_x_flat(monkeypatch, lambda: m.check_grouped(T.Q4_K, 5, 2 * 16, 256, 7, 2, 1, SILU, Variant(32, 1, 8),
                                                        seed=43, std=0.1, quant=True))
    m.check_x_flat(monkeypatch, lambda: m.check_grouped(T.Q6_K, 4, 40, 768, 6, 3, 1, 0, Variant(8, 2, 8), seed=44,
                                                        x_div=False, std=10.0, early=True))
