"""`python -m impnb generate`: validate everything, load, then stream the continuation."""

import sys

from impnb.errors import ParameterError
from impnb.generate import Stats
from impnb.gguf_file import open_model_file
from impnb.model_registry import resolve_model
from impnb.models.validate import validate_model
from impnb.sampling import SamplingParams
from impnb.serve.engine import LLMEngine
from impnb.serve.runners import make_runner
from impnb.tokenizer import Tokenizer


def _utf8_text(text: str, what: str) -> str:
    """text unchanged when it is valid Unicode (an argv byte that is not UTF-8 arrives as a lone
    surrogate); ParameterError naming the offending position otherwise."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ParameterError(f"{what} is not valid UTF-8 (character {e.start} is "
                             f"{text[e.start]!a})") from None
    return text


def _prompt_text(args) -> str:
    if args.prompt is not None:
        return _utf8_text(args.prompt, "the prompt")
    if sys.stdin is None or sys.stdin.isatty():
        raise ParameterError("no prompt: give one as an argument or on stdin")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes (a test's StringIO)
        return _utf8_text(sys.stdin.read(), "the prompt on stdin")
    raw = stream.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParameterError(f"the prompt on stdin is not valid UTF-8 (byte 0x{raw[e.start]:02x} "
                             f"at offset {e.start}); convert it, e.g. iconv -f latin1 -t utf-8") from None


def _note_fallback_template(mf) -> None:
    """Say on stderr when --chat uses impnb's built-in template because the file has none."""
    from impnb.chat import GEMMA_ARCHS

    if not mf.get("tokenizer.chat_template") and mf.arch in GEMMA_ARCHS:
        print(f"impnb: note: {mf.path} has no chat template; --chat falls back to impnb's built-in "
              f"Gemma 3 template (google/gemma-3's), which a base model that was not instruction-tuned "
              f"may not follow", file=sys.stderr)


def _prompt_for_tokenizer(args, mf) -> tuple[str, bool]:
    """(the text to encode, whether BOS/EOS are added): the prompt, or its chat rendering."""
    text = _prompt_text(args)
    if args.chat:
        from impnb.chat import render_chat  # jinja2: only for --chat

        _note_fallback_template(mf)
        system = _utf8_text(args.system, "--system") if args.system else None
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": text})
        return render_chat(mf.metadata, messages), False
    if args.system:
        raise ParameterError("--system needs --chat")
    return text, True


def run(args) -> int:
    if args.max_tokens <= 0:
        raise ParameterError(f"--max-tokens must be > 0, got {args.max_tokens}")
    if args.ctx <= 0:
        raise ParameterError(f"--ctx must be > 0, got {args.ctx}")
    if getattr(args, "rank", None) is not None and args.prompt is None:  # every rank reads the same prompt
        raise ParameterError(f"--tp {args.rank.world} takes the prompt as an argument, not on stdin")
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p,
                            args.repeat_penalty, seed=args.seed, max_tokens=args.max_tokens,
                            presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty).validate()
    mf = open_model_file(resolve_model(args.model))
    cfg = validate_model(mf)
    text, add_special = _prompt_for_tokenizer(args, mf)
    tokenizer = Tokenizer.from_metadata(mf.metadata, for_text=text)  # built for the one text it encodes
    ids = tokenizer.encode(text, add_special=add_special)
    if not ids:
        raise ParameterError("the prompt is empty")
    n_ctx = min(args.ctx, cfg.n_ctx)
    if len(ids) >= n_ctx:
        raise ParameterError(f"the prompt has {len(ids)} tokens; the context holds {n_ctx}")
    # the engine every caller shares; one sequence: on the GPU the single-sequence CUDA engine as a
    # runner (the same reset / prefill / step calls as a loop of its own), on the CPU the reference
    # a first start on the GPU builds the prompt's kernels, then the decode step's behind the prompt
    runner = make_runner(mf, n_ctx, args.device, kv_cache_tokens=n_ctx, graphs=not args.no_graphs,
                         max_num_seqs=1, tp=args.rank, first_token=params)
    try:
        engine = LLMEngine(runner, tokenizer, n_ctx)
        request = engine.add_request(ids, params)
        while engine.has_unfinished_requests():
            for delta in engine.step():
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        result = engine.completion(request)
    except BaseException:
        _finish_kernels(runner, abandon=True)
        raise
    stats = Stats(len(ids), result.timing.prefill_s, len(result.token_ids), result.timing.decode_s,
                  result.finish_reason)
    sys.stdout.write("\n")
    sys.stdout.flush()
    _finish_kernels(runner)
    print(f"impnb: {runner.device}: {stats.line()}", file=sys.stderr)
    return 0


def _finish_kernels(runner, abandon: bool = False) -> None:
    """The kernels a first start left compiling: waited for (so the next start is warm), or on an
    error stopped."""
    if runner.device == "cuda":
        from impnb.warmup import finish

        finish(abandon=abandon)
