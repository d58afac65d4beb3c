"""A SentencePiece vocabulary's merges, whole or only those one text can use.

Handing `tokenizers` Gemma3's 515k derived merges costs most of a start's tokenizer build. BPE
merges adjacent symbols, lowest rank first, among the pairs that have a merge; every symbol it
makes spells a piece of the word it encodes. So a BPE given only the merges whose result spells a
piece of the text (or follows the "▁" a pre-tokenizer may put in front of it), plus every merge
with a byte-fallback or unknown token on a side (symbols that spell no piece of the text), meets
the same pairs with the same relative ranks at every step and encodes that text to the same ids.
Its vocabulary needs only the tokens such an encoding can see (with their ids): the text's pieces,
those merges' tokens, the byte-fallback and unknown tokens and the file's added tokens.
"""

import numpy as np

SPIECE_SPACE = "\u2581"
MAX_PIECES = 1 << 18  # substrings looked up for one text at most; past this the whole table


class MergeTable:
    """(n, 3) int32 merges in rank order: left id, right id, the id of left + right."""

    def __init__(self, tokens: list[str], vocab: dict[str, int], triples: np.ndarray,
                 unk_token: str | None):
        self.tokens, self.vocab, self.triples = tokens, vocab, triples
        # symbols that are no piece of the text: byte-fallback tokens and the unknown token
        odd = [vocab[t] for t in (*(f"<0x{b:02X}>" for b in range(256)), unk_token) if t in vocab]
        self.odd = np.isin(triples[:, 0], odd) | np.isin(triples[:, 1], odd)
        self.longest = max(map(len, tokens), default=0)

    def pairs(self, rows=None) -> list[tuple[str, str]]:
        """The merges as token texts: every one, or those of the given rows (rank order kept)."""
        left, right = self.triples[:, 0], self.triples[:, 1]
        if rows is not None:
            left, right = left[rows], right[rows]
        text = self.tokens.__getitem__
        return list(zip(map(text, left.tolist()), map(text, right.tolist())))

    def for_text(self, text: str) -> tuple[list[tuple[str, str]], set[int]] | None:
        """(the merges encoding `text` can meet, the ids of every token that encoding can see: its
        pieces, with or without a leading "\u2581", and the kept merges' tokens), or None where the
        text is too long for the search to pay (then the whole table is needed)."""
        spelled = text.replace(" ", SPIECE_SPACE)
        n, longest = len(spelled), self.longest
        if n * min(longest, n) > MAX_PIECES:
            return None
        vocab, found = self.vocab, set()
        for i in range(n):
            for j in range(i + 1, min(i + longest, n) + 1):
                piece = spelled[i:j]
                for candidate in (piece, SPIECE_SPACE + piece):
                    if candidate in vocab:
                        found.add(vocab[candidate])
        if SPIECE_SPACE in vocab:
            found.add(vocab[SPIECE_SPACE])
        rows = np.flatnonzero(self.odd | np.isin(self.triples[:, 2], np.fromiter(found, np.int64, len(found))))
        found.update(self.triples[rows].reshape(-1).tolist())
        return self.pairs(rows), found
