"""The batched CUDA engine (engine_batch.CudaBatchEngine) as a model runner: a step's decode rows
(one token each) run as one batched decode step sampled on the GPU, its prompt chunks one
sequence at a time into that sequence's pages. The scheduler's blocks are the engine's pages
(block_size = PAGE_SIZE). Rows that ask for logprobs get their raw logits back with the token.
With the engine's look-ahead, the scheduler lists each decode row's next page a step early
(lookahead_tokens), so the step the engine queues ahead has the page it writes."""

from impnb.engine_batch import CudaBatchEngine, DecodeRow
from impnb.serve.runner import ModelRunner, StepInput, StepOutput


class CudaBatchRunner(ModelRunner):
    device = "cuda"
    logits_on_request = True

    def __init__(self, engine: CudaBatchEngine):
        self.engine = engine
        self.cfg = engine.cfg
        self.n_vocab = engine.cfg.n_vocab
        self.block_size = engine.m.kv.k[0].shape[1]
        self.n_blocks = engine.n_pages
        self.max_num_seqs = engine.max_batch
        self.lookahead_tokens = 1 if engine.lookahead else 0  # the queued step's position

    def execute(self, step: StepInput) -> StepOutput:
        """Tokens of the sampled rows in step order: prompt chunks first as they come, then one
        decode step of every single-token row (a sampled row's token; the others' are dropped)."""
        tokens, raw = {}, {}
        singles = [r for r in step.rows if len(r.token_ids) == 1]
        for r in step.rows:
            if len(r.token_ids) > 1:
                tokens[r.seq_id] = self.engine.prefill_seq(r.token_ids, r.start, r.block_table, r.params,
                                                           r.n_sampled, r.history, r.sample, r.logprobs)
                raw[r.seq_id] = self.engine.raw_logits.get(0)
        if singles:
            out = self.engine.decode([DecodeRow(int(r.token_ids[0]), r.start, r.block_table, r.params,
                                                r.n_sampled, r.history, r.logprobs) for r in singles])
            tokens.update((r.seq_id, int(t)) for r, t in zip(singles, out))
            raw.update((r.seq_id, self.engine.raw_logits.get(b)) for b, r in enumerate(singles))
        sampled = [r for r in step.rows if r.sample]
        return StepOutput(tokens=[tokens[r.seq_id] for r in sampled],
                          logprob_logits=[raw[r.seq_id] for r in sampled])
