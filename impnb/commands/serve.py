"""`python -m impnb serve`: the OpenAI-compatible HTTP server (impnb/server) under uvicorn.

The model file, the device and (on the GPU) the kernel build are checked and done first, in the
main thread (the build forks compile processes, which a process with server threads should not);
then the port opens and /health answers 503 until the model is loaded on the engine thread. A
model that fails to load stops the server with one error line and exit status 2. SIGTERM or
SIGINT stop accepting connections, give running requests the grace period to finish, abort the
rest and exit 0."""

import sys
import threading
import time

from impnb.errors import ImpnbError, ParameterError
from impnb.model_registry import resolve_model
from impnb.serve.engine import check_positive
from impnb.serve.pool_size import check_fraction


def _check(args) -> None:
    if not 0 <= args.port < 65536:
        raise ParameterError(f"--port must be in [0, 65535], got {args.port}")
    for name in ("max_seqs", "max_num_batched_tokens", "ctx", "kv_cache_tokens"):
        value = getattr(args, name)
        if value is not None:
            check_positive(f"--{name.replace('_', '-')}", value)
    if args.max_waiting is not None and args.max_waiting < 0:
        raise ParameterError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if args.grace < 0:
        raise ParameterError(f"--grace must be >= 0, got {args.grace}")
    check_fraction("--gpu-memory-utilization", args.gpu_memory_utilization)


def _imports():
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise ImpnbError(f"serve needs FastAPI and uvicorn ({e}): pip install 'impnb[serve]'") from None
    return uvicorn


def _server_class(uvicorn):
    class Server(uvicorn.Server):
        """uvicorn's server, except that a stop signal, once handled, ends in exit status 0
        (uvicorn raises the signal again after its graceful shutdown)."""

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return Server


def _follow(path, args) -> int:
    """A tensor-parallel rank other than 0: the same runner on its GPU, running rank 0's steps
    (parallel/mirror.py) until rank 0 ends; no server of its own."""
    from impnb.parallel.mirror import connect_leader, follow
    from impnb.serve.llm import LLM

    rank = args.rank
    llm = LLM(str(path), device="cuda", n_ctx=args.ctx, kv_cache_tokens=args.kv_cache_tokens,
              gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, graphs=not args.no_graphs, tp=rank)
    n = follow(llm.engine.runner, connect_leader(rank.rank, rank.addr, rank.port + 1, rank.timeout))
    print(f"impnb: tensor-parallel rank {rank.rank}: {n} calls followed", file=sys.stderr)
    return 0


def _prepare_device(path, args) -> None:
    """Validate the model and the device; on the GPU build the model's kernels into the cache."""
    from impnb.devices import engine_class
    from impnb.gguf_file import open_model_file
    from impnb.models.validate import validate_model

    mf = open_model_file(path)
    cfg = validate_model(mf)
    args.device = engine_class(args.device, cfg.arch, cfg).device  # auto decided (and said) once
    rank = getattr(args, "rank", None)
    if rank is not None and args.device != "cuda":
        raise ParameterError(f"--tp {rank.world} needs the GPU (device {args.device})")
    if args.device == "cuda":
        from impnb.warmup import prepare

        prepare(mf, min(args.ctx, cfg.n_ctx), tp_world=rank.world if rank else 1)


def run(args) -> int:
    _check(args)
    uvicorn = _imports()
    path = resolve_model(args.model)  # an unknown name or a missing file fails before the port opens
    rank = getattr(args, "rank", None)
    if rank is not None and not rank.leader:
        return _follow(path, args)
    _prepare_device(path, args)
    mirrors = []  # rank 0's runner sending its steps to the other ranks (tensor parallelism)
    from impnb.server.app import Server, ServerConfig, build_app
    from impnb.server.engine_loop import EngineLoop, freeze_heap
    from impnb.server.metrics import Metrics

    def load():
        from impnb.serve.llm import LLM

        llm = LLM(str(path), device=args.device, n_ctx=args.ctx, kv_cache_tokens=args.kv_cache_tokens,
                  gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, graphs=not args.no_graphs, tp=rank)
        if rank is not None:
            from impnb.parallel.mirror import MirroredRunner, accept_followers

            conns = accept_followers(rank.world, rank.addr, rank.port + 1, rank.timeout)
            llm.engine.runner = MirroredRunner(llm.engine.runner, conns)
            mirrors.append(llm.engine.runner)
        freeze_heap()
        print(f"impnb: serving {name} ({llm.device}, context {llm.engine.n_ctx}, "
              f"{llm.engine.scheduler.config.max_num_seqs} sequences, "
              f"{llm.engine.scheduler.config.max_num_batched_tokens} tokens a step, {len(llm.engine.blocks.blocks)} KV blocks) "
              f"on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
        return llm

    name = args.served_model_name or args.model or path.stem
    metrics = Metrics(name)
    loop = EngineLoop(load, metrics)
    server = Server(ServerConfig(name, args.api_key, args.max_waiting), loop, metrics)
    config = uvicorn.Config(build_app(server), host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.log_level == "debug", timeout_graceful_shutdown=args.grace,
                            lifespan="on")
    http = _server_class(uvicorn)(config)

    def watch_load():
        while loop.state == "loading" and not http.should_exit:
            time.sleep(0.05)
        if loop.state == "failed":
            http.should_exit = True

    threading.Thread(target=watch_load, name="impnb-load-watch", daemon=True).start()
    try:
        http.run()
    except SystemExit as e:  # uvicorn exits when it cannot listen
        if e.code:
            raise ImpnbError(f"cannot serve on {args.host}:{args.port} (see the log above)") from None
    finally:
        for m in mirrors:  # the other ranks stop following
            m.close()
    if loop.state == "failed":
        raise ImpnbError(f"loading the model failed: {loop.error}")
    if not http.started:
        raise ImpnbError(f"cannot serve on {args.host}:{args.port} (see the log above)")
    return 0
