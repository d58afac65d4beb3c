"""The paged KV pool's bookkeeping: which blocks are free, which sequence holds which, and the
prefix cache (full blocks found again by the hash of every token up to their end).

A block is free when no sequence holds it (ref_count 0). A freed full block keeps its hash and its
K/V until it is handed out again, so a later request with the same prefix (a system prompt) reuses
it: the free list is least-recently-freed first, a sequence's tail freed before its head.
"""

import hashlib
from collections import OrderedDict

import numpy as np

from impnb.serve.sequence import Sequence


def block_hash(previous: bytes, token_ids) -> bytes:
    """The hash of a block's tokens chained to the hash of every block before it."""
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(np.asarray(token_ids, np.int64).tobytes())
    return h.digest()


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None  # set once the block is full and computed


class BlockManager:
    """n_blocks blocks of block_size tokens; prefix_caching shares full blocks between sequences."""

    def __init__(self, n_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(n_blocks)]
        self.free = OrderedDict.fromkeys(range(n_blocks))  # an ordered set, oldest first
        self.by_hash: dict[bytes, int] = {}
        self.prefix_caching = prefix_caching
        self.n_hits = 0  # prompt tokens served from the cache, over the manager's life

    @property
    def n_free(self) -> int:
        return len(self.free)

    def blocks_needed(self, seq: Sequence, n_tokens: int) -> int:
        """New blocks seq needs for K/V of its first n_tokens."""
        return max(0, -(-n_tokens // self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, n_tokens: int) -> bool:
        return self.blocks_needed(seq, n_tokens) <= self.n_free

    def grow(self, seq: Sequence, n_tokens: int) -> None:
        """Blocks for K/V of seq's first n_tokens (can_grow must hold)."""
        need = self.blocks_needed(seq, n_tokens)
        assert need <= self.n_free, (need, self.n_free)
        for _ in range(need):
            seq.block_table.append(self._take(self.free.popitem(last=False)[0]))

    def match_prefix(self, seq: Sequence) -> int:
        """Hand seq (which holds no block) the cached blocks of its longest cached prefix of full
        blocks; return the tokens they hold. The last token is always left to compute: its logits
        are what the step samples from, and it lands in a block of seq's own."""
        assert not seq.block_table
        n = 0
        if self.prefix_caching:
            hashes = self.hashes(seq, (len(seq) - 1) // self.block_size)
            for h in hashes:
                block_id = self.by_hash.get(h)
                if block_id is None:
                    break
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    del self.free[block_id]
                block.ref_count += 1
                seq.block_table.append(block_id)
                n += self.block_size
        seq.n_computed = seq.n_cached = n
        seq.n_registered = n // self.block_size
        self.n_hits += n
        return n

    def commit(self, seq: Sequence) -> None:
        """Register seq's newly full, computed blocks in the prefix cache."""
        if not self.prefix_caching:
            return
        n_full = seq.n_computed // self.block_size
        if n_full <= seq.n_registered:
            return
        hashes = self.hashes(seq, n_full)
        for i in range(seq.n_registered, n_full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash = hashes[i]
                self.by_hash.setdefault(hashes[i], block.block_id)
        seq.n_registered = n_full

    def hashes(self, seq: Sequence, n_blocks: int) -> list[bytes]:
        """The content hashes of seq's first n_blocks full blocks (computed once, kept on seq)."""
        bs = self.block_size
        while len(seq.block_hashes) < n_blocks:
            i = len(seq.block_hashes)
            previous = seq.block_hashes[-1] if i else b""
            seq.block_hashes.append(block_hash(previous, seq.token_ids[i * bs:(i + 1) * bs]))
        return seq.block_hashes[:n_blocks]

    def release(self, seq: Sequence) -> None:
        """Give back every block seq holds (tail first), e.g. when it finishes or is preempted."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, block_id
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.n_computed = seq.n_registered = 0

    def _take(self, block_id: int) -> int:
        """A free block for new K/V: it leaves the prefix cache, its old contents are dead."""
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None and self.by_hash.get(block.hash) == block_id:
            del self.by_hash[block.hash]
        block.hash = None
        block.ref_count = 1
        return block_id
