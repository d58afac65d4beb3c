"""A prompt's recurrent-state slots, shared by the prefill kernels (conv1d, gdn_prefill,
gdn_chunked): each sequence's state lives in a slot, or in a slot pair picked by position parity
(gpu/recurrent.py), so that a step queued ahead and dropped leaves the state it read intact."""

import numpy as np
from numba import cuda


def prompt_rows(slots, B: int, T: int, lengths=None, pos=None):
    """The launchers' optional per-row arguments, checked -> (lengths, use_lengths, pos, use_pos);
    an absent one is replaced by slots, which its kernel then never reads."""
    if lengths is not None:
        assert lengths.dtype == np.int32 and lengths.shape == (B,)
    if pos is not None:
        assert pos.dtype == np.int32 and pos.shape == (B * T,) and pos.is_c_contiguous(), "pos: int32 (R,)"
    return (slots if lengths is None else lengths, np.int32(lengths is not None),
            slots if pos is None else pos, np.int32(pos is not None))


@cuda.jit(device=True, inline=True)
def sequence_slots(slots, lengths, use_lengths, pos, use_pos, s, T):
    """Sequence s of T rows -> (slot, its real rows n, the slot its state is read from, the slot
    it is written to): slot < 0 is padding (n = 0); with positions, the pair's slot of the first
    row's parity is read and that of the position after the last real row written."""
    slot = slots[s]
    n = min(lengths[s], T) if use_lengths else T
    if slot < 0:
        n = 0
    src = slot
    dst = slot
    if use_pos and slot >= 0:
        src = slot + pos[s * T] % 2
        dst = slot + (pos[s * T] + n) % 2
    return slot, n, src, dst
