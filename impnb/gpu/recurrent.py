"""The Gated DeltaNet layers' recurrent state on the GPU, beside the paged KV cache: per recurrent
layer a conv state and a delta-rule state for each of n_seqs sequences, in device buffers of fixed
address (a decode graph captures them), zeroed for a new sequence.

A sequence's state is a pair of slots: a step at positions p .. p + n - 1 reads the slot of p's
parity and writes that of p + n's (the kernels take the rows' positions), so a decode step the
engine queued ahead and then drops leaves the state it started from, as it leaves the KV rows
it wrote to be overwritten: look-ahead decode works for hybrids too.

Legend: C conv channels (Q, K, V), K conv width, Hv V heads, dk / dv head dims.
"""

import numpy as np

from impnb.models.config import ModelConfig


class RecurrentState:
    """conv[il] (2 n_seqs, C, K - 1) and ssm[il] (2 n_seqs, Hv, dk, dv) float32 for each recurrent
    layer il (None for the others); slots (n_seqs,) int32, the first slot of each sequence's pair,
    what a step's rows read (one sequence: slots 0 and 1 at row 0); lengths (1,) int32, the real rows
    of a padded prompt chunk (the engine writes it with the chunk), so padding leaves the state alone."""

    def __init__(self, ctx, cfg: ModelConfig, n_seqs: int = 1):
        d = cfg.deltanet
        self.n_slots = n_slots = 2 * n_seqs
        self.conv_shape = (n_slots, d.conv_channels, d.conv_kernel - 1)
        self.ssm_shape = (n_slots, d.n_v_heads, d.head_k_dim, d.head_v_dim)
        layers = [cfg.is_recurrent(il) for il in range(cfg.n_layer)]
        self.conv = [ctx.empty(self.conv_shape, np.float32) if r else None for r in layers]
        self.ssm = [ctx.empty(self.ssm_shape, np.float32) if r else None for r in layers]
        self._zero_conv = ctx.upload(np.zeros(self.conv_shape[1:], np.float32))
        self._zero_ssm = ctx.upload(np.zeros(self.ssm_shape[1:], np.float32))
        self.slots = ctx.upload(np.arange(0, n_slots, 2, dtype=np.int32))
        self.lengths = ctx.empty(1, np.int32)
        self.zero(ctx.nb_stream)

    def zero(self, stream, seq: int | None = None) -> None:
        """Zero the state of one sequence (None: every one): a new sequence's start."""
        slots = range(self.n_slots) if seq is None else (2 * seq, 2 * seq + 1)
        for conv, ssm in zip(self.conv, self.ssm):
            if conv is None:
                continue
            for s in slots:
                conv[s].copy_to_device(self._zero_conv, stream=stream)
                ssm[s].copy_to_device(self._zero_ssm, stream=stream)

    @staticmethod
    def nbytes(cfg: ModelConfig, n_seqs: int = 1) -> int:
        """The buffers' bytes (every recurrent layer's slot pairs, and the zero sources)."""
        if cfg.deltanet is None:
            return 0
        d = cfg.deltanet
        one = 4 * (d.conv_channels * (d.conv_kernel - 1) + d.n_v_heads * d.head_k_dim * d.head_v_dim)
        return one * (2 * n_seqs * sum(map(cfg.is_recurrent, range(cfg.n_layer))) + 1)
