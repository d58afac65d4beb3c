"""Text to token ids and back from a GGUF's tokenizer metadata, via `tokenizers`, matching HF transformers."""

import codecs
from operator import itemgetter

import numpy as np

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from impnb.errors import GGUFError, UnsupportedError
from impnb.tokenizer_cache import cached_merges
from impnb.tokenizer_merges import SPIECE_SPACE, MergeTable

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values

# Token texts llama.cpp's vocab treats as end of generation, whatever the file says.
EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> split regex, as HF maps them; any other name gets GPT-2's ByteLevel regex.
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}
GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = (b for b in range(256) if b not in printable)
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def derived_merges(vocab: dict[str, int], rank: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: every split of a token into two tokens, highest rank first.

    HF's `generate_merges`: ties in rank keep vocabulary order, a longer left piece goes first.
    """
    found = []
    for token, score in rank.items():
        for cut in range(1, len(token)):
            left = token[:cut]
            if left in vocab and (right := token[cut:]) in vocab:
                found.append((score, cut, len(right), left, right))
    found.sort(key=itemgetter(0, 1, 2), reverse=True)
    return [(m[3], m[4]) for m in found]


def _byte_level_backend(md: dict) -> tuple[Backend, dict[str, int]]:
    """GPT-2 style byte-level BPE; tokens spelled outside the byte alphabet are respelled into it."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode()): i
        for i, tok in enumerate(md["tokenizer.ggml.tokens"])
    }
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    backend = Backend(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                          fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(md.get("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    return backend, vocab


def _sentencepiece_backend(md: dict, gemma: bool, text: str | None) -> tuple[Backend, dict[str, int], bool]:
    """SentencePiece-style BPE with byte fallback; merges come from the file or are rebuilt; with
    `text`, rebuilt merges are only those it can meet (tokenizer_merges.py), and the flag returned
    says so (the backend then encodes that text only as the whole one would).

    Gemma spells multi-space tokens with real spaces and ranks merges by vocabulary order (HF's
    `gemma_tokenizer`); other llama vocabularies rank by score and prefix the first word with a space.
    """
    tokens = md["tokenizer.ggml.tokens"]
    if gemma:
        tokens = [SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = dict(zip(tokens, range(len(tokens))))
    partial = False
    if "tokenizer.ggml.merges" in md:
        merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    else:
        if gemma:
            triples = cached_merges(tokens, vocab, b"gemma: vocabulary order", lambda: derived_merges(
                vocab, {tok: -i for i, tok in enumerate(tokens)}))
        else:
            scores = md["tokenizer.ggml.scores"]
            triples = cached_merges(tokens, vocab, np.asarray(scores, np.float64).tobytes(),
                                    lambda: derived_merges(vocab, dict(zip(tokens, scores))))
        table = MergeTable(tokens, vocab, triples, "<unk>" if gemma else None)
        for_text = None if text is None else table.for_text(text)
        partial = for_text is not None
        merges = for_text[0] if partial else table.pairs()
    model_vocab = _partial_vocab(md, tokens, vocab, for_text[1]) if partial else vocab
    steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend = Backend(BPE(vocab=model_vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True))
        backend.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        backend = Backend(BPE(vocab=model_vocab, merges=merges, fuse_unk=True, byte_fallback=True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(SPIECE_SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend, vocab, partial, _pieces(tokens, vocab)


def _partial_vocab(md: dict, tokens: list[str], vocab: dict[str, int], needed: set[int]) -> dict[str, int]:
    """vocab restricted to the ids in `needed`, the byte-fallback and unknown tokens and every token
    _add_gguf_tokens adds (so the added tokens keep their ids), each at its id in vocab."""
    ids = set(needed)
    ids.update(vocab[t] for t in (*(f"<0x{b:02X}>" for b in range(256)), "<unk>") if t in vocab)
    types = md.get("tokenizer.ggml.token_type")
    if types:
        ids.update(np.flatnonzero(np.isin(np.asarray(types[:len(tokens)]), (CONTROL, USER_DEFINED))).tolist())
    for name in ("bos", "eos", "unknown", "padding"):
        i = md.get(f"tokenizer.ggml.{name}_token_id")
        if i is not None and 0 <= i < len(tokens):
            ids.add(i)
    return {tokens[i]: vocab[tokens[i]] for i in ids}


def _pieces(tokens: list[str], vocab: dict[str, int]) -> list[str | None]:
    """Each id's token text as the whole BPE model gives it (id_to_token): where a text appears
    twice in the file, only its last id has it."""
    if len(vocab) == len(tokens):
        return tokens
    pieces = [None] * len(tokens)
    for tok, i in vocab.items():
        pieces[i] = tok
    return pieces


def _add_gguf_tokens(backend: Backend, md: dict, vocab: dict[str, int], byte_level: bool) -> None:
    """Match control tokens and the named bos/eos/unk/pad whole as special, user-defined ones as text."""
    tokens = md["tokenizer.ggml.tokens"]
    kinds = np.asarray(md.get("tokenizer.ggml.token_type") or [0] * len(tokens))[:len(tokens)]
    alphabet = set(bytes_to_unicode().values()) if byte_level else None
    control = [tokens[i] for i in np.flatnonzero(kinds == CONTROL).tolist()
               if alphabet is None or set(tokens[i]) <= alphabet]
    backend.add_special_tokens([AddedToken(tok, normalized=False, special=True) for tok in control])
    user_defined = [AddedToken(tokens[i], normalized=False, special=False)
                    for i in np.flatnonzero(kinds == USER_DEFINED).tolist() if tokens[i] in vocab]
    backend.add_tokens(user_defined)
    named_ids = (md.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "unknown", "padding"))
    named = {tokens[i] for i in named_ids if i is not None and 0 <= i < len(tokens)}
    added = set(control).union(tok.content for tok in user_defined)  # the backend had none before
    backend.add_special_tokens([AddedToken(tok, normalized=False, special=True)
                                for tok in sorted(named - added)])


def _build_backend(md: dict, kind: str, text: str | None) -> tuple[Backend, bool, list | None]:
    """The backend with the file's added tokens, whether it holds only `text`'s merges and the
    tokens that encoding can see, and (SentencePiece) each id's token text."""
    partial, pieces = False, None
    try:
        if kind == "gpt2":
            backend, vocab = _byte_level_backend(md)
        else:
            gemma = md.get("general.architecture") in GEMMA_ARCHS
            backend, vocab, partial, pieces = _sentencepiece_backend(md, gemma, text)
        _add_gguf_tokens(backend, md, vocab, byte_level=kind == "gpt2")
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise GGUFError(f"{kind} tokenizer metadata is inconsistent: {e}") from None
    except Exception as e:  # the tokenizers library's own errors: "Token `x` out of vocabulary"
        if type(e).__module__.split(".")[0] not in ("tokenizers", "builtins"):
            raise
        raise GGUFError(f"{kind} tokenizer metadata is inconsistent: {e}") from None
    return backend, partial, pieces


class Tokenizer:
    """A GGUF's tokenizer: `encode`, `decode`, and `stream` for incremental detokenization."""

    def __init__(self, backend: Backend, kind: str, md: dict):
        self._backend = backend
        self._built_for = None  # the text whose merges and tokens alone the backend holds (for_text)
        self._build_whole = None
        self._pieces = None  # SentencePiece: each id's token text (token_bytes reads it, not the backend)
        self.kind = kind
        tokens = md["tokenizer.ggml.tokens"]
        self.vocab_size = len(tokens)
        self.bos_id = md.get("tokenizer.ggml.bos_token_id")
        self.eos_id = md.get("tokenizer.ggml.eos_token_id")
        self._add_bos = self.bos_id is not None and md.get("tokenizer.ggml.add_bos_token", kind == "llama")
        self._add_eos = self.eos_id is not None and md.get("tokenizer.ggml.add_eos_token", False)
        ends = {md.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
        named_eog = np.fromiter(map(EOG_NAMES.__contains__, tokens), bool, len(tokens))
        self.eog_ids = frozenset({i for i in ends if i is not None} | set(np.flatnonzero(named_eog).tolist()))
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._strips_space = kind == "llama" and md.get("general.architecture") not in GEMMA_ARCHS
        self._byte_of = {c: b for b, c in bytes_to_unicode().items()} if kind == "gpt2" else None

    @classmethod
    def from_metadata(cls, metadata: dict, for_text: str | None = None) -> "Tokenizer":
        """Build from GGUF metadata; UnsupportedError for a tokenizer model other than gpt2 or llama.

        With `for_text` (the one text a caller will encode first), a SentencePiece vocabulary whose
        merges are rebuilt gets only the merges that text can meet: its ids are the whole
        tokenizer's, at a fraction of the build; encoding any other text builds the whole one first.
        """
        kind = metadata.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise UnsupportedError(f"tokenizer model {kind!r} is not supported (impnb reads 'gpt2' "
                                   f"byte-level BPE and 'llama' SentencePiece BPE)")
        needs = ["tokens", "merges" if kind == "gpt2" or "tokenizer.ggml.merges" in metadata else "scores"]
        for key in (f"tokenizer.ggml.{name}" for name in needs):
            if not isinstance(metadata.get(key), list):
                raise GGUFError(f"{kind} tokenizer metadata lacks the array {key}")
        for m in metadata.get("tokenizer.ggml.merges", ()):
            if not isinstance(m, str) or m.count(" ") != 1:
                raise GGUFError(f"tokenizer.ggml.merges entry {m!r:.40} is not two tokens and a space")
        backend, partial, pieces = _build_backend(metadata, kind, for_text)
        tokenizer = cls(backend, kind, metadata)
        tokenizer._pieces = pieces
        if partial:
            tokenizer._built_for = for_text
            tokenizer._build_whole = lambda: _build_backend(metadata, kind, None)[0]
        return tokenizer

    @property
    def partial(self) -> bool:
        """Whether the backend holds only the merges of from_metadata's for_text (until another
        text is encoded)."""
        return self._built_for is not None

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it stay whole; `add_special` adds BOS as HF does."""
        if self._built_for is not None and text != self._built_for:  # built for another text only
            self._make_whole()
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special:
            ids = [self.bos_id] * self._add_bos + ids + [self.eos_id] * self._add_eos
        return ids

    def _make_whole(self) -> None:
        self._backend, self._built_for = self._build_whole(), None

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD."""
        if self._built_for is not None:  # its vocabulary holds the one text's tokens only
            self._make_whole()
        return self._backend.decode(list(ids), skip_special_tokens=skip_special)

    def stream(self, skip_special: bool = False) -> "StreamDecoder":
        """A decoder for ids that arrive one at a time."""
        return StreamDecoder(self, skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a byte-fallback token is one byte)."""
        if self._pieces is None:
            text = self._backend.id_to_token(token_id) or ""
        else:  # the whole vocabulary's texts: a backend built for one text holds only its tokens
            text = (self._pieces[token_id] if 0 <= token_id < len(self._pieces) else None) or ""
        if self._byte_of is not None:
            return b"".join(bytes([self._byte_of[c]]) if c in self._byte_of else c.encode() for c in text)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace(SPIECE_SPACE, " ").encode()


class StreamDecoder:
    """Text from ids pushed one by one; holds back the bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool):
        self._tokenizer = tokenizer
        self._skip = tokenizer._special_ids if skip_special else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer._strips_space

    def push(self, token_id: int) -> str:
        """Newly printable text after `token_id`."""
        if token_id in self._skip:
            return ""
        return self._emit(self._utf8.decode(self._tokenizer.token_bytes(token_id)))

    def flush(self) -> str:
        """Whatever is held back, incomplete bytes as U+FFFD."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_space and text:  # the decoder's Strip: one leading space of the whole text
            self._strip_space = False
            text = text.removeprefix(" ")
        return text
