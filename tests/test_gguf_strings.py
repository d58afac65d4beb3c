"""gguf_strings.read_strings: the numpy path gives the exact walk's strings and end on every
array, takes itself out where it cannot be sure, and the errors stay the walk's."""

import struct

import numpy as np
import pytest

from impnb import gguf_strings
from impnb.errors import GGUFError
from impnb.gguf_strings import read_strings


def _array(strings: list[bytes], head: bytes = b"HEAD", tail: bytes = b"\x01\x02tail") -> tuple[bytes, int]:
    body = b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    return head + body + tail, len(head)


def _walk(buf: bytes, pos: int, count: int):
    return gguf_strings._read_walk(buf, pos, len(buf), count)


def _fast(buf: bytes, pos: int, count: int):
    return gguf_strings._read_fast(buf, pos, len(buf), count)


TEXT = [b"a", b"Z", b" ", b"\xc3\xa9", b"\xe2\x98\x83", b"\xf0\x9f\x99\x82", b"<0x0A>"]
SMALL_BYTES = [b"\x00", b"\x01", b"\x03"]  # what lengths are made of


def _random_strings(rng, alphabet: list, empty: float) -> list[bytes]:
    out = []
    for _ in range(int(rng.integers(1, 400))):
        if rng.random() < empty:
            n = int(rng.choice([0, 1, 2, 3, 5, 9, 300]))
        else:
            n = int(rng.integers(1, 8))
        out.append(b"".join(alphabet[i] for i in rng.integers(0, len(alphabet), n)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_arrays_agree_with_the_walk(seed):
    """Short strings, some empty, now and then a long one; half the seeds with NUL and small bytes
    in the text (which look like lengths): read_strings equals the walk, string for string."""
    rng = np.random.default_rng(seed)
    hard = seed % 2 == 1
    strings = _random_strings(rng, TEXT + SMALL_BYTES if hard else TEXT, 0.3 if hard else 0.05)
    buf, pos = _array(strings)
    want = _walk(buf, pos, len(strings))
    assert want == ([s.decode() for s in strings], len(buf) - len(b"\x01\x02tail"))
    assert read_strings(buf, pos, len(buf), len(strings)) == want
    fast = _fast(buf, pos, len(strings))
    assert fast is None or fast == want


def test_most_easy_random_arrays_take_the_numpy_path():
    taken = 0
    for seed in range(0, 40, 2):
        buf, pos = _array(strings := _random_strings(np.random.default_rng(seed), TEXT, 0.05))
        taken += _fast(buf, pos, len(strings)) is not None
    assert taken >= 10, f"the numpy path took {taken} of 20 arrays"


def test_a_plain_vocabulary_takes_the_numpy_path():
    strings = [f"tok{i}".encode() for i in range(5000)] + ["▁é☃".encode(), b""] + [b"x" * 70_000]
    buf, pos = _array(strings)
    fast = _fast(buf, pos, len(strings))
    assert fast is not None, "a vocabulary without zero bytes should not need the walk"
    assert fast == _walk(buf, pos, len(strings))


@pytest.mark.parametrize("strings", [
    [b"", b"", b"", b"a"],  # empty strings in a row: one run of zero bytes
    [b"a\x00\x00\x00\x00\x00\x00\x00\x00b", b"c"],  # zero bytes inside a string
    [bytes(range(128)), b"x"],  # every ASCII byte used: no separator left
])
def test_arrays_the_guess_cannot_settle_fall_back(strings):
    buf, pos = _array(strings)
    assert read_strings(buf, pos, len(buf), len(strings)) == _walk(buf, pos, len(strings))


def test_separator_is_not_split_out_of_a_string():
    """NUL inside strings: another byte separates them, and the NULs stay in the text."""
    strings = [b"a\x00b", b"\x00", b"cd"] * 50
    buf, pos = _array(strings)
    assert read_strings(buf, pos, len(buf), len(strings))[0] == [s.decode() for s in strings]


@pytest.mark.parametrize("bad", [b"\xff", b"\xe2\x98", b"\x80abc", b"\xed\xa0\x80"])
def test_invalid_utf8_names_the_string(bad):
    strings = [b"ok"] * 10 + [bad] + [b"later"] * 10
    buf, pos = _array(strings)
    offset = pos + 11 * 8 + 10 * 2  # the bad string's bytes
    with pytest.raises(GGUFError, match=f"string at offset {offset} is not UTF-8"):
        read_strings(buf, pos, len(buf), len(strings))


def test_character_split_across_two_strings_is_refused():
    buf, pos = _array([b"ok", b"\xe2\x98", b"\x83", b"x"])
    with pytest.raises(GGUFError, match="not UTF-8"):
        read_strings(buf, pos, len(buf), 4)


@pytest.mark.parametrize("length, match", [(2**62, f"string of {2**62} bytes"), (2**26 + 1, "string of"),
                                           (2**24 + 5, "truncated header")])
def test_bad_length_gives_the_walks_error(length, match):
    buf, pos = _array([b"ok"] * 3, tail=b"")
    buf += struct.pack("<Q", length) + b"short"
    with pytest.raises(GGUFError, match=match):
        read_strings(buf, pos, len(buf), 4)


def test_count_past_the_file():
    buf, pos = _array([b"ok"] * 3, tail=b"")
    with pytest.raises(GGUFError, match="cannot fit"):
        read_strings(buf, pos, len(buf), 10**6)
    with pytest.raises(GGUFError, match="truncated header"):
        tail = struct.pack("<Q", 100) + bytes(10)  # room for the count, not for the 100 bytes
        read_strings(buf + tail, pos, len(buf) + len(tail), 4)
