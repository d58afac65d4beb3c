"""What one more kernel a layer costs inside the decode graph: `python -m impnb` with PAD empty
programmatic kernels (PAD_BLOCKS blocks of 128 threads, each waiting on the grid before it) launched
after each layer's qkv_post, so tg128 against PAD=0 in the same call prices a kernel boundary
(the fusions it would take to remove one). Only models whose decode runs qkv_post as a kernel of
its own (Qwen3-30B-A3B's 8 query heads a KV head) get the padding.
    PAD=2 python scripts/bench_pad_kernels.py bench -m MODEL.gguf -p 512 -n 128 -r 2 --device cuda
"""

import os
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.kernels.common import ptx
from impnb.kernels.attention import qkv_post  # noqa: E402
from impnb.launch import launch  # noqa: E402

PAD = int(os.environ.get("PAD", "0"))
PAD_BLOCKS = int(os.environ.get("PAD_BLOCKS", "132"))


@cuda.jit
def _empty_kernel(a):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    if a.shape[0] == 0:  # never true: the kernel keeps its argument and its store after the wait
        a[0] = 1


def _padded(post, dummy):
    def qkv_post_then_pad(*args):
        post(*args)
        for _ in range(PAD):
            launch(_empty_kernel, PAD_BLOCKS, 128, args[-1], dummy)  # args[-1]: the stream
    return qkv_post_then_pad


if __name__ == "__main__":
    qkv_post.qkv_post = _padded(qkv_post.qkv_post, cuda.device_array(1, np.int32))
    from impnb.cli import main

    sys.exit(main(sys.argv[1:]))
