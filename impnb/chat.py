"""Render a conversation into a prompt with the GGUF's chat template, as HF transformers does."""

import functools
import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, SecurityError

from impnb.errors import ParameterError, UnsupportedError

# google/gemma-3 tokenizer_config.json's template without its image branch.
GEMMA_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})
MAX_RENDERED = 1 << 24  # characters a rendered prompt may have
MAX_POWER = 1024  # largest exponent a template may raise to
_SPECIAL_TOKENS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask tag) renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF's tojson: plain json.dumps, no HTML escaping."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with `*` and `**` bounded as its `range` is, so that no template can build a
    huge string or number; the sandbox's own range stops at MAX_RANGE items."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, (int, float)) and (
                abs(right) > MAX_POWER or isinstance(left, int) and left.bit_length() * abs(right) > 1 << 16):
            raise SecurityError(f"a power of {right} is above the template's limit")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and n * len(seq) > MAX_RANGE:
                    raise SecurityError(f"a repeat of {n} x {len(seq)} items is above {MAX_RANGE}")
        return super().call_binop(context, operator, left, right)


class _RangeBudget:
    """`range` for templates: every range of one render together yields at most MAX_RANGE items,
    so nested loops cannot run for hours."""

    def __init__(self):
        self.left = MAX_RANGE

    def __call__(self, *args):
        items = range(*args)
        self.left -= len(items)
        if self.left < 0:
            raise SecurityError(f"the template's loops ask for more than {MAX_RANGE} items")
        return items


_range_budget = _RangeBudget()


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, range=_range_budget)
    return env.from_string(template)


def chat_template(metadata: dict) -> str:
    """The file's chat template, or the built-in Gemma one; UnsupportedError if neither applies."""
    template = metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise UnsupportedError(f"tokenizer.chat_template is {type(template).__name__}, not a string")
    if template:
        return template
    arch = metadata.get("general.architecture")
    if arch in GEMMA_ARCHS:
        return GEMMA_CHAT_TEMPLATE
    raise UnsupportedError(f"model ({arch}) has no chat template")


def render_chat(metadata: dict, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages`; encode it with `add_special=False` (templates write BOS themselves)."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    special = {}
    for name, key in _SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        special[name] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
    try:
        template = _compile(chat_template(metadata))
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise UnsupportedError(f"chat template does not parse: {e}") from e
    _range_budget.left = MAX_RANGE
    try:
        text = template.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **special)
    except jinja2.exceptions.TemplateError as e:
        raise ParameterError(f"chat template rejected the conversation: {e}") from e
    except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError,
            MemoryError) as e:  # the template's own fault: 1/0, a bad call, a huge range
        raise UnsupportedError(f"chat template failed: {type(e).__name__}: {e}") from None
    if len(text) > MAX_RENDERED:
        raise UnsupportedError(f"chat template wrote {len(text)} characters (limit {MAX_RENDERED})")
    return text
