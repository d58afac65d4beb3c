"""parallel/mirror.py: rank 0's runner calls reach every follower in order (a real StepInput,
pickled over TCP), the followers stop when rank 0 closes, a follower that never connects is one
ParallelError by the deadline, and an error the runner raises on a follower (the same rank 0's
engine reports) does not stop it."""

import threading

import numpy as np
import pytest

from impnb.errors import NumericalError, ParallelError
from impnb.parallel import mirror
from impnb.parallel.rendezvous import free_port
from impnb.sampling import SamplingParams
from impnb.serve.runner import SequenceRows, StepInput, StepOutput


class Recording:
    n_blocks, block_size = 64, 16

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def execute(self, step):
        self.calls.append(("execute", step))
        if len(self.calls) == self.fail_at:
            raise NumericalError("NaN logits")
        return StepOutput(tokens=[7] * sum(r.sample for r in step.rows))

    def finished(self, seq_id):
        self.calls.append(("finished", seq_id))


def step(seed: int) -> StepInput:
    rng = np.random.default_rng(seed)
    rows = [SequenceRows(b, rng.integers(0, 500, n).astype(np.int32), int(rng.integers(0, 90)),
                         rng.permutation(19)[:5].astype(np.int32), bool(b % 2), SamplingParams(temperature=0.7, seed=b),
                         int(rng.integers(0, 9)), rng.integers(0, 500, 3).astype(np.int32) if b else None)
            for b, n in enumerate((1, 37, 1, 5))]
    return StepInput(rows)


def test_followers_run_rank_0s_calls_in_order():
    port, world = free_port(), 3
    followers = {r: Recording(fail_at=2 if r == 2 else None) for r in (1, 2)}
    counts, errors = {}, []

    def rank(r):
        try:
            counts[r] = mirror.follow(followers[r], mirror.connect_leader(r, "127.0.0.1", port, 20.0))
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    leader = Recording()
    runner = mirror.MirroredRunner(leader, mirror.accept_followers(world, "127.0.0.1", port, 20.0))
    assert runner.n_blocks == 64  # the runner's attributes pass through
    steps = [step(s) for s in range(4)]
    outs = [runner.execute(steps[0]), runner.execute(steps[1])]
    runner.finished(3)
    outs += [runner.execute(s) for s in steps[2:]]
    assert [len(o.tokens) for o in outs] == [2] * 4
    runner.close()
    for t in threads:
        t.join(20)
    assert not errors and counts == {1: 5, 2: 5}
    for f in followers.values():
        assert [c[0] for c in f.calls] == ["execute", "execute", "finished", "execute", "execute"]
        got = [c[1] for c in f.calls if c[0] == "execute"]
        for a, b in zip(got, steps):
            assert [r.seq_id for r in a.rows] == [r.seq_id for r in b.rows]
            for ra, rb in zip(a.rows, b.rows):
                assert np.array_equal(ra.token_ids, rb.token_ids) and np.array_equal(ra.block_table, rb.block_table)
                assert (ra.start, ra.sample, ra.params, ra.n_sampled) == (rb.start, rb.sample, rb.params, rb.n_sampled)
        assert f.calls[2] == ("finished", 3)


def test_a_follower_that_never_connects():
    with pytest.raises(ParallelError, match=r"rank\(s\) 1 did not follow within 0.4 s"):
        mirror.accept_followers(2, "127.0.0.1", free_port(), 0.4)
    with pytest.raises(ParallelError, match="could not reach rank 0"):
        mirror.connect_leader(1, "127.0.0.1", free_port(), 0.4)
