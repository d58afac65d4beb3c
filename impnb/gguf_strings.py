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
_MIN_SCAN = 1 << 16  # bytes scanned at least for the candidates' window


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
    window = min(len(data), max(_MIN_SCAN, 24 * count))
    while True:
        chain = _chain(data[:window], count, window == len(data))
        if chain is not None or window == len(data):
            break
        window = min(len(data), 2 * window)
    if not chain:
        return None
    starts, lengths = chain
    end = int(starts[-1]) + 8 + int(lengths[-1])
    if end > len(data):
        return None
    span = data[:end]
    low = (starts[:, None] + np.arange(4)).ravel()  # the lengths' low bytes (the high four are zero)
    sep = _separator(span, low, count)
    if sep is None:
        return None
    joined = span.copy()
    joined[low] = sep
    if sep:
        joined[(starts[:, None] + np.arange(4, 8)).ravel()] = sep
    try:
        text = joined.tobytes().decode("utf-8")
    except UnicodeDecodeError:  # the walk names the string
        return None
    # each length became eight separators; the separator is a whole character, so a multi-byte
    # character split across two strings fails to decode
    return text.split(chr(sep) * 8)[1:], pos + end


def _separator(span: np.ndarray, low: np.ndarray, count: int) -> int | None:
    """An ASCII byte that no string holds (NUL when none does; the lengths' bytes not counted),
    or None."""
    zeros = np.count_nonzero(span == 0) - 4 * count - np.count_nonzero(span[low] == 0)
    if zeros == 0:
        return 0
    counts = np.bincount(span, minlength=256) - np.bincount(span[low], minlength=256)
    free = np.flatnonzero(counts[1:128] == 0)
    return int(free[0]) + 1 if len(free) else None


def _chain(window: np.ndarray, count: int, whole: bool):
    """(offsets from the window's start, lengths) of the `count` strings when the candidates'
    guessed chain is the walk's, else None. A length below 2**24 leaves two candidates just
    before it (its zero top bytes read from there), so the guess is the last candidate of each
    run of consecutive ones; runs that may go on past the window (unless it is `whole`) are
    left out. Too few: the window is too small; a gap in the chain: the walk decides."""
    if len(window) < 8:
        return None
    zero = window == 0
    n = len(window) - 7
    cand = zero[4:4 + n] & zero[5:5 + n] & zero[6:6 + n] & zero[7:7 + n] & (window[3:3 + n] < 4)
    offsets = np.flatnonzero(cand)
    starts = offsets[np.diff(offsets, append=len(window) + 1) != 1]
    if not whole:
        starts = starts[starts < len(window) - 16]
    if len(starts) < count:
        return None
    starts = starts[:count]
    lengths = _lengths(window, starts)
    if starts[0] != 0 or not np.array_equal((starts + 8 + lengths)[:-1], starts[1:]):
        return False
    return starts, lengths


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
