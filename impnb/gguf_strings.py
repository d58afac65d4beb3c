"""A GGUF array of strings (a vocabulary, its merges) read with numpy over the mapped bytes.

Each string is a u64 length then its bytes, so where string i+1 begins depends on string i's
length. The fast path finds every offset that could be a length (a value below MAX_STRING: bytes 4-7
zero, byte 3 below 4), guesses the chain from them and checks that each guessed string ends
where the next guessed one begins (which makes the guess the walk's own chain); it then decodes
all the strings at once, with a byte that no string contains as the separator. Anything that
path cannot settle (empty strings in a row, a string with zero bytes where the guess goes
wrong, a bad length, a truncated file, invalid UTF-8) goes to the exact walk, one string at a
time, which raises the error naming the offset.
"""

import struct

import numpy as np

from impnb.errors import GGUFError

MAX_STRING = 1 << 26  # 64 MiB: far above any real key, chat template or token
_U64 = struct.Struct("<Q")
_CHUNK = 1 << 20  # bytes a scan step covers: its temporaries stay small and are reused


def read_strings(buf, pos: int, size: int, count: int) -> tuple[list[str], int]:
    """(the `count` strings stored from byte `pos` of buf, the offset after them)."""
    if count * 8 > size - pos:
        raise GGUFError(f"array of {count} strings cannot fit in the file")
    if count == 0:
        return [], pos
    fast = _read_fast(buf, pos, size, count)
    return fast if fast is not None else _read_walk(buf, pos, size, count)


def _read_fast(buf, pos: int, size: int, count: int):
    """(strings, end) by the candidates' chain, or None where the walk must decide."""
    data = np.frombuffer(buf, np.uint8, size - pos, pos)
    starts = _guess_starts(data, count)
    if starts is None:
        return None
    lengths = _lengths(data, starts)
    if starts[0] != 0 or not np.array_equal((starts + 8 + lengths)[:-1], starts[1:]):
        return None  # a gap in the guessed chain: the walk decides
    end = int(starts[-1]) + 8 + int(lengths[-1])
    if end > len(data):
        return None
    span = data[:end]
    sep = _separator(span, starts)
    if sep is None:
        return None
    joined = span.copy()
    for k in range(8 if sep else 4):  # a length's top four bytes are zero already
        joined[starts + k] = sep
    try:
        text = joined.tobytes().decode("utf-8")
    except UnicodeDecodeError:  # the walk names the string
        return None
    # each length became eight separators; the separator is a whole character, so a multi-byte
    # character split across two strings fails to decode
    return text.split(chr(sep) * 8)[1:], pos + end


def _separator(span: np.ndarray, starts: np.ndarray) -> int | None:
    """An ASCII byte that no string holds (NUL when none does; the lengths' bytes not counted),
    or None."""
    low = [span[starts + k] for k in range(4)]  # the lengths' low bytes (the high four are zero)
    zeros = sum(np.count_nonzero(span[i:i + _CHUNK] == 0) for i in range(0, len(span), _CHUNK))
    if zeros == 4 * len(starts) + sum(np.count_nonzero(b == 0) for b in low):
        return 0
    counts = np.bincount(span, minlength=256)
    for b in low:
        counts -= np.bincount(b, minlength=256)
    free = np.flatnonzero(counts[1:128] == 0)
    return int(free[0]) + 1 if len(free) else None


def _guess_starts(data: np.ndarray, count: int):
    """The guessed offsets of the first `count` lengths, or None when the scan finds fewer.

    A candidate is an offset whose u64 is below MAX_STRING (bytes 4-7 zero, byte 3 below 4). A
    length below 2**24 leaves candidates just before it too (its zero top bytes read from
    there), so the guess is the last candidate of each run of consecutive ones. The scan goes in
    chunks (small temporaries, reused) until it has `count`.
    """
    found, total = [], 0
    for a in range(0, min(len(data), _CHUNK + 64 * count), _CHUNK):  # past 56 bytes a string: the walk
        b = min(a + _CHUNK, len(data))
        w = data[a:b + 8]  # candidates at a..b need bytes up to b + 8
        n = len(w) - 7  # offsets with a whole u64 in the data
        if n <= 0:
            break
        zero = w == 0
        cand = np.zeros(b - a + 1, bool)
        c = cand[:n]
        np.less(w[3:3 + n], 4, out=c)
        for k in (4, 5, 6, 7):
            c &= zero[k:k + n]
        ends = np.flatnonzero(cand[:-1] & ~cand[1:]) + a  # a run's last candidate
        found.append(ends)
        total += len(ends)
        if total >= count:
            return np.concatenate(found)[:count]
    return None


def _lengths(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The u64 lengths at `starts`, whose bytes 4-7 are zero (candidates)."""
    out = data[starts].astype(np.int64)
    for k in (1, 2, 3):
        out |= data[starts + k].astype(np.int64) << (8 * k)
    return out


def _read_walk(buf, pos: int, size: int, count: int) -> tuple[list[str], int]:
    """The exact walk: lengths one at a time, each checked, then each string decoded."""
    buf = memoryview(buf)
    unpack = _U64.unpack_from
    p = pos
    starts, ends = [0] * count, [0] * count
    for i in range(count):
        if p + 8 > size:
            raise GGUFError(f"truncated header: needs 8 bytes at offset {p}, file has {size}")
        n, = unpack(buf, p)
        p += 8
        if n > MAX_STRING:
            raise GGUFError(f"string of {n} bytes at offset {p}")
        if p + n > size:
            raise GGUFError(f"truncated header: needs {n} bytes at offset {p}, file has {size}")
        starts[i] = p
        p += n
        ends[i] = p
    span = bytes(buf[pos:p])
    out = []
    for a, b in zip(starts, ends):
        try:
            out.append(span[a - pos:b - pos].decode("utf-8"))
        except UnicodeDecodeError:
            raise GGUFError(f"string at offset {a} is not UTF-8") from None
    return out, p
