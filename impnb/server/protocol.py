"""The request bodies of /v1/completions and /v1/chat/completions (OpenAI's fields and the common
extensions top_k, min_p, repetition_penalty, ignore_eos) and their SamplingParams.

Sampling defaults are OpenAI's (temperature 1, top_p 1, no top-k or min-p), not the CLI's. The
presence and frequency penalties follow OpenAI's formula over llama.cpp's window: the last 64
tokens, prompt included (sampling.apply_penalties)."""

import secrets

from pydantic import BaseModel, Field, PrivateAttr

from impnb.errors import ParameterError
from impnb.sampling import SamplingParams

MAX_N = 16  # choices one request may ask for


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields both endpoints share; unknown fields are ignored, as OpenAI's clients send many."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # 0 or -1: off
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None
    _seed: int = PrivateAttr(default_factory=lambda: secrets.randbits(63))  # when none is given

    def params(self, max_tokens: int, choice: int) -> SamplingParams:
        """The SamplingParams of choice number `choice` (each choice draws from seed + choice)."""
        seed = self.seed if self.seed is not None else self._seed
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=max(self.top_k or 0, 0), top_p=1.0 if self.top_p is None else self.top_p,
            min_p=self.min_p or 0.0,
            repeat_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            seed=(seed + choice) % 2**64, max_tokens=max_tokens, ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0).validate()

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def check(self) -> None:
        if self.echo:
            raise ParameterError("echo is not supported")

    def prompts(self) -> list:
        """The prompts: one string or token-id list each."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return list(p)
        return [p]

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    type: str = "text"
    text: str = ""


class Message(BaseModel):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_dict(self) -> dict:
        text = self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content or () if p.type == "text")
        return {"role": self.role, "content": text}


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def n_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParameterError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
