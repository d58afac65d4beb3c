"""A NaN or inf in a logits row flags that row's sampled id, so the host learns of it with the token.

Launched after the sampler (and, in the decode graph, after step_state.advance has copied the
clean id into the next step's input): each row with a non-finite logit gets NONFINITE_BIT set
in out_ids[b]. The host reads the 4 bytes it reads anyway and stops on the bit; no extra copy,
no sync. Ids stay below 2^30 (the launcher checks V), so the bit never collides with an id.
Numpy twin: `flag_nonfinite_ref`.
"""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.sample.sample_select import SIMULATOR
from impnb.launch import launch

NONFINITE_BIT = 1 << 30
EXPONENT = 0x7F800000  # float32 exponent bits: all set for inf and NaN
NT = 32 if SIMULATOR else 256       # threads per block
CHUNK = 64 if SIMULATOR else 8192   # logits per block


def flag_nonfinite_ref(logits: np.ndarray, out_ids: np.ndarray) -> None:
    """out_ids[b] |= NONFINITE_BIT where row b of logits (B, V) holds a NaN or inf."""
    out_ids |= np.where(np.isfinite(logits).all(axis=1), 0, NONFINITE_BIT).astype(out_ids.dtype)


@cuda.jit
def _flag_nonfinite_kernel(bits, out_ids):
    """grid (ceil(V / CHUNK), B), block NT; bits: the logits' int32 bits. A thread strides its
    block's CHUNK logits; a thread that sees an all-ones exponent ORs the bit into out_ids[b]
    (several may; the OR is idempotent)."""
    ptx.grid_dep_wait()  # programmatic launch: the sampler (and advance) have finished
    ptx.grid_dep_launch()
    c = cuda.blockIdx.x
    b = cuda.blockIdx.y
    V = bits.shape[1]
    bad = False
    for i in range(c * CHUNK + cuda.threadIdx.x, min(V, (c + 1) * CHUNK), NT):
        if bits[b, i] & EXPONENT == EXPONENT:
            bad = True
    if bad:
        cuda.atomic.or_(out_ids, b, NONFINITE_BIT)


def flag_nonfinite(logits, out_ids, stream) -> None:
    """out_ids (B,) int32 |= NONFINITE_BIT for each row of logits (B, V) float32 not all finite."""
    assert logits.ndim == 2 and logits.dtype == np.float32 and logits.is_c_contiguous()
    B, V = logits.shape
    assert out_ids.dtype == np.int32 and out_ids.shape == (B,) and V < NONFINITE_BIT
    launch(_flag_nonfinite_kernel, (-(-V // CHUNK), B), NT, stream, logits.view(np.int32), out_ids)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_flag_nonfinite_kernel, types.void(types.int32[:, ::1], types.int32[::1]),
                         {"max_registers": 32})]
