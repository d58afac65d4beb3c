"""kernels/moe/expert_shard.localize on the simulator against localize_ref: routed slots of
random experts at several logit scales, a rank's range at the start, middle and end (in place:
every slot is rewritten or checked unchanged)."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.moe.expert_shard import localize, localize_ref
from impnb.kernels.moe.reference import route_ref


@pytest.mark.parametrize("T,k,E,e0,n", [(1, 8, 128, 0, 64), (19, 2, 8, 4, 4), (111, 8, 128, 32, 32),
                                        (3, 1, 16, 15, 1)])
def test_localize_matches_reference(T, k, E, e0, n):
    rng = np.random.default_rng([T, k, E, e0])
    for std in (1e-3, 1.0, 30.0):
        experts, weights = route_ref((rng.standard_normal((T, E)) * std).astype(np.float32), k, True)
        want = localize_ref(experts, weights, e0, n)
        d_ex, d_w = cuda.to_device(experts), cuda.to_device(weights)
        localize(d_ex, d_w, e0, n, 0)
        got_ex, got_w = d_ex.copy_to_host(), d_w.copy_to_host()
        assert np.array_equal(got_ex, want[0]) and np.array_equal(got_w, want[1])
        mine = (experts >= e0) & (experts < e0 + n)
        assert np.array_equal(got_w[mine], weights[mine]) and not got_w[~mine].any()
