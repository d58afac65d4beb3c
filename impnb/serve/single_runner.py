"""A single-sequence engine (reset / prefill / step, sampling inside: engine_cuda.CudaEngine, or
engine_cpu.CpuEngine) as a runner of batches of one.

The engine holds one sequence's K/V in its own cache, so the scheduler runs one sequence at a
time, its prompt in one step, with no prefix sharing; the pool it is given is the engine's
context in blocks. This is where a batched GPU runner plugs in instead (runners.make_runner).
"""

from impnb.serve.runner import ModelRunner, StepInput, StepOutput


class SingleSequenceRunner(ModelRunner):
    max_num_seqs = 1
    chunked_prefill = False
    prefix_caching = False

    def __init__(self, engine, block_size: int = 16):
        self.engine = engine
        self.device = engine.device
        self.block_size = block_size
        self.n_blocks = -(-engine.n_ctx // block_size)
        self.n_vocab = getattr(getattr(engine, "cfg", None), "n_vocab", None)
        self.current = None  # the sequence whose K/V the engine holds

    def execute(self, step: StepInput) -> StepOutput:
        (rows,) = step.rows
        if rows.start == 0:  # a new sequence: the whole prompt, then its first token
            self.engine.reset(rows.params)
            self.current = rows.seq_id
            token = self.engine.prefill(rows.token_ids.tolist())
        else:
            assert rows.seq_id == self.current and len(rows.token_ids) == 1, (rows.seq_id, self.current)
            assert self.engine.pos == rows.start, (self.engine.pos, rows.start)
            token = self.engine.step(int(rows.token_ids[0]))
        return StepOutput(tokens=[token])

    def finished(self, seq_id: int) -> None:
        if seq_id == self.current:
            self.current = None
