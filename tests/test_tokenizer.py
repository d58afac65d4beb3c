"""Tokenizer: ids identical to HF transformers' GGUF tokenizer, decode round trips, streaming decode."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from impnb.errors import GGUFError, UnsupportedError
from impnb.gguf_file import open_model_file
from impnb.tokenizer import Tokenizer, bytes_to_unicode, derived_merges
from tests.conftest import real_model_path
from tests.hf_ref import hf_tokenizer

CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; they'd said so!",
    "In 1969, Apollo 11 landed on the Moon.\nNeil Armstrong's words were: \"That's one small step...\"",
    "def fib(n):\n    if n < 2:\n        return n\n\treturn fib(n - 1) + fib(n - 2)\n",
    "class A:\n    x = {'a': [1, 2, 3]}  # comment\n\n\n    def f(self) -> int: ...\n",
    "emoji 😀🎉👍🏽 and 🤖🧑‍🚀 flags 🇫🇷",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "مرحبا بالعالم، كيف حالك؟",
    "ñandú café naïve Ωμέγα Привет",
    "rare: 𓀀 𝔘𝔫𝔦 \U0001FAE8 \u200b",
    "a  b   c    d\n\n\n  \t\t x \r\n y",
    "      six leading spaces",
    " leading space",
    "\tleading tab",
    "\n",
    " ",
    "trailing spaces   ",
    "1234567 3.14159 000 1,000,000 2024-01-31",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "not special: <|im_start <start_of_turn <eos",
    "<table><tr><td>1</td></tr></table> <b>bold</b>",
]

def model_path(name: str) -> Path:
    """A real model's GGUF (tests/conftest.py finds it); the test skips if it is not installed."""
    return real_model_path({"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[name])


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    """(our tokenizer, HF's tokenizer) for one real model, built once per module."""
    path = model_path(request.param)
    return request.param, Tokenizer.from_metadata(open_model_file(path).metadata), hf_tokenizer(path)


def stream_text(tok, ids, skip_special=False):
    stream = tok.stream(skip_special)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    return pieces, "".join(pieces)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_ids_match_hf(model, text):
    _, tok, hf = model
    assert tok.encode(text) == hf(text).input_ids
    assert tok.encode(text, add_special=False) == hf(text, add_special_tokens=False).input_ids


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_decode_round_trip(model, text):
    _, tok, hf = model
    ids = tok.encode(text)
    assert tok.decode(tok.encode(text, add_special=False)) == text
    assert tok.decode(ids) == hf.decode(ids)
    assert tok.decode(ids, skip_special=True) == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_stream_equals_decode(model, text):
    _, tok, _ = model
    ids = tok.encode(text)
    pieces, joined = stream_text(tok, ids)
    assert joined == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert stream_text(tok, ids, skip_special=True)[1] == tok.decode(ids, skip_special=True)


@pytest.mark.slow
def test_stream_holds_back_partial_characters(model):
    _, tok, _ = model
    text = "𓀀 𝔘𝔫𝔦 \U0001FAE8"  # rare characters: byte tokens in both vocabularies
    ids = tok.encode(text, add_special=False)
    assert any(len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80 for i in ids)
    pieces, joined = stream_text(tok, ids)
    assert joined == text
    assert "" in pieces[:-1] and not any("\ufffd" in p for p in pieces)


@pytest.mark.slow
def test_special_tokens_and_bos(model):
    name, tok, hf = model
    if name == "smollm2":
        assert tok.kind == "gpt2" and tok.bos_id == 1 and tok.eos_id == 2
        assert tok.encode("<|im_start|>user") == [1, *tok.encode("user")]
        assert tok.encode("Hello")[0] != tok.bos_id
        assert 2 in tok.eog_ids and 0 in tok.eog_ids  # <|im_end|>, <|endoftext|>
    else:
        end_of_turn, start_of_turn = hf.convert_tokens_to_ids(["<end_of_turn>", "<start_of_turn>"])
        assert tok.kind == "llama" and tok.bos_id == 2 and tok.eos_id == 1
        assert tok.encode("Hello")[0] == 2 and tok.encode("") == [2]
        assert tok.encode("<start_of_turn>user", add_special=False)[0] == start_of_turn
        assert {1, end_of_turn} <= tok.eog_ids
    assert tok.vocab_size == len(hf)


def tiny_llama_metadata() -> dict:
    """A SentencePiece vocabulary with byte fallback: specials, 256 byte tokens, a few pieces."""
    pieces = ["\u2581", "a", "\u2581a", "b", "\u2581b", "ab", "\u2581ab", "<|im_end|>", "<think>"]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces],
        "tokenizer.ggml.scores": [0.0] * 259 + [-1.0, -2.0, -0.5, -0.7, -0.6, -0.8, -0.4, 0.0, 0.0],
        "tokenizer.ggml.token_type": [2, 3, 3, *[6] * 256, 1, 1, 1, 1, 1, 1, 1, 3, 4],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def tiny_gpt2_metadata(pre: str) -> dict:
    """A byte-level BPE vocabulary: the 256 byte characters, two control tokens, and merges that
    cross the boundaries some split regexes draw ("3 4" in 123456, "o W" in HelloWorld)."""
    merged = ["34", "oW", "\u0120t", "he", "\u0120the", "12", "123", "\u0120\u0120", "\u010a\u010a"]
    tokens = [*bytes_to_unicode().values(), *merged, "<|endoftext|>", "<|eot_id|>"]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 2) + [3, 3],
        "tokenizer.ggml.merges": ["3 4", "o W", "\u0120 t", "h e", "\u0120t he", "1 2", "12 3", "\u0120 \u0120",
                                  "\u010a \u010a"],
        "tokenizer.ggml.bos_token_id": len(tokens) - 2,
        "tokenizer.ggml.eos_token_id": len(tokens) - 2,
    }


