"""OpenAI's response shapes: whole completions, SSE chunks, usage, log-probabilities, errors."""

import json

from impnb.serve.outputs import TokenLogprob

# the engine's finish reasons as OpenAI names them
FINISH_REASONS = {"eog": "stop", "stop": "stop", "length": "length", "context": "length", "abort": "abort"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ("invalid_request_error" if status < 500 and status != 401 else
            "authentication_error" if status == 401 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status}}


def sse(data) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage(n_prompt: int, n_completion: int, n_cached: int = 0) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion,
            "prompt_tokens_details": {"cached_tokens": n_cached}}


class TokenText:
    """A token's text and bytes as logprobs show them (a partial UTF-8 character as bytes only)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText) -> dict:
    content = []
    for e in entries:
        text, raw = token_text(e.token_id)
        top = [dict(zip(("token", "bytes"), token_text(t)), logprob=lp) for t, lp in e.top]
        content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content}


def completion_logprobs(entries: list[TokenLogprob], token_text: TokenText, offset: int) -> dict:
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        text = token_text(e.token_id)[0]
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(t)[0]: lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}
