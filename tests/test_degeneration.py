"""Degeneration checks on crafted outputs: each kind of degenerate output is caught by its own check,
and healthy answers pass every check."""

import re

import pytest

from impnb.degeneration import degeneration_reasons

HEALTHY = [
    "The capital of France is Paris.",
    "The answer to this classic math problem is 4.",
    "4",
    "2 + 2 = 4.",
    " Paris, France. It is the tallest building in the world. It is 300 meters high.",
    "The sea is a vast and mysterious realm, teeming with life, and it covers more than seventy "
    "percent of the planet. Sailors have crossed it for thousands of years, guided first by the "
    "stars and later by compasses, charts and satellites, yet much of its floor is still unmapped.",
    "Here are three steps:\n1. Boil the water.\n2. Add the pasta and a pinch of salt.\n"
    "3. Drain it after ten minutes.",
]


def word_ids(text: str, vocab: dict | None = None) -> list[int]:
    """A stand-in tokenizer: one id per word or punctuation mark, the same id for the same piece."""
    vocab = {} if vocab is None else vocab
    return [vocab.setdefault(piece, len(vocab)) for piece in re.findall(r"\s*\w+|\s*[^\w\s]", text)]


def kinds(reasons: list[str]) -> set[str]:
    return {r.split(":")[0] for r in reasons}


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_answers_pass(text):
    assert degeneration_reasons(word_ids(text), text, eog_at_start=False) == []


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_answers_pass_with_real_tokens(text, smollm2_path):
    from impnb.gguf_file import open_model_file
    from impnb.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(open_model_file(smollm2_path).metadata)
    assert degeneration_reasons(tok.encode(text, add_special=False), text, eog_at_start=False) == []


def test_commas_one_token_repeated():
    text = ",,,,,"
    assert kinds(degeneration_reasons([28] * 5, text, False)) == {"low diversity", "loop", "mostly punctuation"}


def test_commas_text_alone():
    """Distinct ids (one multi-comma token each): only the text shows the fault."""
    assert kinds(degeneration_reasons([1], ",,,,,", False)) == {"mostly punctuation"}
    assert kinds(degeneration_reasons([1, 2, 3], " , , ,\n,,", False)) == {"mostly punctuation"}


def test_numbered_list_without_items():
    text = "1. 1. 1. 1."
    assert kinds(degeneration_reasons(word_ids(text), text, False)) == {"mostly punctuation"}
    long = "1. " * 20
    assert {"low diversity", "loop", "mostly punctuation"} <= kinds(degeneration_reasons(word_ids(long), long, False))


def test_two_token_loop():
    text = " yes no" * 20
    assert kinds(degeneration_reasons(word_ids(text), text, False)) == {"low diversity", "loop"}


def test_two_token_loop_after_a_healthy_start():
    """The last 32 tokens still hold 10 distinct ones: only the loop check sees it."""
    start = "The ship left the harbour at dawn with forty sailors and a cargo of salt, wool and iron"
    vocab = {}
    head = word_ids(start, vocab)
    assert len(set(head[-8:])) == 8
    looped = start + " yes no" * 12  # 24 tokens of loop
    reasons = degeneration_reasons(word_ids(looped, vocab), looped, False)
    assert kinds(reasons) == {"loop"} and "2-token n-gram" in reasons[0]
    short = start + " yes no" * 11  # 22 tokens: under the loop span
    assert degeneration_reasons(word_ids(short, vocab), short, False) == []


def test_eight_token_ngram_loop():
    ids = list(range(100, 140)) + list(range(8)) * 3
    assert kinds(degeneration_reasons(ids, "words " * 64, False)) == {"loop"}
    ids = list(range(100, 140)) + list(range(9)) * 3  # a 9-gram is longer than looked for
    assert degeneration_reasons(ids, "words " * 67, False) == []


def test_low_diversity_without_a_loop():
    ids = [1, 2, 3, 4, 5, 6, 7, 1, 3, 5, 7, 2, 4, 6, 1, 2, 3, 4, 5, 6, 7, 1, 3, 5, 7, 2, 4, 6, 5, 1, 2, 3]
    assert kinds(degeneration_reasons(ids, "several different words", False)) == {"low diversity"}
    assert degeneration_reasons(ids[:-1] + [8], "several different words", False) == []  # 8 distinct


def test_short_outputs_scale_the_diversity_threshold():
    ids = [5, 6, 5, 5, 6, 6, 5, 5, 5, 6, 5, 6]  # 12 tokens want 3 distinct
    assert kinds(degeneration_reasons(ids, "a lot of words", False)) == {"low diversity"}
    assert degeneration_reasons(ids[:-1] + [7], "a lot of words", False) == []


def test_immediate_eos():
    assert kinds(degeneration_reasons([], "", eog_at_start=True)) == {"immediate EOS"}
    assert kinds(degeneration_reasons([], "", eog_at_start=False)) == {"no tokens generated"}


def test_whitespace_only():
    assert kinds(degeneration_reasons([13, 198, 13], " \n\n ", False)) == {"no visible text"}