def hf_tokenizer_for(metadata: dict, directory):
    """HF's tokenizer for a GGUF holding only `metadata` (and a token llama config)."""
    import gguf
    from transformers import AutoTokenizer

    writer = gguf.GGUFWriter(str(directory / "tiny.gguf"), "llama")
    for key, value in {"llama.context_length": 64, "llama.block_count": 1, "llama.embedding_length": 8,
                       "llama.feed_forward_length": 16, "llama.attention.head_count": 1}.items():
        writer.add_uint32(key, value)
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return AutoTokenizer.from_pretrained(str(directory), gguf_file="tiny.gguf")


TINY_TEXTS = ["", "ab ab", " ab", "a€b", "  ab  b ", "<|im_end|>ab<think> b", "b",
              "the 123456 1234  the\n\n\nthe", "<|endoftext|>the<|eot_id|> x", "é😀  \t\n", "HelloWorld"]


def test_tiny_sentencepiece_matches_hf(tmp_path):
    metadata = tiny_llama_metadata()
    tok, hf = Tokenizer.from_metadata(metadata), hf_tokenizer_for(metadata, tmp_path)
    for text in TINY_TEXTS:
        ids = tok.encode(text)
        assert ids == hf(text).input_ids, text
        assert tok.decode(ids) == hf.decode(ids) == stream_text(tok, ids)[1]


@pytest.mark.parametrize("pre", ["default", "smollm", "llama-bpe", "qwen2", "gpt-4o"])
def test_tiny_byte_level_matches_hf(tmp_path, pre):
    metadata = tiny_gpt2_metadata(pre)
    tok, hf = Tokenizer.from_metadata(metadata), hf_tokenizer_for(metadata, tmp_path)
    for text in TINY_TEXTS:
        ids = tok.encode(text)
        assert ids == hf(text).input_ids, text
        assert tok.decode(ids) == hf.decode(ids) == stream_text(tok, ids)[1] == text
    assert tok.eog_ids == {len(metadata["tokenizer.ggml.tokens"]) - i for i in (1, 2)}


