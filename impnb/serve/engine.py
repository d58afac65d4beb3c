"""The engine a caller (the LLM API, the CLI, a server) drives: add_request, step, abort.

Each step asks the scheduler for work, builds the runner's StepInput, runs it, samples each
finished sequence's next token on the host with its own sampler (unless the runner sampled on its
device), applies the stops (end of generation, stop strings, max_tokens, the context) and returns
one Delta per request that progressed or ended. Log-probabilities come from the raw logits (before
any penalty): every sampled row's where the runner hands logits to the host, or those a sampling
runner returns for the rows that ask.
"""

import itertools
import time

import numpy as np

from impnb.errors import NumericalError, ParameterError
from impnb.sampling import SamplingParams
from impnb.serve.block_manager import BlockManager
from impnb.serve.outputs import Completion, Delta, Timing, TokenLogprob
from impnb.serve.runner import ModelRunner, SequenceRows, StepInput
from impnb.serve.scheduler import Scheduler, SchedulerConfig
from impnb.serve.sequence import Sequence, Status
from impnb.serve.stops import StopMatcher, check_stops

DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_BATCHED_TOKENS = 256  # a step's token budget: the CPU engine's prompt chunk
MAX_LOGPROBS = 20  # alternatives a token's log-probabilities may list (OpenAI's top_logprobs limit)


