"""Which prefill attention kernel runs a head dim: the wgmma kernel (kernels/attention/attention_wgmma.py)
on Hopper at the head dims where it measured faster than FA2 on mma.sync
(kernels/attention/attention_fa2.py; impnb/tuning.WGMMA_HEAD_DIMS), else FA2.
The choice is logged once per head dim ("impnb.attention", debug).
"""

import logging
from functools import lru_cache

from impnb.tuning import WGMMA_HEAD_DIMS

log = logging.getLogger("impnb.attention")


@lru_cache(maxsize=None)
def use_wgmma(head_dim: int, cc: tuple) -> bool:
    """Whether prefill attention at this head dim runs on the wgmma kernel on a device of compute
    capability cc (wgmma is sm_90a's)."""
    choice = head_dim in WGMMA_HEAD_DIMS and tuple(cc) == (9, 0)
    log.debug("prefill attention D=%d cc=%s: %s", head_dim, tuple(cc), "wgmma" if choice else "fa2")
    return choice