def test_byte_fallback_stream_buffers_incomplete_utf8():
    tok = Tokenizer.from_metadata(tiny_llama_metadata())
    ids = tok.encode("a€")
    euro = [3 + b for b in "€".encode()]  # byte tokens follow the three specials
    assert ids == [1, 261, *euro]
    stream = tok.stream()
    assert [stream.push(i) for i in ids] == ["<s>", " a", "", "", "€"]
    assert stream.flush() == ""
    assert tok.decode(ids) == "<s> a€"


def test_stream_strips_first_space_like_decode_and_flushes_partial_bytes():
    tok = Tokenizer.from_metadata(tiny_llama_metadata())
    ids = tok.encode("a a", add_special=False)
    assert "".join(map(tok.stream().push, ids)) == tok.decode(ids) == "a a"
    stream = tok.stream()
    assert stream.push(3 + 0xE2) == ""
    assert stream.flush() == "\ufffd"
    assert tok.eog_ids == {2, 266}  # </s> and <|im_end|>


def test_derived_merges_match_hf_generate_merges():
    from transformers.tokenization_utils_base import generate_merges

    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca", "cab", "bca", "aa", "aaa", "aaaa"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    scores = dict(zip(tokens, [0.0, 0.0, 0.0, -1.0, -1.0, -2.0, -1.0, -3.0, -2.0, -1.0, -2.0, -2.0]))
    assert derived_merges(vocab, scores) == generate_merges(vocab, scores)
    assert derived_merges(vocab, {tok: -i for tok, i in vocab.items()}) == generate_merges(
        vocab, {tok: -i for tok, i in vocab.items()})


def test_unsupported_or_incomplete_tokenizer_metadata():
    with pytest.raises(UnsupportedError, match="'bert'"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    metadata = tiny_gpt2_metadata("default")
    del metadata["tokenizer.ggml.merges"]
    with pytest.raises(GGUFError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata(metadata)


def test_merges_cache_hit_equals_derivation_and_corrupt_entries_are_rebuilt(tmp_path, monkeypatch):
    from impnb import tokenizer_cache

    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "kernels"))
    metadata = tiny_llama_metadata()
    fresh = Tokenizer.from_metadata(metadata)
    files = list((tmp_path / "tokenizers").iterdir())
    assert len(files) == 1
    calls = []
    real = tokenizer_cache.cached_merges

    def counting(tokens, vocab, rank, derive):
        return real(tokens, vocab, rank, lambda: calls.append(1) or derive())

    monkeypatch.setattr("impnb.tokenizer.cached_merges", counting)
    out_of_range = np.array([[0, 1, 10**6]], "<i4").tobytes()
    for damage in (None, b"junk", files[0].read_bytes()[:-3], files[0].read_bytes()[:-8] + b"\xff" * 8,
                   tokenizer_cache.MAGIC + hashlib.sha256(out_of_range).digest() + out_of_range):
        if damage is not None:
            files[0].write_bytes(damage)
        calls.clear()
        tok = Tokenizer.from_metadata(metadata)
        assert calls == ([] if damage is None else [1])
        for text in TINY_TEXTS:
            assert tok.encode(text) == fresh.encode(text), text
    scores = list(metadata["tokenizer.ggml.scores"])
    metadata["tokenizer.ggml.scores"] = scores[::-1]
    calls.clear()
    Tokenizer.from_metadata(metadata)
    assert calls == [1]  # other scores, other key
    metadata["tokenizer.ggml.tokens"] = [*metadata["tokenizer.ggml.tokens"][:-1], "<thinking>"]
    calls.clear()
    Tokenizer.from_metadata(metadata)
    assert calls == [1]  # another token's text, another key


def test_merges_cache_dir_that_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(blocker / "kernels"))
    tok = Tokenizer.from_metadata(tiny_llama_metadata())
    assert tok.decode(tok.encode("ab ab")) == "<s> ab ab"


