"""Signs that a generated output has degenerated: an immediate EOS, too few distinct tokens, a loop
at the tail, or text made mostly of punctuation. Each check returns a reason (str) or None."""

import math

WINDOW = 32        # tail tokens looked at for diversity
MIN_DISTINCT = 8   # distinct tokens wanted in a full window; a shorter output wants the same share
LOOP_SPAN = 24     # tokens a tail loop must cover (all of a shorter output)
MAX_NGRAM = 8      # longest n-gram a loop is looked for with
MIN_REPEATS = 3
MIN_ALNUM = 0.5    # share of letters and digits wanted among the visible characters
MIN_LETTERS = 0.25  # share of letters wanted among the visible characters ...
LETTER_SPAN = 8    # ... once there are this many ("1. 1. 1. 1." yes, "2 + 2 = 4." not yet)


def immediate_eos(token_ids: list[int], eog_at_start: bool) -> str | None:
    if eog_at_start:
        return "immediate EOS: end of generation before any token"
    if not token_ids:
        return "no tokens generated"
    return None


def low_diversity(token_ids: list[int]) -> str | None:
    tail = list(token_ids[-WINDOW:])
    need = MIN_DISTINCT if len(tail) >= WINDOW else math.ceil(MIN_DISTINCT * len(tail) / WINDOW)
    distinct = len(set(tail))
    if distinct < need:
        return f"low diversity: {distinct} distinct tokens in the last {len(tail)} (want >= {need})"
    return None


def tail_loop(token_ids: list[int]) -> str | None:
    """The shortest n-gram (1..MAX_NGRAM tokens) whose repeats make up the tail: at least
    MIN_REPEATS of them covering LOOP_SPAN tokens, or the whole of a shorter output."""
    t, n = list(token_ids), len(token_ids)
    for k in range(1, MAX_NGRAM + 1):
        span = k  # the tail t[n-span:] has period k
        while span < n and t[n - span - 1] == t[n - span - 1 + k]:
            span += 1
        if span >= max(MIN_REPEATS * k, min(LOOP_SPAN, n)):
            return f"loop: the last {span} tokens repeat a {k}-token n-gram {span / k:.1f} times"
    return None


def mostly_punctuation(text: str) -> str | None:
    visible = [c for c in text if not c.isspace()]
    if not visible:
        return "no visible text: empty or whitespace only"
    alnum = sum(c.isalnum() for c in visible)
    letters = sum(c.isalpha() for c in visible)
    if alnum < MIN_ALNUM * len(visible) or (len(visible) >= LETTER_SPAN
                                            and letters < MIN_LETTERS * len(visible)):
        return (f"mostly punctuation: {letters} letters and {alnum - letters} digits "
                f"in {len(visible)} visible characters")
    return None


def degeneration_reasons(token_ids: list[int], text: str, eog_at_start: bool) -> list[str]:
    """Why the output (generated ids and their text) looks degenerate; [] when it looks healthy."""
    eos = immediate_eos(token_ids, eog_at_start)
    if eos:
        return [eos]
    found = (low_diversity(token_ids), tail_loop(token_ids), mostly_punctuation(text))
    return [r for r in found if r]
