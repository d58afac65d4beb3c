"""Which prefill attention kernel runs a head dim: the wgmma kernel (kernels/attention_wgmma.py)
on Hopper where it measured faster than FA2 on mma.sync (kernels/attention_fa2.py), else FA2.

H100, 2026-11-26 12:40 UTC, one call (scripts/bench_attention.py --tilings m32,wg: Z=4 H=32 fp16,
TFLOP/s at N 1024 / 4096 / 16384, not causal | causal):
  D 64:  FA2 232 / 304 / 314 | 125 / 284 / 322    wgmma 200 / 280 / 304 | 147 / 254 / 303
  D 128: FA2 258 / 323 / 325 | 141 / 306 / 331    wgmma 284 / 390 / 400 | 206 / 360 / 396
The choice is logged once per head dim ("impnb.attention", debug).
"""

import logging
from functools import lru_cache

WGMMA_HEAD_DIMS = (128,)  # where the wgmma kernel won at every N above
log = logging.getLogger("impnb.attention")


@lru_cache(maxsize=None)
def use_wgmma(head_dim: int, cc: tuple) -> bool:
    """Whether prefill attention at this head dim runs on the wgmma kernel on a device of compute
    capability cc (wgmma is sm_90a's)."""
    choice = head_dim in WGMMA_HEAD_DIMS and tuple(cc) == (9, 0)
    log.debug("prefill attention D=%d cc=%s: %s", head_dim, tuple(cc), "wgmma" if choice else "fa2")
    return choice