def check_positive(name: str, value) -> None:
    """ParameterError unless value is a positive int."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ParameterError(f"{name} must be a positive integer, got {value!r:.40}")


class Request:
    """A sequence and what the engine keeps for the caller: its prompt text, its text stream, its
    stop strings and how many alternatives its log-probabilities list (None: none wanted)."""

    def __init__(self, seq: Sequence, prompt: str | None, stream, stops: StopMatcher,
                 logprobs: int | None):
        self.seq, self.prompt, self.stream, self.stops = seq, prompt, stream, stops
        self.logprobs = logprobs
        self.text: list[str] = []


class LLMEngine:
    def __init__(self, runner: ModelRunner, tokenizer, n_ctx: int, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, prefix_caching: bool = True):
        max_num_seqs = DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs
        budget = DEFAULT_MAX_BATCHED_TOKENS if max_num_batched_tokens is None else max_num_batched_tokens
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", budget),
                            ("n_ctx", n_ctx)):
            check_positive(name, value)
        if runner.n_blocks * runner.block_size < n_ctx:
            raise ParameterError(f"the KV pool holds {runner.n_blocks * runner.block_size} tokens, "
                                 f"less than one sequence of the context ({n_ctx}): give a larger pool "
                                 f"or a shorter context")
        if runner.max_num_seqs is not None:
            max_num_seqs = min(max_num_seqs, runner.max_num_seqs)
        max_num_seqs = min(max_num_seqs, budget)  # every running sequence's decode fits in a step
        if not runner.chunked_prefill:
            budget = max(budget, n_ctx)  # a whole prompt in one step
        self.runner, self.tokenizer, self.n_ctx = runner, tokenizer, n_ctx
        self.blocks = BlockManager(runner.n_blocks, runner.block_size,
                                   prefix_caching and runner.prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, budget, runner.chunked_prefill,
                                                   runner.lookahead_tokens, n_ctx), self.blocks)
        self.requests: dict[str, Request] = {}
        self.ended: list[Delta] = []  # aborts, reported by the next step
        self._ids = itertools.count()

    # -- requests --

    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, *, stop=(), logprobs: int | None = None) -> str:
        """Queue a prompt (text, or token ids) -> its request id; ParameterError when it is empty,
        does not fit the context, or params are bad. stop: strings that end the text (not shown);
        logprobs: each generated token's log-probability and its top `logprobs` alternatives."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ParameterError(f"params is {type(params).__name__}, not SamplingParams")
        params.validate()
        stops = check_stops(stop)
        if logprobs is not None:
            if (isinstance(logprobs, bool) or not isinstance(logprobs, (int, np.integer))
                    or not 0 <= logprobs <= MAX_LOGPROBS):
                raise ParameterError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {logprobs!r:.40}")
            if not (self.runner.returns_logits or self.runner.logits_on_request):
                raise ParameterError(f"logprobs are not available on this runner ({self.runner.device}: "
                                     f"it samples on the device and returns token ids only)")
        ids = self.prompt_ids(prompt)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif request_id in self.requests:
            raise ParameterError(f"request id {request_id!r} is already in use")
        seq = Sequence(ids, params, request_id)
        self.requests[request_id] = Request(seq, prompt if isinstance(prompt, str) else None,
                                            self.tokenizer.stream(), StopMatcher(stops), logprobs)
        self.scheduler.add(seq)
        return request_id

    def prompt_ids(self, prompt) -> list[int]:
        """The token ids of a prompt (text is encoded with BOS as the model wants), checked."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            ids = list(prompt)
            n_vocab = min(self.tokenizer.vocab_size, self.runner.n_vocab or self.tokenizer.vocab_size)
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
                   or not 0 <= t < n_vocab]
            if bad:
                raise ParameterError(f"prompt token {bad[0]!r:.40} is not a token id in [0, {n_vocab})")
            ids = [int(t) for t in ids]
        else:
            raise ParameterError(f"a prompt is a string or a list of token ids, got "
                                 f"{type(prompt).__name__}")
        if not ids:
            raise ParameterError("the prompt is empty")
        if len(ids) >= self.n_ctx:
            raise ParameterError(f"the prompt has {len(ids)} tokens; the context holds {self.n_ctx}")
        return ids

    def abort(self, request_id: str) -> None:
        """Stop a request now; its blocks are freed and the next step reports it ended."""
        req = self.requests.get(request_id)
        if req is None or req.seq.is_finished:
            return
        self._finish(req, "abort")
        self.ended.append(self._delta(req, [], req.stream.flush(), "abort"))

    def drop(self, request_id: str) -> None:
        """Abort a request if it runs and forget it, with anything not yet reported about it."""
        self.abort(request_id)
        self.requests.pop(request_id, None)
        self.ended = [d for d in self.ended if d.request_id != request_id]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def completion(self, request_id: str) -> Completion:
        """A finished request's result; it is then forgotten."""
        req = self.requests.get(request_id)
        if req is None or not req.seq.is_finished:
            raise ParameterError(f"request {request_id!r} is "
                                 + ("not known" if req is None else "not finished"))
        del self.requests[request_id]
        seq = req.seq
        first = seq.first_scheduled or seq.finished
        token = seq.first_token or seq.finished
        timing = Timing(first - seq.arrival, token - first, seq.finished - token,
                        seq.finished - seq.arrival)
        return Completion(request_id, req.prompt, seq.token_ids[:seq.n_prompt], "".join(req.text),
                          seq.output_ids, seq.finish_reason, seq.n_cached, seq.n_preempted, timing)

    # -- steps --

    def step(self) -> list[Delta]:
        """Run one scheduled step -> a Delta for every request that got tokens or ended."""
        out, self.ended = self.ended, []
        step = self.scheduler.schedule()
        for seq in step.preempted:
            self.runner.finished(seq.seq_id)
        if not step:  # the pool holds a whole context, so work that is left always fits
            assert not self.scheduler.has_unfinished(), "unfinished requests but nothing scheduled"
            return out
        now = time.perf_counter()
        rows = []
        for seq, n in step.work:
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            start = seq.n_computed
            recent = (np.asarray(seq.token_ids[-seq.params.repeat_last_n:], np.int32)
                      if seq.params.penalized and seq.params.repeat_last_n else None)
            rows.append(SequenceRows(seq.seq_id, np.asarray(seq.token_ids[start:start + n], np.int32),
                                     start, np.asarray(seq.block_table, np.int32),
                                     start + n == len(seq), seq.params, seq.n_generated, recent,
                                     self.requests[seq.request_id].logprobs is not None))
        result = self.runner.execute(StepInput(rows))
        sampled = [seq for (seq, _), r in zip(step.work, rows) if r.sample]
        for seq, n in step.work:
            seq.n_computed += n
            self.blocks.commit(seq)
        tokens = result.tokens if result.tokens is not None else self._sample(sampled, result.logits)
        raw = result.logits if result.logits is not None else result.logprob_logits
        now = time.perf_counter()
        for i, (seq, token) in enumerate(zip(sampled, tokens)):
            req = self.requests[seq.request_id]
            logprob = (token_logprob(raw[i], int(token), req.logprobs)
                       if req.logprobs is not None and raw is not None and raw[i] is not None else None)
            out.append(self._advance(req, int(token), now, logprob))
        return out

    def _sample(self, seqs: list[Sequence], logits: np.ndarray) -> list[int]:
        tokens = []
        for seq, row in zip(seqs, logits):
            if not np.isfinite(row).all():
                at = "the prompt" if not seq.n_generated else f"generated token {seq.n_generated + 1}"
                if len(self.requests) > 1:
                    at += f" of request {seq.request_id!r}"
                where = self.runner.nonfinite_origin(seq.seq_id)
                raise NumericalError(f"the model produced NaN or inf logits at {at}"
                                     + (f" (first non-finite values entering {where})" if where else "")
                                     + "; its weights are broken or its numerics overflowed")
            tokens.append(seq.sampler(row, seq.token_ids))
        return tokens

    def _advance(self, req: Request, token: int, now: float, logprob: TokenLogprob | None = None) -> Delta:
        """Append a sampled token to its sequence and apply the stops, in the CLI's order; a stop
        string ends the text before it, the token that completed it still counted."""
        seq, p = req.seq, req.seq.params
        if seq.first_token is None:
            seq.first_token = now
        if token in self.tokenizer.eog_ids and not p.ignore_eos:
            self._finish(req, "eog")
            text, stopped = req.stops.push(req.stream.flush())
            return self._delta(req, [], text + ("" if stopped else req.stops.flush()), "eog")
        seq.token_ids.append(token)
        text, stopped = req.stops.push(req.stream.push(token))
        reason = ("stop" if stopped else "length" if seq.n_generated >= p.max_tokens
                  else "context" if len(seq) - 1 >= self.n_ctx else None)
        if reason and not stopped:  # the last text: held-back bytes, then what the stops held
            tail, stopped = req.stops.push(req.stream.flush())
            text += tail + ("" if stopped else req.stops.flush())
            reason = "stop" if stopped else reason
        if reason:
            self._finish(req, reason)
        return self._delta(req, [token], text, reason, [logprob] if logprob else None)

    def _delta(self, req: Request, ids: list[int], text: str, reason: str | None,
               logprobs: list[TokenLogprob] | None = None) -> Delta:
        req.text.append(text)
        return Delta(req.seq.request_id, ids, text, reason is not None, reason, logprobs)

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req.seq, reason)
        req.seq.finished = time.perf_counter()
        self.runner.finished(req.seq.seq_id)


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """token's log-probability under the softmax of the raw logits, and the top `top` tokens'."""
    z = logits.astype(np.float64)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    best = np.argpartition(-logp, top - 1)[:top] if top else np.zeros(0, np.int64)
    best = best[np.argsort(-logp[best], kind="stable")]
    return TokenLogprob(token, float(logp[token]), [(int(t), float(logp[t])) for t in best])
