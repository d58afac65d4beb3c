"""The Gated DeltaNet kernels in the CUDA simulator: the GPU test's checks at small sizes
(dk, dv 32 or 64, odd head counts, tiled and grouped V heads)."""

import numpy as np
import pytest

from tests.gpu.test_deltanet_kernels import (Layer, check_conv1d, check_conv1d_chunks, check_conv1d_pairs,
                                             check_decode, check_decode_conv_fused, check_decode_pairs, check_prefill,
                                             check_prefill_is_decode, check_prefill_pairs, check_prefill_split)

STDS = (0.1, 1.0, 10.0)
TILED = dict(Hk=1, Hv=3, dk=32, dv=32)                    # odd V heads over one QK head
GROUPED = dict(Hk=2, Hv=4, dk=32, dv=64, v_tiled=False)   # dk != dv, grouped V heads


@pytest.mark.parametrize("B,T,C", [(1, 1, 40), (3, 1, 40), (1, 9, 33), (2, 5, 40)])
def test_conv1d(B, T, C):
    for i, std in enumerate(STDS):
        check_conv1d(np.random.default_rng([B, T, C, i]), B, T, C, std, n_slots=B + 2, padded=i == 1)


def test_conv1d_in_place_and_lengths():
    rng = np.random.default_rng(11)
    check_conv1d(rng, 1, 1, 40, 1.0, in_place=True)
    check_conv1d(rng, 3, 6, 40, 1.0, lengths=np.array([6, 2, 0], np.int32), in_place=True)
    check_conv1d(rng, 2, 70, 33, 1.0, lengths=np.array([67, 3], np.int32), in_place=True)  # past a tile


def test_conv1d_chunks():
    check_conv1d_chunks(np.random.default_rng(3), 9, 40, (1, 2, 7))
    check_conv1d_chunks(np.random.default_rng(4), 140, 33, (66, 130))


# runs: indices into STDS, every magnitude at each shape over its cases; padded: a slot -1 at B > 1
@pytest.mark.parametrize("shape,B,runs", [(TILED, 1, (0, 1)), (TILED, 2, (2,)), (GROUPED, 1, (1, 2))],
                         ids=["tiled", "tiled-B2", "grouped"])
def test_gdn_decode(shape, B, runs):
    for i in runs:
        rng = np.random.default_rng([B, shape["dv"], i])
        check_decode(rng, Layer.random(rng, **shape), B, steps=3, std=STDS[i], padded=i == 2)


@pytest.mark.parametrize("shape,B,T,runs", [(TILED, 1, 5, (0, 1, 2)), (GROUPED, 2, 3, (1, 2))],
                         ids=["tiled-T5", "grouped-B2-T3"])
def test_gdn_prefill(shape, B, T, runs):
    for i in runs:
        rng = np.random.default_rng([B, T, i])
        check_prefill(rng, Layer.random(rng, **shape), B, T, STDS[i])


def test_gdn_prefill_lengths_and_padding():
    rng = np.random.default_rng(5)
    layer = Layer.random(rng, **TILED)
    check_prefill(rng, layer, 3, 4, 1.0, lengths=np.array([4, 1, 0], np.int32))
    check_prefill(rng, layer, 3, 2, 1.0, padded=True)


def test_gdn_prefill_is_repeated_decode():
    rng = np.random.default_rng(6)
    check_prefill_is_decode(rng, Layer.random(rng, **GROUPED), 4, 1.0)


def test_gdn_prefill_split_anywhere():
    rng = np.random.default_rng(8)
    layer = Layer.random(rng, **TILED)
    for splits in ((1,), (3, 4)):
        check_prefill_split(rng, layer, 6, splits, 1.0)


def test_slot_pairs_by_position():
    rng = np.random.default_rng(9)
    layer = Layer.random(rng, **GROUPED)
    check_conv1d_pairs(rng, 1, 1, 40, 1.0)
    check_conv1d_pairs(rng, 2, 5, 33, 10.0, lengths=np.array([5, 2], np.int32))
    check_decode_pairs(rng, layer, 2, 2, 1.0)
    check_prefill_pairs(rng, layer, 1, 3, 1.0)
    check_prefill_pairs(rng, layer, 2, 3, 0.1, lengths=np.array([1, 3], np.int32))


@pytest.mark.parametrize("shape,B", [(TILED, 2), (GROUPED, 3)], ids=["tiled-B2", "grouped-B3"])
def test_gdn_decode_conv_fused(shape, B):
    rng = np.random.default_rng([B, shape["dv"], 7])
    check_decode_conv_fused(rng, Layer.random(rng, **shape), B, 2, 1.0, padded=True)
