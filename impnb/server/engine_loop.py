"""One thread owns the LLMEngine (it is not thread-safe): it loads the model, takes requests and
aborts from a thread-safe queue, steps the engine while it has work, and hands each Delta to the
asyncio queue of the HTTP request it belongs to.

A request that a step cannot serve (an error inside the engine) fails with the others of that
step, and the engine is left with no sequence: the server keeps answering."""

import asyncio
import collections
import gc
import logging
import queue
import threading
import traceback
import weakref
from dataclasses import dataclass

from impnb.errors import ImpnbError
from impnb.sampling import SamplingParams
from impnb.server.metrics import Metrics

log = logging.getLogger("impnb.server")
IDLE_WAIT_S = 0.5  # how long the idle loop sleeps between looks at the stop flag


def freeze_heap() -> None:
    """Leave every object alive now (the model's, numba's, the modules') out of the garbage
    collector's scans from here on: they live as long as the server, and a full collection that
    walks them all stalls the engine thread and every stream at once."""
    gc.collect()
    gc.freeze()


class Mailbox:
    """What the engine thread hands to one event loop's queues. A wake-up of the loop drains
    everything posted since, so a step of B requests (or several steps while the loop is busy)
    costs one write to the loop's self-pipe, not one an item: those writes had been the engine
    thread's largest cost after the step itself."""

    _of_loop: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: collections.deque = collections.deque()
        self.pending = False  # a drain is scheduled and has not begun

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> "Mailbox":
        box = cls._of_loop.get(loop)
        if box is None:
            box = cls._of_loop[loop] = cls(loop)
        return box

    def post(self, out: asyncio.Queue, item) -> None:
        """Queue item for out (from any thread); FIFO across every queue of the loop."""
        self.items.append((out, item))
        if not self.pending:
            self.pending = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # its event loop has closed (the server is stopping): nobody listens
                self.items.clear()

    def _drain(self) -> None:
        # the flag first: an item posted while this runs schedules another drain, never waits
        self.pending = False
        items = self.items
        while items:
            out, item = items.popleft()
            out.put_nowait(item)


@dataclass
class Job:
    """One HTTP request: its engine requests (one per prompt and choice) share an asyncio queue,
    which receives ("added",) once all are queued, then Deltas and ("done", request_id,
    Completion) per request -- or an exception, which ends them all."""

    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue

    def __post_init__(self):
        self.box = Mailbox.of(self.loop)  # made on the loop's own thread, where the request arrives

    def put(self, item) -> None:
        self.box.post(self.out, item)


@dataclass
class Submit:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    logprobs: int | None
    job: Job


class EngineLoop:
    """load() -> an LLM (called on the engine thread); state is loading, ready, failed or stopped."""

    def __init__(self, load, metrics: Metrics):
        self.load = load
        self.metrics = metrics
        self.llm = None
        self.state = "loading"
        self.error: str | None = None
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: dict[str, Job] = {}  # engine request id -> its job (engine thread only)
        self.n_active = 0  # requests submitted and not yet finished, aborted or failed
        self.count_lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="impnb-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Abort what runs and end the thread."""
        self.stopping.set()
        self.commands.put(None)
        self.thread.join(timeout)

    # -- from the event loop --

    def submit(self, items: list[Submit]) -> None:
        """Queue requests; each is answered through its job (a ParameterError for a bad one)."""
        self._count(len(items))
        self.commands.put(("add", items))

    def _count(self, n: int) -> None:
        with self.count_lock:
            self.n_active += n

    def abort(self, request_ids: list[str]) -> None:
        """Stop and forget requests (their client left): their blocks are freed before the next step."""
        self.commands.put(("abort", request_ids))

    # -- the engine thread --

    def _run(self) -> None:
        try:
            self.llm = self.load()
        except BaseException as e:  # noqa: BLE001 - a failed load is reported, the server then exits
            self.error = str(e) if isinstance(e, ImpnbError) else f"{type(e).__name__}: {e}"
            self.state = "failed"
            if not isinstance(e, ImpnbError):
                log.error("loading the model failed:\n%s", traceback.format_exc())
            return
        self.state = "ready"
        engine = self.llm.engine
        self._report(engine)
        while not self.stopping.is_set():
            try:
                self._iterate(engine)
            except Exception as e:  # noqa: BLE001 - the requests in flight fail, the server goes on
                log.error("the engine failed; its requests end with an error:\n%s", traceback.format_exc())
                self._fail_all(engine, RuntimeError(f"the engine failed: {type(e).__name__}: {e}"))
        self._fail_all(engine, RuntimeError("the server is shutting down"))
        self.state = "stopped"

    def _iterate(self, engine) -> None:
        """Wait for work when idle; take every queued command; then run one step if there is work."""
        busy = engine.has_unfinished_requests() or bool(engine.ended)
        try:
            command = self.commands.get(block=not busy, timeout=IDLE_WAIT_S)
            while True:
                if command is not None:
                    self._command(engine, command)
                command = self.commands.get_nowait()
        except queue.Empty:
            pass
        if engine.has_unfinished_requests() or engine.ended:
            self._step(engine)

    def _fail_all(self, engine, error: Exception) -> None:
        """End every request with error and leave the engine empty."""
        for request_id in list(self.jobs):
            self.jobs.pop(request_id).put(error)
            self._count(-1)
        for request_id in list(engine.requests):
            engine.drop(request_id)
        self._report(engine)

    def _command(self, engine, command) -> None:
        kind, arg = command
        if kind == "abort":
            for request_id in arg:
                if self.jobs.pop(request_id, None) is not None:
                    engine.drop(request_id)
                    self._count(-1)
            self._report(engine)
            return
        added = []
        try:
            for s in arg:
                engine.add_request(s.prompt_ids, s.params, s.request_id, stop=s.stop, logprobs=s.logprobs)
                added.append(s.request_id)
                self.jobs[s.request_id] = s.job
        except Exception as e:  # noqa: BLE001 - a bad one (ImpnbError: a 400): none of the job's stays queued
            for request_id in added:
                self.jobs.pop(request_id, None)
                engine.drop(request_id)
            self._count(-len(arg))
            arg[0].job.put(e)
        else:
            arg[0].job.put(("added",))
        self._report(engine)

    def _step(self, engine) -> None:
        deltas = engine.step()
        self._report(engine)  # before any client hears of this step, so /metrics is never behind it
        for d in deltas:
            job = self.jobs.get(d.request_id)
            if job is None:  # aborted meanwhile
                engine.drop(d.request_id)
                continue
            if not d.finished:
                job.put(d)
                continue
            del self.jobs[d.request_id]
            self._count(-1)
            c = engine.completion(d.request_id)
            t = c.timing
            self.metrics.request_done(len(c.prompt_token_ids), len(c.token_ids), c.finish_reason,
                                      t.queued_s + t.prefill_s if c.token_ids else None, t.decode_s, t.total_s)
            job.put(d)
            job.put(("done", d.request_id, c))

    def _report(self, engine) -> None:
        s, b = engine.scheduler, engine.blocks
        self.metrics.engine_state(len(s.running), len(s.waiting), len(b.blocks) - b.n_free, b.n_free)
