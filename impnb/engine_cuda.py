"""The CUDA engine: a DeviceModel, prompt chunks and single-token steps, sampling on the GPU.

A decode step replays the decode graph (the whole stack, the sampler and a kernel that makes the
sampled id, position and step the next step's input, captured once after one eager warm-up
step) and copies 4 bytes back. With lookahead the next step is queued before the host reads
this one's token, so the GPU never waits on Python; a caller that feeds back another token
(or prefills, resets) drops the queued step and uploads 12 bytes instead. Prompt chunks are
padded to a bucket and replay that bucket's graph (impnb/graphs/prefill.py). Without graphs
(`graphs=False`, or capture failed with its reason logged) the same launches run eagerly.
"""

import logging

import numpy as np

from impnb.errors import NumericalError, ParameterError
from impnb.gguf_file import ModelFile
from impnb.gpu.forward import forward
from impnb.gpu.context import GpuContext
from impnb.gpu.model import DeviceModel
from impnb.gpu.plan import StepPlan
from impnb.graphs import prefill as prefill_graphs
from impnb.graphs.capture import CaptureError, Graph
from impnb.graphs.replays import Replays
from impnb.kernels.sample import argmax
from impnb.kernels.attention import attention_decode
from impnb.kernels.sample import sample as sample_kernels
from impnb.kernels.sample import sample_penalty
from impnb.kernels.sample import step_state
from impnb.kernels.sample.nonfinite import NONFINITE_BIT, flag_nonfinite
from impnb.parallel.group import TensorParallel
from impnb.parallel.ranks import Rank
from impnb.sampling import SamplingParams

HISTORY = 64  # repetition-penalty window, tokens
log = logging.getLogger("impnb.engine")


