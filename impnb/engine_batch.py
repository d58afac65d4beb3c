"""The batched CUDA engine: many sequences on one DeviceModel, their KV in one shared page pool.

A scheduler (impnb/serve) owns the sequences and their pages; this engine runs what it is told:
a prompt chunk of one sequence into that sequence's pages (CudaEngine's prefill path and graphs,
with the sequence's block table as row 0 of the model's tables), or one decode step of B
sequences, a token each, sampled on the GPU with each sequence's parameters, seed and step.

Under tensor parallelism (tp: this process's rank) every rank runs the same calls on its slices
and rank 0's sampled ids are broadcast in the step.

A decode step pads B to a bucket (BATCH_BUCKETS) and replays that bucket's graph for the
longest sequence's context bucket: the step's ids, positions, block tables, sampling rows and
step counters are copied into fixed device buffers first (one pinned staging copy each), so any
mix of sequences replays one graph. Padding rows decode token 0 at position 0 into a scratch
page no sequence owns, their step counter -1; their sampled ids are dropped.

Look-ahead (on by default, tuning.BATCH_LOOKAHEAD): the graph's last kernel (step_state.
advance_rows) makes each live row's sampled id, position + 1 and step + 1 the next step's input
on the device, so right after a step the engine queues the next replay before the host reads
this step's tokens. The next decode() takes that queued step where its rows continue these
exactly (the same rows in the same order, each with the token sampled, the next position and
counter, the same parameters and the pages the device's table holds up to that position) and
queues the one after; otherwise the queued step is dropped (its K/V rows are rewritten before
anything reads them) and the rows are staged as usual. Rows with a repeat penalty or logprobs,
graphs off, tensor parallelism, and a step whose next position needs another context bucket or
a page the row's table does not yet list, queue nothing. The scheduler lists a decode row's next
page one step early (SchedulerConfig.lookahead) so page boundaries do not break the chain.

A row that asks for logprobs gets its raw logits (before any penalty, which rewrites them in
place: the step's graph then keeps a copy first) copied to the host, that row alone, in
raw_logits; the caller computes the log-probabilities there (serve.engine.token_logprob).
"""

from dataclasses import dataclass

import numpy as np

from impnb.engine_cuda import HISTORY, CudaEngine
from impnb.errors import NumericalError, ParameterError, UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.gpu.kv import PagedKV
from impnb.graphs.replays import Replays, Ticket
from impnb.kernels.sample import argmax, sample_penalty
from impnb.kernels.sample import sample as sample_kernels
from impnb.kernels.sample import step_state
from impnb.kernels.sample.nonfinite import NONFINITE_BIT, flag_nonfinite
from impnb.models import model_config
from impnb.models.paged_kv_cache import PagedKVPool
from impnb.sampling import SamplingParams
from impnb.tuning import PAGE_SIZE

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PADDING = SamplingParams(temperature=0.0)  # a padding row's sampling: greedy, its id dropped
PARAM_ROWS_KEPT = 1024  # sampler rows kept by parameters (one a request with its own seed)


def batch_bucket(n: int, max_batch: int) -> int:
    """The smallest bucket holding n sequences, at most max_batch."""
    return min(max_batch, next((b for b in BATCH_BUCKETS if b >= n), max_batch))


@dataclass
class DecodeRow:
    """One sequence's part of a decode step: its last token, that token's position, its pages,
    sampling parameters, how many tokens it has sampled (the draw's counter) and, for a repeat
    penalty, its recent tokens (the last HISTORY count); logprobs: return its raw logits."""

    token: int
    pos: int
    pages: np.ndarray
    params: SamplingParams
    n_sampled: int
    history: np.ndarray | None = None
    logprobs: bool = False


@dataclass
class Queued:
    """A decode step queued on the device's own inputs: the graph it replays and its plan, the rows
    it continues (the tokens they sampled, the positions and counters it runs at, their
    parameters, the pages the device's table held for each) and the ticket of its sampled ids."""

    key: tuple
    plan: object
    Bb: int
    ticket: Ticket
    tokens: np.ndarray | None  # None until the host reads the step it continues
    pos: list
    n_sampled: list
    params: list
    pages: list
    dirty: bool = False  # a prompt chunk ran since: the device's inputs are no longer this step's advanced

    def continued_by(self, rows: list[DecodeRow]) -> bool:
        """Whether rows are exactly the step this one runs."""
        if len(rows) != len(self.pos):
            return False
        for b, r in enumerate(rows):
            if (r.token != self.tokens[b] or r.pos != self.pos[b] or r.n_sampled != self.n_sampled[b]
                    or r.logprobs or (r.params is not self.params[b] and r.params != self.params[b])):
                return False
            n = r.pos // PAGE_SIZE + 1  # the pages the step reads and writes
            held = self.pages[b]
            if len(held) < n or len(r.pages) < n or not np.array_equal(held[:n], np.asarray(r.pages[:n])):
                return False
        return True


