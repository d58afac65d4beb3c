"""The server's engine thread (impnb/server/engine_loop.py) on a tiny model, without HTTP: requests
in, deltas and completions out, aborts, a bad request refused alone, and an engine step that
raises failing only the requests in flight."""

import asyncio

import pytest

pytest.importorskip("fastapi")

from impnb.errors import ParameterError  # noqa: E402
from impnb.sampling import SamplingParams  # noqa: E402
from impnb.server.engine_loop import EngineLoop, Job, Submit  # noqa: E402
from impnb.server.metrics import Metrics  # noqa: E402
from tests.tiny_models import write_tiny_model  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from impnb import LLM

    path = write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama")
    engine_loop = EngineLoop(lambda: LLM(str(path), device="cpu", n_ctx=64), Metrics("tiny"))
    engine_loop.start()
    yield engine_loop
    engine_loop.stop(timeout=30)
    assert engine_loop.state == "stopped"


async def drain(loop, submits, leave_after=None):
    """Everything the job's queue receives until each request is done (or the first exception)."""
    job = submits[0].job
    loop.submit(submits)
    items, done = [], set()
    while len(done) < len(submits):
        item = await asyncio.wait_for(job.out.get(), 60)
        items.append(item)
        if isinstance(item, Exception):
            break
        if isinstance(item, tuple) and item[0] == "done":
            done.add(item[1])
        if leave_after is not None and len(items) > leave_after:
            loop.abort([s.request_id for s in submits])
            break
    return items


def submits(n, prompt=(5, 6, 7), stop=(), logprobs=None, prefix="r"):
    job = Job(asyncio.get_running_loop(), asyncio.Queue())
    return [Submit(f"{prefix}{i}", list(prompt), GREEDY, stop, logprobs, job) for i in range(n)]


def wait_idle(loop):
    import time

    for _ in range(200):
        e = loop.llm.engine
        if not e.has_unfinished_requests() and not loop.jobs and loop.n_active == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"not idle: {loop.n_active} active")


def test_requests_stream_deltas_then_completions(loop):
    async def main():
        return await drain(loop, submits(3, prefix="a"))

    items = asyncio.run(main())
    assert items[0] == ("added",)
    done = [i for i in items if isinstance(i, tuple) and i[0] == "done"]
    assert sorted(d[1] for d in done) == ["a0", "a1", "a2"]
    assert all(len(d[2].token_ids) == 6 for d in done)
    wait_idle(loop)
    blocks = loop.llm.engine.blocks
    assert blocks.n_free == len(blocks.blocks)


def test_a_bad_request_is_refused_with_its_job_and_nothing_stays(loop):
    async def main():
        s = submits(2, prefix="b")
        s[1] = Submit("b1", [10**6], GREEDY, (), None, s[0].job)  # not a token id
        return await drain(loop, s)

    items = asyncio.run(main())
    assert isinstance(items[0], ParameterError)
    wait_idle(loop)


def test_an_abort_frees_the_sequence(loop):
    async def main():
        return await drain(loop, submits(1, prefix="c"), leave_after=2)

    asyncio.run(main())
    wait_idle(loop)
    blocks = loop.llm.engine.blocks
    assert blocks.n_free == len(blocks.blocks)


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(loop, monkeypatch):
    engine = loop.llm.engine
    real_step = engine.step
    calls = []

    def failing_step():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)

    async def main():
        return await drain(loop, submits(2, prefix="d"))

    items = asyncio.run(main())
    assert isinstance(items[-1], RuntimeError) and "boom" in str(items[-1])
    wait_idle(loop)
    assert not engine.requests
    monkeypatch.setattr(engine, "step", real_step)

    async def again():
        return await drain(loop, submits(1, prefix="e"))

    assert any(isinstance(i, tuple) and i[0] == "done" for i in asyncio.run(again()))


def test_freeze_heap_leaves_the_objects_alive_now_out_of_collections():
    import gc

    from impnb.server.engine_loop import freeze_heap

    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= before + len(kept)
        scanned = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
        assert not any(id(x) in scanned for x in kept)  # frozen: in no generation a collection walks
    finally:
        gc.unfreeze()
