"""The scheduler and block manager under random traffic, on a runner whose "model" is a hash of
what it reads back through each block table: any K/V a neighbour overwrote, any block shared when
it should not be, changes the tokens. Requests arrive, abort and compete for a small pool; every
one must produce what it produces alone, and the pool's counts must hold after every step."""

import hashlib
import random

import numpy as np
import pytest

from impnb.sampling import SamplingParams
from impnb.serve.engine import LLMEngine
from impnb.serve.runner import ModelRunner, StepOutput
from impnb.serve.sequence import Status

V = 40  # token 0 ends generation
N_CTX = 48


class ReadBackRunner(ModelRunner):
    """Writes each row's token id into its slot; the next token of a sampled sequence is a hash
    of the ids it reads back at positions 0..end-1 through its block table."""

    device = "cpu"

    def __init__(self, n_blocks, block_size, engine_ref):
        self.n_blocks, self.block_size = n_blocks, block_size
        self.slots = np.full((n_blocks, block_size), -1, np.int64)
        self.engine_ref = engine_ref  # the engine, to check that written blocks are not shared

    def execute(self, step):
        tokens = []
        bs = self.block_size
        blocks = self.engine_ref[0].blocks.blocks
        for r in step.rows:
            pos = np.arange(r.start, r.start + len(r.token_ids))
            written = r.block_table[pos // bs]
            assert all(blocks[b].ref_count == 1 for b in written), "a write into a shared block"
            self.slots[written, pos % bs] = r.token_ids
            end = pos[-1] + 1
            every = np.arange(end)
            seen = self.slots[r.block_table[every // bs], every % bs]
            if r.sample:
                tokens.append(int.from_bytes(hashlib.blake2b(seen.tobytes(), digest_size=4).digest(), "little") % V)
        return StepOutput(tokens=tokens)


class EOG:
    eog_ids = frozenset({0})
    vocab_size = V

    def stream(self):
        return self

    def push(self, token):
        return ""

    def flush(self):
        return ""


def make_engine(kv_tokens, block_size, budget, max_seqs, prefix_caching=True, lookahead=0):
    ref = []
    runner = ReadBackRunner(-(-kv_tokens // block_size), block_size, ref)
    runner.lookahead_tokens = lookahead  # decodes list their next position's block early where free
    engine = LLMEngine(runner, EOG(), N_CTX, max_seqs, budget, prefix_caching)
    ref.append(engine)
    return engine


def check_pool(engine):
    """Every block's ref count is the number of live sequences holding it; free means count 0."""
    holders = {}
    for seq in engine.scheduler.running:
        assert seq.status is Status.RUNNING and len(seq.block_table) * engine.blocks.block_size >= seq.n_computed
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    for seq in engine.scheduler.waiting:
        assert not seq.block_table
    for block in engine.blocks.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), block.block_id
        assert (block.block_id in engine.blocks.free) == (block.ref_count == 0)


def traffic(seed):
    """(arrival step, prompt, max_tokens, abort step or None) for 40 requests, many sharing prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, V) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    out = []
    for _ in range(40):
        prompt = (rng.choice(prefixes) if rng.random() < 0.6 else []) + [rng.randrange(1, V) for _ in
                                                                          range(rng.randrange(1, 15))]
        prompt = prompt[:N_CTX - 1]
        arrival = rng.randrange(0, 60)
        abort = arrival + rng.randrange(0, 20) if rng.random() < 0.15 else None
        out.append((arrival, prompt, rng.randrange(1, 40), abort))
    return out


def alone(prompt, max_tokens):
    engine = make_engine(4 * N_CTX, 4, 64, 1)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens))
    while engine.has_unfinished_requests():
        engine.step()
    result = engine.completion(rid)
    return result.token_ids, result.finish_reason


@pytest.mark.parametrize("lookahead", [0, 1])
@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_gives_each_request_its_own_output(seed, lookahead):
    rng = random.Random(100 + seed)
    block_size = rng.choice([1, 2, 4, 8])
    engine = make_engine(N_CTX + rng.randrange(0, 3 * N_CTX), block_size, rng.randrange(4, 80),
                         rng.randrange(1, 10), prefix_caching=seed % 3 != 2, lookahead=lookahead)
    requests = traffic(seed)
    ids, step = {}, 0
    while step < 60 or engine.has_unfinished_requests():
        for i, (arrival, prompt, max_tokens, abort) in enumerate(requests):
            if arrival == step:
                ids[i] = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens))
            if abort == step and i in ids:
                engine.abort(ids[i])
        engine.step()
        check_pool(engine)
        step += 1
        assert step < 5000
    preempted = hits = 0
    for i, (arrival, prompt, max_tokens, abort) in enumerate(requests):
        result = engine.completion(ids[i])
        preempted += result.n_preempted
        hits += result.n_cached_tokens
        want, reason = alone(prompt, max_tokens)
        if result.finish_reason == "abort":
            assert abort is not None and result.token_ids == want[:len(result.token_ids)]
        else:
            assert (result.token_ids, result.finish_reason) == (want, reason), i
    assert engine.blocks.n_free == len(engine.blocks.blocks)
    print(f"seed {seed}: block size {block_size}, {step} steps, {preempted} preemptions, {hits} cached tokens")


def computed(step):
    """Apply a step as the engine does: tokens computed; a sampled sequence gets token 1."""
    for seq, n in step.work:
        seq.n_computed += n
        if seq.n_pending == 0:
            seq.token_ids.append(1)


def test_decodes_go_first_and_the_newest_is_preempted():
    from impnb.serve.block_manager import BlockManager
    from impnb.serve.scheduler import Scheduler, SchedulerConfig
    from impnb.serve.sequence import Sequence

    blocks = BlockManager(6, 4, prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8), blocks)
    a, b, c = (Sequence([2] * n, SamplingParams(), str(i)) for i, n in enumerate((7, 5, 12)))
    for s in (a, b, c):
        sched.add(s)
    step = sched.schedule()  # a whole, then the first token of b's prompt; c waits for budget
    assert [(s.request_id, n) for s, n in step.work] == [("0", 7), ("1", 1)]
    computed(step)
    step = sched.schedule()  # a's decode first, then b's next chunk, then c's first chunk
    assert [(s.request_id, n) for s, n in step.work] == [("0", 1), ("1", 4), ("2", 3)]
    computed(step)
    assert blocks.n_free == 6 - 2 - 2 - 1
    # a's decode takes the last free block; c's next chunk needs two: c, the newest, gives back its own
    step = sched.schedule()
    assert [(s.request_id, n) for s, n in step.work] == [("0", 1), ("1", 1)] and step.preempted == [c]
    assert c.status is Status.WAITING and c.n_computed == 0 and not c.block_table
    assert sched.waiting[0] is c


def test_a_decode_lists_its_next_block_early_where_the_pool_spares_it():
    """lookahead 1: a decode whose next position starts a block takes that block too, unless the
    pool would then hold fewer free blocks than running sequences, or the context ends first."""
    from impnb.serve.block_manager import BlockManager
    from impnb.serve.scheduler import Scheduler, SchedulerConfig
    from impnb.serve.sequence import Sequence

    blocks = BlockManager(5, 4, prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, lookahead=1, max_len=12), blocks)
    a = Sequence([2] * 6, SamplingParams(), "a")
    sched.add(a)
    computed(sched.schedule())  # the prompt: 2 blocks; a's decode at position 6 needs no new block
    computed(sched.schedule())  # position 6 (block 1); the next, 7, is in block 1 too
    assert len(a.block_table) == 2
    step = sched.schedule()  # position 7: the next one, 8, starts block 2, taken now
    assert [n for _, n in step.work] == [1] and len(a.block_table) == 3 and blocks.n_free == 2
    computed(step)
    for _ in range(3):  # positions 8..10 in block 2; at 11 the next would be 12, past max_len
        computed(sched.schedule())
    assert len(a.block_table) == 3
    sched.finish(a, "length")
    b, c = Sequence([2] * 7, SamplingParams(), "b"), Sequence([2] * 11, SamplingParams(), "c")
    sched.add(b)
    sched.add(c)
    computed(sched.schedule())  # the prompts: 2 + 3 blocks, none free left
    assert (len(b.block_table), len(c.block_table), blocks.n_free) == (2, 3, 0)
    step = sched.schedule()  # b at position 7 would take block 2 early: none is free, nothing preempted
    assert [s.request_id for s, _ in step.work] == ["b", "c"] and not step.preempted
    assert len(b.block_table) == 2 and not sched.waiting


def test_an_older_sequence_takes_the_blocks_of_the_newest():
    from impnb.serve.block_manager import BlockManager
    from impnb.serve.scheduler import Scheduler, SchedulerConfig
    from impnb.serve.sequence import Sequence

    blocks = BlockManager(4, 4, prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), blocks)
    old, new = Sequence([2] * 8, SamplingParams()), Sequence([2] * 7, SamplingParams())
    sched.add(old)
    sched.add(new)
    computed(sched.schedule())  # all four blocks held; old's 9th token needs a fifth
    step = sched.schedule()
    assert [s for s, _ in step.work] == [old] and step.preempted == [new]
    assert sched.running == [old] and list(sched.waiting) == [new] and blocks.n_free == 1


def test_a_request_that_does_not_fit_waits_and_nothing_overtakes_it():
    from impnb.serve.block_manager import BlockManager
    from impnb.serve.scheduler import Scheduler, SchedulerConfig
    from impnb.serve.sequence import Sequence

    blocks = BlockManager(4, 4, prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), blocks)
    big, small = Sequence([3] * 9, SamplingParams()), Sequence([3] * 2, SamplingParams())
    running = Sequence([3] * 6, SamplingParams())
    sched.add(running)
    computed(sched.schedule())  # 2 blocks held
    sched.add(big)  # needs 3 blocks, 2 are free
    sched.add(small)
    step = sched.schedule()
    assert [s for s, _ in step.work] == [running] and list(sched.waiting) == [big, small]
    sched.finish(running, "length")
    step = sched.schedule()
    assert [s for s, _ in step.work] == [big, small] and not sched.waiting
