"""gemv_tail.make_tail in the simulator, one block standing for the grid's last: rows of under one
float4 a thread and of several, with and without the post-norm."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.gemv.gemv_tail import ADD, POST_ADD, make_tail
from tests.gpu.test_gemv import check_residual_update

TAILS = {mode: make_tail(mode) for mode in (ADD, POST_ADD)}


def _kernel(mode):
    tail = TAILS[mode]

    @cuda.jit
    def kernel(y, x, w_post, w_next, h, eps, counter):
        tail(y, x, w_post, w_next, h, eps, counter)

    return kernel


@pytest.mark.parametrize("mode", [ADD, POST_ADD], ids=["add", "post_add"])
@pytest.mark.parametrize("D,n_tok,threads", [(20, 2, 32), (644, 1, 32), (524, 3, 32), (1028, 1, 64)])
def test_tail(mode, D, n_tok, threads):
    rng = np.random.default_rng([D, n_tok, mode])
    eps = 1e-6
    post = mode == POST_ADD
    y = (rng.standard_normal((n_tok, D)) * 2).astype(np.float32)
    xr = (rng.standard_normal((n_tok, D)) * 3).astype(np.float32)
    w_post, w_next = ((1 + 0.3 * rng.standard_normal(D)).astype(np.float32) for _ in range(2))
    d_x = cuda.to_device(xr)
    d_h = cuda.to_device(np.full((n_tok, D), np.nan, np.float32))
    counter = cuda.to_device(np.zeros(1, np.uint32))
    _kernel(mode)[1, threads](cuda.to_device(y), d_x, cuda.to_device(w_post), cuda.to_device(w_next), d_h,
                              np.float32(eps), counter)
    x_new, h = d_x.copy_to_host(), d_h.copy_to_host()
    assert np.isfinite(x_new).all() and np.isfinite(h).all()
    check_residual_update(xr.astype(np.float64), y.astype(np.float64), x_new.astype(np.float64),
                          h.astype(np.float64), w_post if post else None, w_next, eps)
    assert counter.copy_to_host()[0] == 0
