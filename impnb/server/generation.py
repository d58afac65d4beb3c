"""The two generation routes' work: prompts to token ids, checks against the context, the engine
requests of every prompt and choice, and their answer as one JSON body or as SSE chunks.

A client that leaves (mid-stream, or while a whole answer is being made) has its requests aborted
at once: the engine thread drops them before its next step."""

import asyncio
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from impnb.chat import render_chat
from impnb.errors import ImpnbError
from impnb.server.engine_loop import Job, Submit
from impnb.server.protocol import ChatCompletionRequest, CompletionRequest
from impnb.server.responses import (FINISH_REASONS, SSE_DONE, TokenText, chat_logprobs,
                                    completion_logprobs, sse, usage)


class ApiError(Exception):
    """An error answered in OpenAI's shape with its HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class Choice:
    """What one engine request has produced so far."""

    def __init__(self, index: int, n_prompt: int):
        self.index, self.n_prompt = index, n_prompt
        self.text: list[str] = []
        self.logprobs: list = []
        self.n_chars = 0
        self.finish_reason: str | None = None
        self.n_generated = self.n_cached = 0


class Generation:
    """One request to /v1/completions (chat False) or /v1/chat/completions (chat True)."""

    def __init__(self, server, body: CompletionRequest | ChatCompletionRequest, chat: bool):
        self.server, self.body, self.chat = server, body, chat
        self.llm = server.llm
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.token_text = TokenText(self.llm.tokenizer)
        if not chat:
            body.check()
        prompts = self._prompt_ids()
        max_tokens = body.max_new_tokens if chat else body.max_tokens
        self.submits, self.choices = [], {}
        n_logprobs = body.n_logprobs
        job = Job(asyncio.get_running_loop(), asyncio.Queue())
        self.job = job
        for p, ids in enumerate(prompts):
            limit = self._check_context(len(ids), max_tokens)
            for c in range(body.n):
                request_id = f"{self.id}-{p * body.n + c}"
                self.submits.append(Submit(request_id, ids, body.params(limit, c), _stops(body.stop),
                                           n_logprobs, job))
                self.choices[request_id] = Choice(p * body.n + c, len(ids))

    def _prompt_ids(self) -> list[list[int]]:
        tokenizer = self.llm.tokenizer
        if self.chat:
            text = render_chat(self.llm.mf.metadata, [m.as_dict() for m in self.body.messages])
            return [tokenizer.encode(_unicode(text, "messages"), add_special=False)]
        out = []
        for p in self.body.prompts():
            ids = tokenizer.encode(_unicode(p, "prompt")) if isinstance(p, str) else list(p)
            if not ids:
                raise ApiError(400, "the prompt is empty", "prompt")
            out.append(ids)
        return out

    def _check_context(self, n_prompt: int, max_tokens: int | None) -> int:
        """max_tokens, or what the context leaves; ApiError 400 with the counts when it is over."""
        n_ctx = self.llm.engine.n_ctx
        what = "messages" if self.chat else "prompt"
        if n_prompt >= n_ctx:
            raise ApiError(400, f"This model's maximum context length is {n_ctx} tokens. However, your "
                           f"{what} has {n_prompt} tokens: no room to generate.", what, "context_length_exceeded")
        if max_tokens is None:
            return n_ctx - n_prompt
        if n_prompt + max_tokens > n_ctx:
            raise ApiError(400, f"This model's maximum context length is {n_ctx} tokens. However, you "
                           f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the {what}, "
                           f"{max_tokens} for the completion).", "max_tokens", "context_length_exceeded")
        return max_tokens

    # -- running --

    async def answer(self, request: Request):
        """Queue the engine requests, wait until they are all in, then answer."""
        self.server.admit(len(self.submits))
        self.pending = set(self.choices)
        self.server.loop.submit(self.submits)
        try:
            first = await self.job.out.get()
        except BaseException:
            self.close()
            raise
        if isinstance(first, Exception):
            self.pending.clear()  # none of them was queued
            raise first
        if self.body.stream:
            return _Stream(self._stream(), self.close)
        return await self._whole(request)

    def close(self) -> None:
        """Abort the requests that have not finished (the client left, or the answer failed)."""
        if self.pending:
            self.server.loop.abort(sorted(self.pending))
            self.pending.clear()

    async def _events(self):
        """Lists of the Deltas and completions at hand (one at least), every choice's, until all
        are done (an exception ends them, after the items that came before it): a stream that
        has fallen behind the engine takes what has queued up in one go."""
        out = self.job.out
        try:
            while self.pending:
                batch = [await out.get()]
                while not out.empty():
                    batch.append(out.get_nowait())
                items = []
                for item in batch:
                    if isinstance(item, Exception):
                        self.pending.clear()  # the engine thread has dropped them
                        if items:
                            yield items
                        raise item
                    if isinstance(item, tuple):  # ("done", request_id, Completion)
                        _, request_id, completion = item
                        choice = self.choices[request_id]
                        choice.n_generated = len(completion.token_ids)
                        choice.n_cached = completion.n_cached_tokens
                        self.pending.discard(request_id)
                    items.append(item)
                yield items
        finally:
            self.close()

    async def _whole(self, request: Request) -> JSONResponse:
        collect = asyncio.ensure_future(self._collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait([collect, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():  # the client left (or the server stops): abort the requests
                collect.cancel()
                self.close()
        if not collect.done() or collect.cancelled():
            return JSONResponse({}, status_code=499)
        collect.result()
        choices = [self._choice_body(c) for c in sorted(self.choices.values(), key=lambda c: c.index)]
        return JSONResponse({"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                             "created": self.created, "model": self.server.model_name,
                             "choices": choices, "usage": self._usage()})

    async def _collect(self) -> None:
        async for items in self._events():
            for item in items:
                if not isinstance(item, tuple):
                    self._absorb(item)

    def _absorb(self, delta) -> Choice:
        choice = self.choices[delta.request_id]
        choice.text.append(delta.text)
        choice.n_chars += len(delta.text)
        if delta.logprobs:
            choice.logprobs += delta.logprobs
        if delta.finished:
            choice.finish_reason = FINISH_REASONS[delta.finish_reason]
        return choice

    def _choice_body(self, c: Choice) -> dict:
        text = "".join(c.text)
        if self.chat:
            lp = chat_logprobs(c.logprobs, self.token_text) if self.body.n_logprobs is not None else None
            return {"index": c.index, "message": {"role": "assistant", "content": text},
                    "logprobs": lp, "finish_reason": c.finish_reason}
        lp = completion_logprobs(c.logprobs, self.token_text, 0) if self.body.n_logprobs is not None else None
        return {"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason}

    def _usage(self) -> dict:
        prompts = {}
        for c in self.choices.values():  # a prompt shared by n choices counts once
            prompts[c.index // self.body.n] = c.n_prompt
        return usage(sum(prompts.values()), sum(c.n_generated for c in self.choices.values()),
                     sum(c.n_cached for c in self.choices.values()))

    async def _stream(self):
        """SSE chunks: a chunk for each step that made tokens, also where its text is empty (a
        token that renders as nothing, or text held back while it may begin a stop string), as
        vLLM sends them, so that a client sees every token arrive; then usage where asked, then
        [DONE]. The events of what came in one go leave in one write."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.server.model_name}
        extra = {"usage": None} if self.body.include_usage else {}
        events = self._events()
        try:
            if self.chat:
                for c in sorted(self.choices.values(), key=lambda c: c.index):
                    yield sse({**head, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}], **extra})
            async for items in events:
                parts = []
                for item in items:
                    if isinstance(item, tuple):
                        continue
                    c = self.choices[item.request_id]
                    offset = c.n_chars
                    self._absorb(item)
                    if not (item.text or item.token_ids or item.logprobs or item.finished):
                        continue  # a step that made no token (nothing held back either)
                    parts.append(sse({**head, "choices": [self._chunk_choice(c, item, offset)], **extra}))
                if parts:
                    yield "".join(parts)
            if self.body.include_usage:
                yield sse({**head, "choices": [], "usage": self._usage()})
        except ImpnbError as e:
            yield sse({"error": {"message": str(e), "type": "invalid_request_error", "code": 400}})
        except (RuntimeError, ValueError) as e:
            yield sse({"error": {"message": str(e), "type": "server_error", "code": 500}})
        finally:
            await events.aclose()
        yield SSE_DONE

    def _chunk_choice(self, c: Choice, delta, offset: int) -> dict:
        reason = FINISH_REASONS[delta.finish_reason] if delta.finished else None
        if self.chat:
            lp = chat_logprobs(delta.logprobs, self.token_text) if delta.logprobs else None
            return {"index": c.index, "delta": {"content": delta.text} if delta.text or delta.token_ids else {},
                    "logprobs": lp, "finish_reason": reason}
        lp = completion_logprobs(delta.logprobs, self.token_text, offset) if delta.logprobs else None
        return {"index": c.index, "text": delta.text, "logprobs": lp, "finish_reason": reason}


class _Stream(StreamingResponse):
    """SSE whose requests are aborted however the response ends, even before its first chunk."""

    def __init__(self, chunks, on_close):
        super().__init__(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _stops(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    return tuple(_unicode(s, "stop") for s in ((stop,) if isinstance(stop, str) else stop))


def _unicode(text: str, param: str) -> str:
    """text, unless JSON gave it a lone surrogate (\\ud800), which no tokenizer takes: a 400."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{param} holds a lone surrogate at character {e.start}", param) from None
    return text


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
