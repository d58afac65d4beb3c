"""The generation loop shared by every engine: prefill, decode until EOG or a limit, stream text."""

import time
from dataclasses import dataclass
from typing import Callable

from impnb.sampling import SamplingParams


@dataclass
class Stats:
    n_prompt: int
    prefill_s: float
    n_gen: int = 0
    decode_s: float = 0.0
    stop: str = "length"  # eog, length or context

    def line(self) -> str:
        prefill = self.n_prompt / self.prefill_s if self.prefill_s else 0.0
        steps = max(self.n_gen - 1, 0)
        decode = steps / self.decode_s if self.decode_s else 0.0
        return (f"prompt {self.n_prompt} tokens, prefill {prefill:.1f} tok/s | "
                f"generated {self.n_gen} tokens, decode {decode:.1f} tok/s | stop: {self.stop}")


def generate(engine, tokenizer, prompt_ids: list[int], max_tokens: int, params: SamplingParams,
             emit: Callable[[str], None]) -> tuple[list[int], Stats]:
    """Run prompt_ids through engine and emit text as tokens arrive; returns (tokens, stats)."""
    engine.reset(params)
    stream = tokenizer.stream()
    t0 = time.perf_counter()
    token = engine.prefill(prompt_ids)
    stats = Stats(len(prompt_ids), time.perf_counter() - t0)
    out = []
    t1 = time.perf_counter()
    while True:
        if token in tokenizer.eog_ids:
            stats.stop = "eog"
            break
        out.append(token)
        emit(stream.push(token))
        if len(out) >= max_tokens:
            break
        if engine.pos >= engine.n_ctx:
            stats.stop = "context"
            break
        token = engine.step(token)
    stats.n_gen, stats.decode_s = len(out), time.perf_counter() - t1
    emit(stream.flush())
    return out, stats
