"""impnb's server with a runner that costs nothing: the scheduler, block manager, detokenizer,
engine thread and HTTP layer alone, so that `impnb bench-serve` against it measures what the host
side can stream (tokens a second, and the time to the first token) before any GPU work.

    python scripts/serve_host_ceiling.py [-m smollm2-135m] [--port 8123] [--max-seqs 128]
    python -m impnb bench-serve --url http://127.0.0.1:8123 --model m --concurrency 1,32,128

The runner samples random ids in [200, 10000) (text for any common vocabulary); the model's file
gives the tokenizer only."""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
from impnb.serve.engine import LLMEngine  # noqa: E402
from impnb.serve.runner import ModelRunner, StepOutput  # noqa: E402
from impnb.tokenizer import Tokenizer  # noqa: E402


class NullRunner(ModelRunner):
    """Samples every sampled row's token at once, from a seeded generator."""

    device = "null"
    block_size = 16
    n_blocks = 1 << 16

    def __init__(self, n_vocab: int):
        self.n_vocab = n_vocab
        self.rng = np.random.default_rng(0)

    def execute(self, step):
        n = sum(1 for r in step.rows if r.sample)
        return StepOutput(tokens=[int(t) for t in self.rng.integers(200, 10000, n)], logprob_logits=[None] * n)


class NullLLM:
    """What the server reads of an LLM: the file, the tokenizer, the engine."""

    def __init__(self, path: str, n_ctx: int, max_seqs: int):
        self.mf = open_model_file(path)
        self.tokenizer = Tokenizer.from_metadata(self.mf.metadata)
        self.device = NullRunner.device
        runner = NullRunner(len(self.mf.metadata["tokenizer.ggml.tokens"]))
        self.engine = LLMEngine(runner, self.tokenizer, n_ctx, max_seqs)


def main() -> int:
    import uvicorn

    from impnb.server.app import Server, ServerConfig, build_app
    from impnb.server.engine_loop import EngineLoop
    from impnb.server.metrics import Metrics

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="smollm2-135m", help="a name or .gguf path (its tokenizer)")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--max-seqs", type=int, default=128)
    p.add_argument("--ctx", type=int, default=1024)
    args = p.parse_args()
    path = str(resolve_model(args.model))
    metrics = Metrics("m")
    loop = EngineLoop(lambda: NullLLM(path, args.ctx, args.max_seqs), metrics)
    server = Server(ServerConfig("m"), loop, metrics)
    config = uvicorn.Config(build_app(server), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
