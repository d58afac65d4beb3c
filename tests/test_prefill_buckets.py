"""Prompt-chunk buckets for prefill graphs (impnb/graphs/prefill.py), on the CPU."""

import numpy as np
import pytest

from impnb.graphs.prefill import BUCKETS, bucket, padded
from impnb.kernels.elementwise.rows import gather_row_ref


@pytest.mark.parametrize("n,want", [(1, 16), (15, 16), (16, 16), (17, 32), (511, 512), (512, 512),
                                    (100, 128), (257, 512)])
def test_smallest_bucket_that_holds_the_chunk(n, want):
    assert bucket(n, 0, 4096) == want


def test_no_bucket_past_n_ctx_or_past_the_largest():
    assert bucket(78, 512, 600) is None     # 512 + 128 > 600: eager
    assert bucket(78, 472, 600) == 128      # ends exactly at n_ctx
    assert bucket(BUCKETS[-1] + 1, 0, 1 << 20) is None


def test_padding_repeats_the_last_token_at_the_next_positions():
    ids, pos = padded(np.array([7, 8, 9], np.int32), 40, 16)
    assert ids.dtype == pos.dtype == np.int32 and len(ids) == len(pos) == 16
    assert list(ids[:3]) == [7, 8, 9] and (ids[3:] == 9).all()
    assert list(pos) == list(range(40, 56))


def test_gather_row_ref():
    src = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    assert np.array_equal(gather_row_ref(src, np.array([3], np.int32)), src[3:4])
