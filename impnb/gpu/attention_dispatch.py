"""Which prefill attention kernel runs a head dim: the wgmma kernel (kernels/attention_wgmma.py)
on Hopper where it measured faster than FA2 on mma.sync (kernels/attention_fa2.py), else FA2.

H100, 2026-11-26 (scripts/bench_attention.py: Z=4 H=32 fp16, TFLOP/s at N 1024 / 2048 / 4096 /
8192 / 16384, not causal | causal), FA2 and wgmma from one call each:
  D 64:  FA2 235 / 282 / 307 / 315 / 312 | 125 / 239 / 285 / 313 / 322
         wgmma 256 / 314 / 346 / 362 / 351 | 142 / 265 / 330 / 363 / 375   (15:00 UTC)
  D 128: FA2 260 / 292 / 327 / 334 / 323 | 141 / 266 / 308 / 331 / 336   (12:48 UTC)
         wgmma 286 / 351 / 389 / 413 / 384 | 206 / 291 / 362 / 400 / 422
The choice is logged once per head dim ("impnb.attention", debug).
"""

import logging
from functools import lru_cache

WGMMA_HEAD_DIMS = (64, 128)  # where the wgmma kernel won at every N above
log = logging.getLogger("impnb.attention")


@lru_cache(maxsize=None)
def use_wgmma(head_dim: int, cc: tuple) -> bool:
    """Whether prefill attention at this head dim runs on the wgmma kernel on a device of compute
    capability cc (wgmma is sm_90a's)."""
    choice = head_dim in WGMMA_HEAD_DIMS and tuple(cc) == (9, 0)
    log.debug("prefill attention D=%d cc=%s: %s", head_dim, tuple(cc), "wgmma" if choice else "fa2")
    return choice
