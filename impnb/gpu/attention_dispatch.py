"""Which prefill attention kernel runs a head dim: the wgmma kernel (kernels/attention/attention_wgmma.py)
on Hopper where it measured faster than FA2 on mma.sync (kernels/attention/attention_fa2.py), else FA2.

H100, 2026-11-26 15:19 UTC (scripts/bench_attention.py --tilings m32,wg: Z=4 H=32 fp16, TFLOP/s
at N 1024 / 2048 / 4096 / 8192 / 16384, not causal | causal), the same call:
  D 64:  FA2 235 / 281 / 307 / 320 / 321 | 126 / 240 / 285 / 315 / 325
         wgmma 255 / 315 / 349 / 364 / 350 | 143 / 266 / 331 / 362 / 379
  D 128: FA2 262 / 296 / 324 / 331 / 322 | 142 / 267 / 310 / 331 / 331
         wgmma 289 / 355 / 398 / 414 / 399 | 207 / 295 / 367 / 411 / 415
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
