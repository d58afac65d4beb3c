"""Chat templates: the GGUF's template rendered as HF transformers renders it, and the built-in Gemma one."""

from pathlib import Path

import pytest

from impnb.chat import GEMMA_CHAT_TEMPLATE, render_chat
from impnb.errors import ParameterError, UnsupportedError
from impnb.gguf_file import open_model_file
from tests.conftest import real_model_path
from tests.hf_ref import hf_tokenizer

USER = [{"role": "user", "content": "What is 2 + 2?"}]
SYSTEM_USER = [{"role": "system", "content": "You are terse."}, *USER]
MULTI_TURN = [*SYSTEM_USER, {"role": "assistant", "content": "4."},
              {"role": "user", "content": "  And 3 + 3?\n"}]
CONVERSATIONS = {"user": USER, "system+user": SYSTEM_USER, "multi-turn": MULTI_TURN}


def model_path(name: str) -> Path:
    """A real model's GGUF (tests/conftest.py finds it); the test skips if it is not installed."""
    return real_model_path({"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[name])


GEMMA_META = {"general.architecture": "gemma3", "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>"],
              "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1}
GEMMA_EXPECTED = {
    "user": "<bos><start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n",
    "system+user": "<bos><start_of_turn>user\nYou are terse.\n\nWhat is 2 + 2?<end_of_turn>\n"
                   "<start_of_turn>model\n",
    "multi-turn": "<bos><start_of_turn>user\nYou are terse.\n\nWhat is 2 + 2?<end_of_turn>\n"
                  "<start_of_turn>model\n4.<end_of_turn>\n<start_of_turn>user\nAnd 3 + 3?<end_of_turn>\n"
                  "<start_of_turn>model\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_smollm2_template_matches_hf(name):
    messages, path = CONVERSATIONS[name], model_path("smollm2")
    metadata = open_model_file(path).metadata
    hf = hf_tokenizer(path)
    for generation_prompt in (True, False):
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        assert render_chat(metadata, messages, add_generation_prompt=generation_prompt) == expected
    assert render_chat(metadata, messages).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_builtin_gemma_template(name):
    assert render_chat(GEMMA_META, CONVERSATIONS[name]) == GEMMA_EXPECTED[name]


def test_builtin_gemma_template_without_generation_prompt():
    rendered = render_chat(GEMMA_META, USER, add_generation_prompt=False)
    assert rendered == GEMMA_EXPECTED["user"].removesuffix("<start_of_turn>model\n")


@pytest.mark.slow
def test_gemma3_file_uses_builtin_template_as_hf_renders_it():
    path = model_path("gemma3")
    metadata = open_model_file(path).metadata
    assert "tokenizer.chat_template" not in metadata
    hf = hf_tokenizer(path)
    for name, messages in CONVERSATIONS.items():
        assert render_chat(metadata, messages) == GEMMA_EXPECTED[name]
        assert hf.apply_chat_template(messages, chat_template=GEMMA_CHAT_TEMPLATE, tokenize=False,
                                      add_generation_prompt=True) == GEMMA_EXPECTED[name]


def test_gemma_roles_must_alternate():
    with pytest.raises(ParameterError, match="alternate"):
        render_chat(GEMMA_META, [*USER, *USER])


def test_no_template_is_unsupported():
    with pytest.raises(UnsupportedError, match="has no chat template"):
        render_chat({"general.architecture": "llama", "tokenizer.ggml.tokens": []}, USER)


def test_template_environment_matches_hf():
    from transformers.utils.chat_template_utils import render_jinja_template

    template = ("{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n"
                "{{ m | tojson }}|{{ bos_token }}|{{ eos_token }}\n{% endfor %}")
    metadata = {"tokenizer.chat_template": template, "tokenizer.ggml.tokens": ["<s>", "</s>"],
                "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
    messages = [{"role": "user", "content": "<é & ü>"}, {"role": "user", "content": "dropped"}]
    rendered = render_chat(metadata, messages)
    # trim_blocks + lstrip_blocks, loop controls, tojson without HTML escaping or ASCII escapes
    assert rendered == '{"role": "user", "content": "<é & ü>"}|<s>|</s>\n'
    (hf,), _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                     bos_token="<s>", eos_token="</s>")
    assert rendered == hf


def test_raise_exception_in_template():
    metadata = {"tokenizer.chat_template": "{{ raise_exception('no tools here') }}"}
    with pytest.raises(ParameterError, match="no tools here"):
        render_chat(metadata, USER)
