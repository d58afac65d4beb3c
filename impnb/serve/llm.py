"""The Python API (vLLM's and nano-vllm's shape): `LLM(model).generate(prompts, params)`, a
streaming form, and chat through the model's template; `LLM.engine` is the LLMEngine a server
drives with add_request / step / abort."""

from typing import Iterator

import numpy as np

from impnb.chat import render_chat
from impnb.errors import ImpnbError, ParameterError
from impnb.gguf_file import open_model_file
from impnb.model_registry import resolve_model
from impnb.models.validate import validate_model
from impnb.sampling import SamplingParams
from impnb.serve.engine import LLMEngine, check_positive
from impnb.serve.outputs import Completion, Delta
from impnb.serve.pool_size import check_fraction
from impnb.serve.runners import DEFAULT_BLOCK_SIZE, make_runner
from impnb.tokenizer import Tokenizer

DEFAULT_CTX = 4096


class LLM:
    """A model loaded on a device with a paged KV pool shared by every request.

    model: a .gguf path or a model name (default gemma3-270m); device: auto, cuda or cpu; n_ctx:
    the longest sequence (capped at the model's); kv_cache_tokens: the pool's size in tokens
    (default: two contexts on the CPU); gpu_memory_utilization: the fraction of GPU memory a
    batched GPU runner sizes its pool to when kv_cache_tokens is not given (the single-sequence
    CUDA engine that runs today holds one context of its own); max_num_seqs and
    max_num_batched_tokens: sequences and tokens a step takes at most; prefix_caching: share the
    K/V of equal prompt prefixes; block_size: tokens a KV block holds; graphs: CUDA graphs; tp:
    this process's tensor-parallel rank (impnb/parallel/ranks.Rank), its engine on the rank's GPU.
    """

    def __init__(self, model: str | None = None, *, device: str = "auto", n_ctx: int = DEFAULT_CTX,
                 kv_cache_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 prefix_caching: bool = True,
                 block_size: int = DEFAULT_BLOCK_SIZE, graphs: bool = True, tp=None):
        if device not in ("auto", "cuda", "cpu"):
            raise ParameterError(f"device must be auto, cuda or cpu, got {device!r:.40}")
        sizes = {"n_ctx": n_ctx, "block_size": block_size, "kv_cache_tokens": kv_cache_tokens,
                 "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
        for name, value in sizes.items():
            if value is not None:  # before the model loads
                check_positive(name, value)
        check_fraction("gpu_memory_utilization", gpu_memory_utilization)
        self.mf = open_model_file(resolve_model(model))
        self.cfg = validate_model(self.mf)
        self.tokenizer = Tokenizer.from_metadata(self.mf.metadata)
        n_ctx = min(n_ctx, self.cfg.n_ctx)
        runner = make_runner(self.mf, n_ctx, device, kv_cache_tokens, block_size, graphs,
                             gpu_memory_utilization, max_num_seqs, tp)
        self.engine = LLMEngine(runner, self.tokenizer, n_ctx, max_num_seqs, max_num_batched_tokens,
                                prefix_caching)
        self.device = runner.device

    def generate(self, prompts, params=None) -> list[Completion]:
        """One Completion per prompt, in order. prompts: a string, token ids, or a list of them;
        params: one SamplingParams for all or a list of one per prompt."""
        ids = self._add(prompts, params)
        try:
            while self.engine.has_unfinished_requests():
                self.engine.step()
        except BaseException:  # an error or an interrupt: nothing of these requests stays queued
            for i in ids:
                self.engine.drop(i)
            raise
        return [self.engine.completion(i) for i in ids]

    def stream(self, prompts, params=None) -> Iterator[Delta]:
        """Deltas as steps produce them, requests interleaved (each Delta names its request; the
        request ids are "0", "1", ... in prompt order unless the engine had others queued).
        Bad input raises here, before the first delta; closing the iterator early aborts what is
        left."""
        return self._deltas(self._add(prompts, params))

    def _deltas(self, ids: list[str]) -> Iterator[Delta]:
        try:
            while self.engine.has_unfinished_requests():
                yield from (d for d in self.engine.step() if d.request_id in ids)
        finally:
            for i in ids:
                self.engine.drop(i)

    def chat(self, conversations, params=None) -> list[Completion]:
        """generate() on conversations rendered with the model's chat template: one conversation
        (a list of {"role", "content"} messages) or a list of them."""
        if isinstance(conversations, list) and conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        if not isinstance(conversations, list) or not conversations:
            raise ParameterError("chat takes a conversation (a list of messages) or a non-empty list of them")
        prompts = [self.tokenizer.encode(render_chat(self.mf.metadata, c), add_special=False)
                   for c in conversations]
        return self.generate(prompts, params)

    def _add(self, prompts, params) -> list[str]:
        """Queue every prompt with its params -> request ids; on a bad one none stays queued."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and not isinstance(prompts[0], (str, list, tuple, np.ndarray))):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ParameterError("no prompts: give a string, token ids, or a non-empty list of them")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        elif not isinstance(params, (list, tuple)) or len(params) != len(prompts):
            raise ParameterError(f"params must be one SamplingParams or a list of one per prompt "
                                 f"({len(prompts)})")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, p))
        except ImpnbError:
            for i in ids:
                self.engine.drop(i)
            raise
        return ids
