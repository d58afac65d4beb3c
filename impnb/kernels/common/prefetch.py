"""L2 prefetches of a packed weight's chunks (repack.LAYOUTS' parts; a chunk is 32 weights of a
row, the rows one after another): one cp.async.bulk.prefetch.L2 a part, issued by one thread,
nothing waiting for it. For kernels that may send their weights' reads before griddepcontrol.wait
(W is no kernel's output): then they stream while the kernel before still runs.
"""

from gguf import GGML_QUANT_SIZES
from numba import cuda, int64

from impnb.kernels.common import ptx
from impnb.kernels.common.repack import LAYOUTS

CHUNK = 32  # weights a chunk
PREFETCH_OP = "cp.async.bulk.prefetch.L2.global"  # the instruction (the build checks look for it)


@cuda.jit(device=True, inline=True)
def _part(p, g, n, num, den):
    # -- bytes [g num / den, (g + n) num / den) of part p, widened to 16-byte bounds within it --
    end = (p.size * p.itemsize) & -16
    b0 = (int64(g) * num // den) & -16
    b1 = min(((int64(g + n) * num + den - 1) // den + 15) & -16, end)
    if n > 0 and b1 > b0:
        ptx.prefetch_l2(p, b0, b1 - b0)


def part_rates(ggml_type) -> tuple:
    """(num, den) of each part of ggml_type: a chunk's bytes there are num / den."""
    block = GGML_QUANT_SIZES[ggml_type][0]
    return tuple(((end - start) * CHUNK, block) for _, start, end, _ in LAYOUTS[ggml_type])


def chunk_prefetcher(ggml_type):
    """Device function prefetch(parts, g, n): chunks g .. g + n - 1 of every part of a packed
    weight of ggml_type (its parts tuple) into L2."""
    body = "".join(f"    _part(parts[{i}], g, n, {num}, {den})\n" for i, (num, den) in enumerate(part_rates(ggml_type)))
    scope = {"_part": _part}
    exec(f"def prefetch(parts, g, n):\n{body}", scope)
    return cuda.jit(device=True, inline=True)(scope["prefetch"])