def _ring(history) -> np.ndarray:
    """A repeat-penalty ring (HISTORY,) of the last HISTORY tokens, -1 where fewer (the penalty
    reads the ring as a set: order does not matter)."""
    ring = np.full(HISTORY, -1, np.int32)
    tail = np.asarray(history, np.int32)[-HISTORY:]
    ring[:len(tail)] = tail
    return ring


class CudaBatchEngine(CudaEngine):
    """prefill_seq(...) -> a sequence's next token; decode(rows) -> each row's next token.

    n_pages pages of PAGE_SIZE tokens are the scheduler's to hand out (page numbers 0 ..
    n_pages - 1); max_batch sequences decode in one step at most.
    """

    owns_pages = False  # the block manager's pages (shared prefixes, preemption): no window rings

    def __init__(self, mf: ModelFile, n_ctx: int, kv_tokens: int, max_batch: int, graphs: bool = True,
                 tp=None, lookahead: bool | None = None, tp_group=None):
        if max_batch < 1 or max_batch > BATCH_BUCKETS[-1]:
            raise ParameterError(f"max batch must be in [1, {BATCH_BUCKETS[-1]}], got {max_batch}")
        if kv_tokens < PAGE_SIZE:
            raise ParameterError(f"the KV pool must hold at least {PAGE_SIZE} tokens, got {kv_tokens}")
        cfg = model_config(mf)
        if not PagedKVPool.holds(cfg):  # gemma4's per-layer and shared K/V: gpu/forward_gemma4.py
            raise UnsupportedError(f"{cfg.arch} runs one sequence at a time on the GPU (per-layer or "
                                   f"shared K/V); no batched decode")
        super().__init__(mf, n_ctx, graphs, lookahead=False, kv_tokens=kv_tokens + PAGE_SIZE, max_seqs=max_batch,
                         tp=tp, tp_group=tp_group)
        if self.m.rec is not None:
            raise UnsupportedError(f"{self.cfg.arch}: batched decode of a recurrent state has no GPU path "
                                   f"yet; serve one sequence at a time (max_num_seqs 1)")
        ctx, V = self.m.ctx, self.cfg.n_vocab
        self.max_batch = max_batch
        self.n_pages = self.m.kv.n_pages - 1
        self.scratch_page = self.n_pages  # padding rows' K/V
        self.max_pages = self.m.kv.tables.shape[1]
        cuda = ctx.cuda
        self.host_tables = cuda.pinned_array(self.m.kv.tables.shape, np.int32)
        self.host_params = cuda.pinned_array((max_batch, sample_kernels.NPARAM), np.float64)
        self.host_steps = cuda.pinned_array(max_batch, np.int32)
        self.host_hist = cuda.pinned_array((max_batch, HISTORY), np.int32)
        self.host_outs = cuda.pinned_array(max_batch, np.int32)
        self.host_tables_ahead = [cuda.pinned_array(self.m.kv.tables.shape, np.int32) for _ in range(2)]
        self.b_params = ctx.empty((max_batch, sample_kernels.NPARAM), np.float64)
        self.b_steps = ctx.empty(max_batch, np.int32)
        self.b_hist = ctx.empty((max_batch, HISTORY), np.int32)
        self.b_outs = ctx.empty(max_batch, np.int32)
        self.b_scratch = sample_kernels.sample_scratch(max_batch, V)
        self.b_argmax = argmax.argmax_scratch(max_batch)
        self.batch_graphs = {}  # (bucket, context bucket, all greedy, any penalty, keep raw) -> Graph
        self.raw_logits: dict[int, np.ndarray] = {}  # the last call's rows that asked -> (V,) float32
        # look-ahead: the next step queued on the device's own inputs (None: graphs off, the
        # simulator, tensor parallelism)
        if lookahead is None:
            lookahead = self.m.tuning.batch_lookahead
        self.lookahead = lookahead and self.use_graphs and tp is None and tp_group is None
        self.batch_replays = None if ctx.simulator else Replays(ctx, self.b_outs, max_batch)
        self.queued: Queued | None = None
        self.table_flip = 0  # which of host_tables_ahead the next table update writes
        self.ahead_taken = self.ahead_dropped = 0  # queued steps run as queued, and dropped
        self.param_rows: dict[SamplingParams, np.ndarray] = {}  # -> (NPARAM,) float64, _param_row

    # ------------------------------------------------------------ one sequence's prompt

    def prefill_seq(self, ids, start: int, pages: np.ndarray, params: SamplingParams,
                    n_sampled: int = 0, history=None, sample: bool = True, logprobs: bool = False) -> int | None:
        """Feed ids at positions start.. of the sequence whose KV lives in `pages` (its block
        table; positions < start are already there: earlier chunks, a shared prefix) -> its next
        token, sampled at counter n_sampled (None with sample False: a prompt chunk before its
        last); history: its recent tokens, for a repeat penalty (the last HISTORY count);
        logprobs: the raw logits it sampled from go to raw_logits[0]."""
        ids = np.asarray(ids, np.int32)
        if not len(ids):
            raise ParameterError("the prompt chunk is empty")
        if start + len(ids) > self.n_ctx:
            raise ParameterError(f"{start + len(ids)} tokens exceed the context of {self.n_ctx}")
        if self.queued is not None:  # it runs first (stream order); nothing is queued after it
            self.queued.dirty = True
        self._set_table_row0(pages)
        self.reset(params)
        self.pos = start
        logits = None
        chunk = self.m.chunk
        for at in range(0, len(ids), chunk):
            logits = self._prefill_chunk(ids[at:at + chunk])
        self.raw_logits = {}
        if not sample:
            return None
        if logprobs:  # before the penalty rewrites them; the sampler's sync completes the copy
            self.raw_logits[0] = logits[0].copy_to_host(stream=self.m.ctx.nb_stream)
        if params.penalized and history is not None:
            self.host_history[0] = _ring(history)
            self.m.ctx.h2d(self.history, self.host_history)
        self.n_sampled = n_sampled
        return self._sample(logits)

    def _set_table_row0(self, pages: np.ndarray) -> None:
        row = self._table_row(pages)
        self.m.ctx.sync()  # the staging row may still feed the last step's copy
        self.host_tables[0] = row
        self.m.ctx.h2d(self.m.kv.tables, self.host_tables, 1)

    def _table_row(self, pages) -> np.ndarray:
        pages = np.asarray(pages, np.int32)
        if len(pages) > self.max_pages or (len(pages) and (pages.min() < 0 or pages.max() >= self.n_pages)):
            raise ParameterError(f"a block table must list at most {self.max_pages} pages in "
                                 f"[0, {self.n_pages})")
        row = np.full(self.max_pages, self.scratch_page, np.int32)
        row[:len(pages)] = pages
        return row

    # ------------------------------------------------------------ decode steps of B sequences

    def decode(self, rows: list[DecodeRow]) -> np.ndarray:
        """One decode step of len(rows) sequences -> their sampled tokens (int32, in row order);
        the raw logits of the rows that ask for logprobs in raw_logits (by row index)."""
        B = len(rows)
        if not 1 <= B <= self.max_batch:
            raise ParameterError(f"a decode step takes 1 to {self.max_batch} sequences, got {B}")
        Bb = batch_bucket(B, self.max_batch)
        longest = max(r.pos for r in rows) + 1
        if longest > self.n_ctx:
            raise ParameterError(f"position {longest - 1} is past the context of {self.n_ctx}")
        queued, self.queued = self.queued, None
        if queued is not None:
            if queued.continued_by(rows):
                self.ahead_taken += 1
                return self._take_queued(queued, rows)
            self.ahead_dropped += 1
            self.batch_replays.wait(queued.ticket)  # dropped: its K/V rows are rewritten before they are read
        greedy = all(r.params.greedy for r in rows)
        penalty = any(r.params.penalized for r in rows)
        want = [b for b, r in enumerate(rows) if r.logprobs]
        keep = bool(want) and penalty  # the penalty rewrites the logits in place: copy them first
        self._stage(rows, Bb, penalty)
        plan = self.m.plan.decode_step(longest, 1, Bb)
        key = (Bb, plan.ctx_bucket, greedy, penalty, keep)
        graph = self.batch_graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._batch_launches(plan, Bb, greedy, penalty, keep)
            if self.use_graphs and self.graph_disabled is None:
                self._capture_batch(key, plan, Bb, greedy, penalty, keep)
        s = self.m.ctx.nb_stream
        self.last_step = plan
        if self.lookahead and not (penalty or want) and self.graph_disabled is None:
            ticket = self.batch_replays.fetch(None, B)
            self._queue_next(key, plan, Bb, rows, [np.asarray(r.pages) for r in rows])
            return self._collected(ticket, B)
        self.m.ctx.d2h(self.host_outs, self.b_outs, Bb)
        raw = self.m.arena.get("raw_logits" if keep else "logits", (Bb, self.cfg.n_vocab))
        self.raw_logits = {b: raw[b].copy_to_host(stream=s) for b in want}
        self.m.ctx.sync()
        return self._checked_rows(np.array(self.host_outs[:B]))

    def _take_queued(self, q: Queued, rows: list[DecodeRow]) -> np.ndarray:
        """rows' step, already queued: unless a prompt chunk ran since, the pages listed since go
        into the device's tables (after the queued step, in stream order) and the step after it
        is queued; then the queued step's ids are read."""
        self.last_step = q.plan
        if not q.dirty:
            pages = q.pages
            if any(len(r.pages) != len(p) or not np.array_equal(r.pages, p) for r, p in zip(rows, pages)):
                self._check_tables(rows)
                pages = [np.asarray(r.pages) for r in rows]
                host = self.host_tables_ahead[self.table_flip]  # the other one may still feed a copy
                self.table_flip ^= 1
                self._fill_tables(host, pages, q.Bb)
                self.m.ctx.h2d(self.m.kv.tables, host, q.Bb)
            self._queue_next(q.key, q.plan, q.Bb, rows, pages)
        return self._collected(q.ticket, len(rows))

    def _queue_next(self, key, plan, Bb: int, rows: list[DecodeRow], pages: list) -> None:
        """Queue the step after rows' (the graph of key again, on the device's advanced inputs)
        where it is likely to run as queued: its longest position keeps the context bucket, every
        row's table (pages: what the device holds) lists the page its next position writes, and
        no row samples its last token (params.max_tokens) in rows' step."""
        longest = max(r.pos for r in rows) + 2
        graph = self.batch_graphs.get(key)
        if (graph is None or longest > self.n_ctx or self.m.plan.decode_step(longest, 1, Bb).ctx_bucket != key[1]
                or any(len(p) * PAGE_SIZE <= r.pos + 1 or r.n_sampled + 1 >= r.params.max_tokens
                       for r, p in zip(rows, pages))):
            return
        ticket = self.batch_replays.launch(graph, None, len(rows))
        # its rows' tokens are rows' step's ids, set when the host reads them (_collected)
        self.queued = Queued(key, plan, Bb, ticket, None, [r.pos + 1 for r in rows],
                             [r.n_sampled + 1 for r in rows], [r.params for r in rows], pages)

    def _collected(self, ticket: Ticket, B: int) -> np.ndarray:
        """The step's sampled ids from its ticket (checked); they are what the queued step continues."""
        try:
            out = self._checked_rows(self.batch_replays.collect_rows(ticket, B))
        except NumericalError:
            self._drop_queued()
            raise
        if self.queued is not None:
            self.queued.tokens = out
        self.raw_logits = {}
        return out

    def _checked_rows(self, out: np.ndarray) -> np.ndarray:
        bad = np.flatnonzero(out & NONFINITE_BIT)
        if len(bad):
            raise NumericalError(f"the model produced NaN or inf logits for {len(bad)} of {len(out)} sequences "
                                 f"in a decode step on the GPU; its weights are broken or its numerics overflowed")
        return out

    def decode_logits(self, rows: list[DecodeRow]) -> np.ndarray:
        """A decode step's float32 logits (B, V) on the host, unsampled and eager (teacher forcing
        and tests); the rows' tokens go into their KV caches as in decode."""
        B = len(rows)
        if not 1 <= B <= self.max_batch:
            raise ParameterError(f"a decode step takes 1 to {self.max_batch} sequences, got {B}")
        Bb = batch_bucket(B, self.max_batch)
        self._drop_queued()
        self._stage(rows, Bb, False)
        plan = self.m.plan.decode_step(max(r.pos for r in rows) + 1, 1, Bb)
        logits = self._forward(plan, last_only=True).copy_to_host(stream=self.m.ctx.nb_stream)
        self.m.ctx.sync()
        return logits[:B]

    def _drop_queued(self) -> None:
        """Let a queued step finish and forget it, before the shared buffers change."""
        if self.queued is not None:
            self.ahead_dropped += 1
            self.batch_replays.wait(self.queued.ticket)
            self.queued = None

    def _stage(self, rows: list[DecodeRow], Bb: int, penalty: bool) -> None:
        """The step's inputs into the pinned staging buffers, then one copy each to the device."""
        self.m.ctx.sync()  # the staging buffers may still feed the last step's copies
        B = len(rows)
        ids, pos, steps, tables, params = (self.host_ids, self.host_pos, self.host_steps, self.host_tables,
                                           self.host_params)
        self._check_tables(rows)
        self._fill_tables(tables, [r.pages for r in rows], Bb)
        for b, r in enumerate(rows):
            ids[b], pos[b], steps[b] = r.token, r.pos, r.n_sampled
            params[b] = self._param_row(r.params)
        ids[B:Bb] = pos[B:Bb] = 0  # padding rows: token 0 at position 0, greedy, not advanced
        steps[B:Bb] = -1
        params[B:Bb] = self._param_row(PADDING)
        m, h2d = self.m, self.m.ctx.h2d
        h2d(m.ids, ids, Bb)
        h2d(m.pos, pos, Bb)
        h2d(m.kv.tables, tables, Bb)
        h2d(self.b_params, params, Bb)
        h2d(self.b_steps, steps, Bb)
        if penalty:
            self.host_hist[:Bb] = -1
            for b, r in enumerate(rows):
                if r.history is not None:
                    self.host_hist[b] = _ring(r.history)
            h2d(self.b_hist, self.host_hist, Bb)

    def _fill_tables(self, host: np.ndarray, pages: list, Bb: int) -> None:
        """host[:Bb] = each row's pages, the scratch page past them and on padding rows."""
        host[:Bb] = self.scratch_page
        for b, p in enumerate(pages):
            host[b, :len(p)] = p

    def _check_tables(self, rows: list[DecodeRow]) -> None:
        """ParameterError unless every row's block table lists at most max_pages pages in
        [0, n_pages) (one check over all rows: a step's staging runs every token)."""
        listed = np.concatenate([np.asarray(r.pages).ravel() for r in rows])
        if (max(len(r.pages) for r in rows) > self.max_pages
                or (len(listed) and (listed.min() < 0 or listed.max() >= self.n_pages))):
            raise ParameterError(f"a block table must list at most {self.max_pages} pages in [0, {self.n_pages})")

    def _param_row(self, params: SamplingParams) -> np.ndarray:
        """params' sampler row (sample_params'), validated once and kept: a step's rows mostly
        repeat the last step's parameters."""
        row = self.param_rows.get(params)
        if row is None:
            if len(self.param_rows) >= PARAM_ROWS_KEPT:
                self.param_rows.clear()
            row = self.param_rows[params] = sample_kernels.sample_params([params])[0]
        return row

    def _batch_launches(self, plan, Bb: int, greedy: bool, penalty: bool, keep: bool = False) -> None:
        """One decode step of Bb rows: the stack, the sampler, the non-finite flag (graph-safe);
        keep: the raw logits copied to the arena's raw_logits before the penalty."""
        logits = self._forward(plan, last_only=True)
        s = self.m.ctx.nb_stream
        outs, params, steps = self.b_outs[:Bb], self.b_params[:Bb], self.b_steps[:Bb]
        if keep:
            self.m.arena.get("raw_logits", logits.shape).copy_to_device(logits, stream=s)
        if penalty:
            sample_penalty.repeat_penalty(logits, self.b_hist[:Bb], params, s)
        if greedy:
            argmax.argmax(logits, outs, self.b_argmax, s)
        else:
            sample_kernels.sample(logits, params, steps, outs, self.b_scratch, s)
        if self.m.tp is not None:  # every rank goes on with rank 0's ids
            self.m.tp.broadcast(outs)
        # the live rows' ids, positions and counters advanced: the next step's input (look-ahead)
        step_state.advance_rows(outs, self.m.ids[:Bb], self.m.pos[:Bb], steps, s)
        flag_nonfinite(logits, outs, s)

    def _capture_batch(self, key, plan, Bb: int, greedy: bool, penalty: bool, keep: bool) -> None:
        self._capture_graph(lambda: self._batch_launches(plan, Bb, greedy, penalty, keep), self.batch_graphs,
                            key, f"batch decode graph ({Bb} rows)")

    @staticmethod
    def pool_bytes(cfg, kv_tokens: int) -> int:
        """The KV pool's device bytes for kv_tokens tokens (what a utilization budget sizes)."""
        return PagedKV.nbytes(cfg, kv_tokens + PAGE_SIZE)
