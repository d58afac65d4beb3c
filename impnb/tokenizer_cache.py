"""Merges derived from a SentencePiece vocabulary, cached on disk by the vocabulary's hash.

Deriving Gemma3's half-million merges from its 262k tokens takes seconds of Python; the cache
keeps them as token ids beside the kernel cache ($IMPNB_CACHE_DIR's parent, default
~/.cache/impnb/tokenizers): MAGIC, the SHA-256 of the payload, int32 triples (left, right, the
token they make), in rank order. A file that is short, corrupt or names an id outside the
vocabulary is ignored and rebuilt; a cache dir that cannot be written only costs the derivation.
"""

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np

from impnb import checked_file

log = logging.getLogger("impnb.tokenizer")

MAGIC = b"impnb-merges-2\n"


def cache_dir() -> Path:
    kernels = os.environ.get("IMPNB_CACHE_DIR") or Path.home() / ".cache" / "impnb" / "kernels"
    return Path(kernels).parent / "tokenizers"


def vocab_key(tokens: list[str], rank: bytes) -> str:
    """Hex digest of the token texts (length-prefixed, so no separator is ambiguous) and `rank`,
    the bytes that order the merges."""
    h = hashlib.sha256(MAGIC)
    h.update(np.fromiter(map(len, tokens), np.int64, len(tokens)).tobytes())
    h.update("".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(rank)
    return h.hexdigest()


def _read(path: Path, n_vocab: int) -> np.ndarray | None:
    payload = checked_file.read(path, MAGIC, log, "tokenizer cache")
    if payload is None:
        return None
    if len(payload) % 12:
        log.warning("tokenizer cache: %s is corrupt; rebuilding", path)
        return None
    triples = np.frombuffer(payload, "<i4").reshape(-1, 3)
    if triples.size and (triples.min() < 0 or triples.max() >= n_vocab):
        log.warning("tokenizer cache: %s names tokens outside the vocabulary; rebuilding", path)
        return None
    return triples


def _write(path: Path, triples: np.ndarray) -> None:
    checked_file.write(path, MAGIC, np.ascontiguousarray(triples, "<i4").tobytes(), log, "tokenizer cache")


def cached_merges(tokens: list[str], vocab: dict[str, int], rank: bytes,
                  derive: Callable[[], list[tuple[str, str]]]) -> np.ndarray:
    """derive()'s merges for this vocabulary as (n, 3) int32 ids (left, right, left + right), in
    rank order, from the cache when an intact entry exists."""
    path = cache_dir() / f"merges-{vocab_key(tokens, rank)[:32]}.bin"
    triples = _read(path, len(tokens))
    if triples is None:
        triples = np.array([(vocab[a], vocab[b], vocab[a + b]) for a, b in derive()], np.int32).reshape(-1, 3)
        _write(path, triples)
    return triples