def test_built_for_one_text_encodes_it_as_the_whole_tokenizer(tmp_path, monkeypatch):
    """from_metadata(for_text=...) on a SentencePiece vocabulary with derived merges: that text's
    ids are the whole tokenizer's (and HF's), and any other text builds the whole one first."""
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "kernels"))
    metadata = tiny_llama_metadata()
    whole, hf = Tokenizer.from_metadata(metadata), hf_tokenizer_for(metadata, tmp_path)
    assert not whole.partial
    every_id = list(range(whole.vocab_size))
    for text in TINY_TEXTS:
        tok = Tokenizer.from_metadata(metadata, for_text=text)
        assert tok.partial
        assert tok.encode(text) == whole.encode(text) == hf(text).input_ids, text
        for skip in (False, True):  # every id streams as the whole tokenizer's does
            assert stream_text(tok, every_id, skip) == stream_text(whole, every_id, skip)
        assert tok.partial
        other = text + " ab b"
        assert tok.encode(other) == whole.encode(other) and not tok.partial
    tok = Tokenizer.from_metadata(metadata, for_text="ab")
    assert tok.decode(every_id) == whole.decode(every_id) and not tok.partial


def test_merge_table_for_a_text_keeps_rank_order_and_byte_merges():
    from impnb.tokenizer_merges import MergeTable

    tokens = ["<unk>", "<0x41>", "a", "b", "ab", "\u2581a", "\u2581", "ba", "<0x41>a", "bab"]
    vocab = {t: i for i, t in enumerate(tokens)}
    triples = np.array([(vocab[x], vocab[y], vocab[x + y]) for x, y in
                        [("b", "a"), ("a", "b"), ("<0x41>", "a"), ("\u2581", "a"), ("b", "ab")]], np.int32)
    table = MergeTable(tokens, vocab, triples, "<unk>")
    assert table.pairs() == [("b", "a"), ("a", "b"), ("<0x41>", "a"), ("\u2581", "a"), ("b", "ab")]
    # "ab a": pieces ab, "b\u2581", ... and "\u2581a" (a space before a); never "ba" nor "bab"
    merges, seen = table.for_text("ab a")
    assert merges == [("a", "b"), ("<0x41>", "a"), ("\u2581", "a")]
    assert {tokens[i] for i in seen} == {"a", "b", "ab", "\u2581", "\u2581a", "<0x41>", "<0x41>a"}
    merges, seen = table.for_text("a")
    assert merges == [("<0x41>", "a"), ("\u2581", "a")]  # a word-initial "\u2581a"
    assert {tokens[i] for i in seen} == {"a", "\u2581", "\u2581a", "<0x41>", "<0x41>a"}
    assert table.for_text("x" * 100_000) is None  # too long to search: the whole table


@pytest.mark.slow
def test_real_tokenizers_built_for_one_text_and_from_the_cache(tmp_path, monkeypatch):
    """Both real models: a tokenizer built for one text gives HF's ids for it; Gemma3's derived
    merges, derived into an empty cache and read back from it, give the same ids."""
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "kernels"))
    for name in ("smollm2", "gemma3"):
        path = model_path(name)
        md, hf = open_model_file(path).metadata, hf_tokenizer(path)
        derived = Tokenizer.from_metadata(md)  # an empty cache: derived (Gemma3), then written
        cached = Tokenizer.from_metadata(md)
        one = Tokenizer.from_metadata(md, for_text=CORPUS[2])
        ids = list(range(cached.vocab_size))
        assert [one.token_bytes(i) for i in ids] == [cached.token_bytes(i) for i in ids]
        assert stream_text(one, ids, True) == stream_text(cached, ids, True)
        for text in CORPUS:
            tok = Tokenizer.from_metadata(md, for_text=text)
            assert tok.partial == (name == "gemma3")
            ids = tok.encode(text)
            assert ids == derived.encode(text) == cached.encode(text) == hf(text).input_ids, text
    assert len(list((tmp_path / "tokenizers").iterdir())) == 1  # Gemma3's; SmolLM2 has its merges