class CudaEngine:
    """prefill(prompt ids) -> first token; step(token) -> next token (same API as CpuEngine)."""

    device = "cuda"
    owns_pages = True  # one sequence, every KV page in position order: sliding layers may keep a ring

    def __init__(self, mf: ModelFile, n_ctx: int, graphs: bool = True, lookahead: bool = True,
                 kv_tokens: int | None = None, max_seqs: int = 1, tp: Rank | None = None, tp_group=None,
                 chunk: int | None = None):
        """tp: this process's tensor-parallel rank (impnb/parallel/ranks.py): the engine then runs
        on GPU tp.local_rank with the rank's slices of the model, every rank in step (the same
        calls on each), and rank 0's sampled ids broadcast to the others. tp_group: a group
        already formed instead (the warm-up's dry run). chunk: the prompt tokens a forward call
        takes at most (default tuning.prefill_chunk's for the model)."""
        self.mf = mf
        ctx, group = None, tp_group
        if tp is not None:
            ctx = GpuContext(tp.local_rank)
            group = TensorParallel.join(tp, ctx)
        self.m = DeviceModel(mf, n_ctx, ctx=ctx, kv_tokens=kv_tokens, max_seqs=max_seqs, tp=group,
                             window_ring=self.owns_pages, chunk=chunk)
        self.use_graphs = graphs and not self.m.ctx.simulator
        self.graphs = {}  # (greedy, penalty, context bucket) -> Graph of one decode step
        self.prefill_graphs = {}  # bucket B -> Graph of one padded prompt chunk
        self.graph_disabled = None if self.use_graphs else "graphs off"
        self.cfg, self.n_ctx = self.m.cfg, n_ctx
        ctx = self.m.ctx
        cuda = ctx.cuda
        self.host_ids = cuda.pinned_array(len(self.m.ids), np.int32)
        self.host_pos = cuda.pinned_array(len(self.m.ids), np.int32)
        self.host_out = cuda.pinned_array(1, np.int32)
        self.host_step = cuda.pinned_array(1, np.int32)
        self.host_last = cuda.pinned_array(1, np.int32)
        self.host_len = cuda.pinned_array(1, np.int32)
        self.last_row = ctx.empty(1, np.int32)  # a padded chunk's last real row
        self.out_ids = ctx.empty(1, np.int32)
        self.step_no = ctx.empty(1, np.int32)
        self.history = ctx.empty((1, HISTORY), np.int32)
        self.params = ctx.empty((1, sample_kernels.NPARAM), np.float64)
        self.scratch = sample_kernels.sample_scratch(1, self.cfg.n_vocab)
        self.argmax_scratch = argmax.argmax_scratch(1)
        self.replays = None if self.m.ctx.simulator else Replays(self.m.ctx, self.out_ids)
        self.lookahead = lookahead  # hybrids too: a dropped step leaves the state's slot it read (gpu/recurrent.py)
        self.host_history = np.full((1, HISTORY), -1, np.int32)  # mirror of the device ring
        self.ahead = None  # the decode step queued on the device's own token, not yet read
        self.last_step = None  # the StepPlan of the last forward launched
        self.p = None
        self.pos = 0
        self.n_sampled = 0
        self.n_checked = 0  # sampled ids checked for the non-finite flag

    def reset(self, params: SamplingParams) -> None:
        self._drain()
        self.p = params
        self.m.ctx.h2d(self.params, sample_kernels.sample_params([params]))
        self.host_history = np.full((1, HISTORY), -1, np.int32)  # mirror of the device ring
        self.m.ctx.h2d(self.history, self.host_history)
        if self.m.rec is not None:  # a new sequence's recurrent state starts at zero
            self.m.rec.zero(self.m.ctx.nb_stream)
        self.pos = 0
        self.n_sampled = 0
        self.n_checked = 0

    def prefill(self, ids) -> int:
        self._drain()
        ids = np.asarray(ids, np.int32)
        if self.pos + len(ids) > self.n_ctx:
            raise ParameterError(f"{self.pos + len(ids)} tokens exceed the context of {self.n_ctx}")
        logits = None
        chunk = self.m.chunk
        for start in range(0, len(ids), chunk):
            logits = self._prefill_chunk(ids[start:start + chunk])
        if self.p.penalized:  # the prompt's tail into the ring, mirrored, one copy
            for t in ids[-HISTORY:]:
                self._sampled(int(t))
            self.history.copy_to_device(self.host_history, stream=self.m.ctx.nb_stream)
        return self._sample(logits)

    def step(self, token: int) -> int:
        # a graph per context bucket (its decode-attention kernel and split count), for this step
        # and the one queued after it
        bucket = self.m.plan.ctx_bucket(self.pos + 2)
        key = (self.p.greedy, self.p.penalized, bucket)
        graph = self.graphs.get(key)
        if graph is None:
            self._drain()
            plan = self.m.plan.decode_step(bucket)
            token = self._sample(self._run(np.array([token], np.int32), plan))  # eager; also warm-up
            if self.use_graphs and self.graph_disabled is None:
                self._capture(key, plan)
            return token
        if self.ahead is None or self.ahead.token != token:  # the device's chain is not ours
            self._drain()
            s = self.m.ctx.nb_stream
            self.host_ids[0], self.host_pos[0], self.host_step[0] = token, self.pos, self.n_sampled
            self.m.ids[:1].copy_to_device(self.host_ids[:1], stream=s)
            self.m.pos[:1].copy_to_device(self.host_pos[:1], stream=s)
            self.step_no.copy_to_device(self.host_step, stream=s)
            self.ahead = self.replays.launch(graph, token)
        current, self.ahead = self.ahead, None
        self.pos += 1
        if self.lookahead and self.pos < self.n_ctx:  # queue the next step on the device's token
            self.ahead = self.replays.launch(graph, None)
        token = self._sampled(self._checked(self.replays.collect(current)))
        if self.ahead is not None:
            self.ahead.token = token
        return token

    def _checked(self, token: int) -> int:
        """The sampled id; NumericalError, naming the step, where the sampler's logits held a
        NaN or inf (flag_nonfinite's bit)."""
        self.n_checked += 1
        if token & NONFINITE_BIT:
            step = "the prompt" if self.n_checked == 1 else f"generated token {self.n_checked}"
            raise NumericalError(f"the model produced NaN or inf logits at {step} on the GPU; its "
                                 f"weights are broken or its numerics overflowed")
        return token

    def _sampled(self, token: int) -> int:
        """Count a sampled token; mirror the history push the sampler made for it."""
        self.host_history[0, self.n_sampled % HISTORY] = token
        self.n_sampled += 1
        return token

    def _drain(self) -> None:
        """Drop a step queued ahead: its KV row and position are rewritten before they are read,
        and the history slot it pushed is restored from the host's mirror."""
        if self.ahead is not None:
            self.replays.collect(self.ahead)
            self.ahead = None
            if self.p.penalized:
                self.history.copy_to_device(self.host_history, stream=self.m.ctx.nb_stream)

    def _prefill_chunk(self, chunk: np.ndarray):
        """One prompt chunk -> logits (1, V) of its last token, padded to its bucket: the
        bucket's graph when captured, else the same launches eagerly (then, with graphs on,
        captured). A chunk with no bucket (its padded end would pass n_ctx) runs unpadded."""
        B = prefill_graphs.bucket(len(chunk), self.pos, self.n_ctx)
        if B is None:  # chunks of <= 8 rows take decode attention's split kernel, at any context
            return self._run(chunk, self.m.plan.prefill_step(len(chunk)))
        self.m.ctx.sync()  # the pinned staging buffers may still feed the last chunk's copies
        ids, pos = prefill_graphs.padded(chunk, self.pos, B)
        self.host_ids[:B], self.host_pos[:B], self.host_last[0] = ids, pos, len(chunk) - 1
        h2d = self.m.ctx.h2d
        h2d(self.m.ids, self.host_ids, B)
        h2d(self.m.pos, self.host_pos, B)
        h2d(self.last_row, self.host_last)
        if self.m.rec is not None:  # the recurrent layers' real rows: the padding leaves the state alone
            self.host_len[0] = len(chunk)
            h2d(self.m.rec.lengths, self.host_len)
        self.pos += len(chunk)
        graph = self.prefill_graphs.get(B)
        if graph is not None:
            graph.replay()
            return self.m.arena.get("logits", (1, self.cfg.n_vocab))
        plan = self.m.plan.prefill_step(B)
        logits = self._forward(plan, last_row=self.last_row)
        if self.use_graphs and self.graph_disabled is None:
            self._capture_graph(lambda: self._forward(plan, last_row=self.last_row),
                                self.prefill_graphs, B, f"prefill graph ({B} rows)")
        return logits

    def _capture(self, key, plan: StepPlan) -> None:
        """Capture one decode step (stack + sampler) for the current sampling configuration."""
        self._capture_graph(lambda: self._decode_launches(plan), self.graphs, key, "decode graph")

    def _capture_graph(self, body, pool: dict, key, what: str) -> None:
        """pool[key] = the graph of body(); on failure graphs go off, with the reason logged."""
        self.m.ctx.sync()
        self.m.arena.frozen = True
        try:
            pool[key] = Graph(self.m.ctx.handle, body)
            log.info("%s captured: %d nodes", what, pool[key].n_nodes)
        except (CaptureError, AssertionError) as e:
            self.graph_disabled = f"disable_due_to_capture_failure: {e}"
            log.warning("impnb: CUDA graphs off (%s); running eagerly", self.graph_disabled)
        finally:
            self.m.arena.frozen = False

    def _decode_launches(self, plan: StepPlan) -> None:
        """One graph-captured decode step: stack, sampler, and the device-side advance."""
        logits = self._forward(plan)
        self._sample_launches(logits)
        s = self.m.ctx.nb_stream
        step_state.advance(self.out_ids, self.m.ids[:1], self.m.pos[:1], self.step_no, s)
        flag_nonfinite(logits, self.out_ids, s)  # after advance: the next step's input stays clean

    def logits(self, ids) -> np.ndarray:
        """Feed ids at the next positions (one chunk) -> float32 logits of every one (T, V), on the host.
        A chunk of decode size takes decode attention as step() plans it for its context."""
        self._drain()
        ids = np.asarray(ids, np.int32)
        T, plan = len(ids), self.m.plan
        if not 0 < T <= self.m.chunk:
            raise ParameterError(f"logits takes 1 to {self.m.chunk} tokens at once, got {T}")
        if self.pos + T > self.n_ctx:
            raise ParameterError(f"{self.pos + T} tokens exceed the context of {self.n_ctx}")
        step = plan.decode_step(self.pos + T, T) if T <= attention_decode.MAX_T else plan.prefill_step(T)
        return self._run(ids, step, last_only=False).copy_to_host()

    def _run(self, chunk: np.ndarray, step: StepPlan, last_only: bool = True):
        T = len(chunk)
        assert step.n_tokens == T
        s = self.m.ctx.nb_stream
        self.m.ctx.sync()  # the pinned staging buffers may still feed earlier copies
        self.host_ids[:T] = chunk
        self.host_pos[:T] = np.arange(self.pos, self.pos + T, dtype=np.int32)
        self.m.ids[:T].copy_to_device(self.host_ids[:T], stream=s)
        self.m.pos[:T].copy_to_device(self.host_pos[:T], stream=s)
        self.pos += T
        return self._forward(step, last_only)

    def _forward(self, step: StepPlan, last_only: bool = True, last_row=None):
        """The stack for one step; the plan it ran kept in last_step (for tests and profiles)."""
        self.last_step = step
        return forward(self.m, step, last_only, last_row)

    def _sample(self, logits) -> int:
        s = self.m.ctx.nb_stream
        self.host_step[0] = self.n_sampled
        self.m.ctx.h2d(self.step_no, self.host_step)
        self._sample_launches(logits)
        flag_nonfinite(logits, self.out_ids, s)
        self.m.ctx.d2h(self.host_out, self.out_ids)
        self.m.ctx.sync()
        return self._sampled(self._checked(int(self.host_out[0])))

    def _sample_launches(self, logits) -> None:
        """The sampler's kernels: logits (1, V) -> self.out_ids, history updated (graph-safe)."""
        s = self.m.ctx.nb_stream
        if self.p.penalized:
            sample_penalty.repeat_penalty(logits, self.history, self.params, s)
        if self.p.greedy:
            argmax.argmax(logits, self.out_ids, self.argmax_scratch, s)
        else:
            sample_kernels.sample(logits, self.params, self.step_no, self.out_ids, self.scratch, s)
        if self.m.tp is not None:  # every rank goes on with rank 0's id (their logits agree anyway)
            self.m.tp.broadcast(self.out_ids)
        if self.p.penalized:
            sample_penalty.push_history(self.out_ids, self.step_no, self.history, s)
