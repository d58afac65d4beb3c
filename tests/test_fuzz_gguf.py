"""Issue 38: no GGUF and no command line makes impnb trace back, crash or hang.

A fixed-seed fuzz run over mutants of the tiny seeds of every architecture and of the real
models (in this process, the CLI's main under an alarm), then one test per mutation kind and
per bad CLI input that checks the one-line message names the key or tensor at fault.
"""

import collections
import io
import os
import struct
import sys

import numpy as np
import pytest
from gguf import GGUFValueType as V

from impnb.fuzz import catalogue
from impnb.fuzz.mutate import HUGE, copy, parse, set_info, set_kv
from impnb.fuzz.run import argv_for, run_in_process
from impnb.fuzz.seeds import SEED_ARCHS, write_seeds

CI_SEED = 38
TINY_CASES = 60   # per architecture
REAL_CASES = {"smollm2-135m": 12, "gemma3-270m": 6}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return write_seeds(tmp_path_factory.mktemp("seeds"))


def _run_cases(m, cases, tmp_path, commands=("info", "generate")):
    """(kind -> Counter of outcomes, findings) for cases run in this process."""
    seen, findings = collections.defaultdict(collections.Counter), []
    for i, case in enumerate(cases):
        path = case.mutant.write(tmp_path / "mutant.gguf")
        for command in commands:
            o = run_in_process(argv_for(command, path, chat=case.chat), timeout_s=60)
            seen[case.kind][o.outcome] += 1
            if not o.allowed(getattr(case, command)):
                findings.append(f"{case.kind}: {case.detail}: {command} expected {getattr(case, command)}, "
                                f"got {o.outcome} ({o.status}): {o.stderr.strip()[-500:]}")
    return seen, findings


@pytest.mark.parametrize("arch", SEED_ARCHS)
def test_fuzz_tiny_seeds(arch, seeds, tmp_path):
    rng = np.random.default_rng([CI_SEED, SEED_ARCHS.index(arch)])
    seen, findings = _run_cases(parse(seeds[arch]), catalogue.draw(parse(seeds[arch]), rng, TINY_CASES),
                                tmp_path)
    assert not findings, "\n".join(findings)
    assert len(seen) >= 15, f"only {sorted(seen)} kinds ran"
    assert sum(c["exit2"] for c in seen.values()) > TINY_CASES  # most mutants are refused


@pytest.mark.parametrize("name", sorted(REAL_CASES))
def test_fuzz_real_models(name, tmp_path):
    from tests.conftest import real_model_path

    m = parse(real_model_path(name))
    rng = np.random.default_rng([CI_SEED, len(name)])
    # generate only where the mutant is refused before the weights load, or changes a weight
    cases = catalogue.draw(m, rng, REAL_CASES[name])
    _, findings = _run_cases(m, cases, tmp_path, ("info",))
    quick = [c for c in cases if c.kind not in ("flip_data", "flip_header", "unused_bytes", "retype_same_size")]
    _, more = _run_cases(m, quick[: len(quick) // 2], tmp_path, ("generate",))
    assert not findings + more, "\n".join(findings + more)


def _refused(path, *words, chat=False, command="generate"):
    o = run_in_process(argv_for(command, path, chat=chat), timeout_s=60)
    assert o.outcome == "exit2", o.stderr
    for w in words:
        assert w in o.stderr, o.stderr
    return o.stderr


@pytest.mark.parametrize("arch, mutate, words", [
    ("llama", lambda m: set_kv(m, "llama.block_count", HUGE[0], V.UINT32),
     ["llama.block_count = 4294967295", "above the limit"]),
    ("gemma3", lambda m: set_kv(m, "gemma3.block_count", 2**63, V.UINT64), ["gemma3.block_count"]),
    ("llama", lambda m: set_kv(m, "llama.block_count", 1, V.UINT32),
     ["blk.1.", "belongs to layer 1", "llama.block_count is 1"]),
    ("qwen3", lambda m: set_info(m, "blk.0.attn_q.weight", dims=(256, 64)),
     ["blk.0.attn_q.weight has shape [256, 64]", "qwen3 with d_model 64 and 4 heads of 64 needs [64, 256]"]),
    ("qwen3", lambda m: set_info(m, "blk.1.attn_norm.weight", dims=(64, 1)), ["blk.1.attn_norm.weight has shape [64, 1]"]),
    ("llama", lambda m: set_kv(m, "llama.attention.layer_norm_rms_epsilon", "1e-6", V.STRING),
     ["layer_norm_rms_epsilon", "not a number"]),
    ("llama", lambda m: set_kv(m, "llama.attention.layer_norm_rms_epsilon", -1.0, V.FLOAT32),
     ["layer_norm_rms_epsilon = -1.0"]),
    ("qwen3", lambda m: set_kv(m, "qwen3.rope.freq_base", 0.0, V.FLOAT32), ["qwen3.rope.freq_base = 0.0"]),
    ("qwen3", lambda m: set_kv(m, "qwen3.attention.head_count", HUGE[0], V.UINT32), ["qwen3.attention.head_count"]),
    ("qwen3", lambda m: set_kv(m, "qwen3.attention.head_count_kv", 3, V.UINT32), ["not a multiple"]),
    ("llama", lambda m: set_kv(m, "tokenizer.ggml.eos_token_id", "1", V.STRING), ["eos_token_id", "not a token id"]),
    ("llama", lambda m: set_kv(m, "tokenizer.ggml.eos_token_id", 10**6, V.UINT32), ["eos_token_id = 1000000"]),
    ("llama", lambda m: set_info(m, "blk.1.attn_k.weight", name="blk.1.attn_kk.weight"),
     ["tensor blk.1.attn_k.weight is missing"]),
    ("qwen3moe", lambda m: set_info(m, "blk.0.ffn_up_exps.weight", type_id=6),  # Q8_0 -> Q5_0: shorter
     ["blk.0.ffn_up_exps.weight", "overlapping or unaccounted"]),
    ("llama", lambda m: set_info(m, "blk.1.attn_q.weight", offset=0), ["blk.1.attn_q.weight", "offset 0"]),
    ("llama", lambda m: set_info(m, max(m.infos, key=lambda i: i.offset).name, offset=2**40),
     ["past the end of the file"]),
    ("llama", lambda m: copy(m, tail=b"\0" * 64), ["64 bytes follow the last tensor"]),
    ("gemma3", lambda m: set_info(m, "blk.0.attn_norm.weight", type_id=8), ["blk.0.attn_norm.weight"]),
    ("llama", lambda m: set_kv(m, "tokenizer.chat_template", 5, V.UINT32), ["tokenizer.chat_template is int"]),
])
def test_mutant_refused_naming_its_fault(arch, mutate, words, seeds, tmp_path):
    path = mutate(parse(seeds[arch])).write(tmp_path / "m.gguf")
    _refused(path, *words)
    _refused(path, *words, command="info")


def _with_merge(m, merge):
    i = next(i for i, kv in enumerate(m.kvs) if kv.key == "tokenizer.ggml.merges")
    merges = list(m.kvs[i].value)
    merges[3] = merge
    raw = struct.pack("<IQ", V.STRING, len(merges)) + b"".join(
        struct.pack("<Q", len(s.encode())) + s.encode() for s in merges)
    out = copy(m)
    out.kvs[i] = type(m.kvs[i])(m.kvs[i].key, V.ARRAY, raw, merges)
    return out


@pytest.mark.parametrize("arch, mutate, chat, words", [
    ("llama", lambda m: _with_merge(m, "zzq qqz"), False, ["out of vocabulary"]),
    ("llama", lambda m: set_kv(m, "tokenizer.chat_template", "{{ 1/0 }}", V.STRING), True, ["ZeroDivisionError"]),
    ("llama", lambda m: set_kv(m, "tokenizer.chat_template", "{% for i in range(10**9) %}x{% endfor %}",
                               V.STRING), True, ["loops"]),
    ("gemma3", lambda m: set_kv(m, "tokenizer.chat_template", "{{ 'a' * 10**10 }}", V.STRING), True, ["repeat"]),
])
def test_tokenizer_and_template_faults(arch, mutate, chat, words, seeds, tmp_path):
    path = mutate(parse(seeds[arch])).write(tmp_path / "m.gguf")
    _refused(path, *words, chat=chat)


@pytest.mark.parametrize("arch, tensor, where", [
    ("llama", "blk.1.attn_norm.weight", "blk.1.ffn_norm"),
    ("qwen3", "blk.0.attn_q_norm.weight", "blk.0.ffn_norm"),
    ("gemma3", "blk.3.ffn_down.weight", "blk.3.post_ffw_norm"),  # a NaN block scale
])
def test_nan_weights_stop_naming_the_step_and_layer(arch, tensor, where, seeds, tmp_path, monkeypatch):
    """A NaN weight is refused at load, naming the tensor; where non-finite values arise at run
    time all the same (the load check off, as for numerics that overflow), generation stops naming
    the step and the first norm fed them."""
    from impnb.models import validate

    m = parse(seeds[arch])
    info = next(i for i in m.infos if i.name == tensor)
    value = catalogue.NAN32 if len(info.dims) == 1 else catalogue.NAN16
    path = copy(m, patches=[(info.offset, value)]).write(tmp_path / "m.gguf")
    _refused(path, f"{tensor} holds a NaN or inf (byte 0 of its data)")
    assert run_in_process(argv_for("info", path)).outcome == "exit0"
    monkeypatch.setattr(validate, "check_finite", lambda mf: None)
    _refused(path, "NaN or inf logits at the prompt", f"entering {where}")


def test_harmless_mutants_still_run(seeds, tmp_path):
    m = parse(seeds["llama"])
    for mutant in (set_kv(m, "general.name", "renamed", V.STRING), set_kv(m, "fuzz.extra", 1, V.UINT32)):
        path = mutant.write(tmp_path / "m.gguf")
        for command in ("info", "generate"):
            assert run_in_process(argv_for(command, path)).outcome == "exit0"


def _cli(argv, stdin=None):
    saved = sys.stdin
    sys.stdin = stdin or saved
    try:
        return run_in_process(argv, timeout_s=60)
    finally:
        sys.stdin = saved


class _Stdin(io.TextIOWrapper):
    def isatty(self):
        return False


@pytest.mark.parametrize("extra, words", [
    (["--repeat-penalty", "1e-300"], ["repeat penalty"]),
    (["--repeat-penalty", "1e300"], ["repeat penalty"]),
    (["--temperature", "inf"], ["temperature"]),
    (["--temperature", "nan"], ["temperature"]),
    (["--top-p", "0"], ["top-p"]),
    (["--min-p", "nan"], ["min-p"]),
    (["--seed", "-1"], ["seed"]),
    (["--seed", str(2**64)], ["seed"]),
    (["--max-tokens", "0"], ["--max-tokens"]),
    (["--ctx", "0"], ["--ctx"]),
    (["--ctx", "3"], ["the context holds 3"]),
    (["--top-k", "x"], ["invalid int value"]),
])
def test_bad_cli_values(extra, words, seeds):
    o = _cli(["generate", "hello there my friend", "-m", str(seeds["llama"]), "--device", "cpu", *extra])
    assert o.outcome == "exit2", o.stderr
    assert all(w in o.stderr for w in words), o.stderr


def test_extreme_but_valid_sampling_runs(seeds):
    for extra in (["--temperature", "1e-300"], ["--temperature", "1e300"], ["--repeat-penalty", "1000"],
                  ["--top-k", str(2**40)], ["--ctx", "10000000"], ["--max-tokens", str(2**40)]):
        o = _cli(["generate", "hello", "-m", str(seeds["qwen3"]), "--device", "cpu", "-n", "2", *extra])
        assert o.outcome == "exit0", (extra, o.stderr)


def test_prompts_that_are_not_utf8(seeds):
    o = _cli(["generate", "caf\udce9", "-m", str(seeds["llama"]), "--device", "cpu"])
    assert o.outcome == "exit2" and "not valid UTF-8" in o.stderr, o.stderr
    o = _cli(["generate", "-m", str(seeds["llama"]), "--device", "cpu"], _Stdin(io.BytesIO("café".encode("latin-1"))))
    assert o.outcome == "exit2" and "byte 0xe9 at offset 3" in o.stderr, o.stderr
    o = _cli(["generate", "hi", "--chat", "--system", "\ud800", "-m", str(seeds["llama"]), "--device", "cpu"])
    assert o.outcome == "exit2" and "--system is not valid UTF-8" in o.stderr, o.stderr


def test_odd_model_paths(tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    for arg, words in (("", "model argument is empty"), (str(tmp_path), "is a directory"),
                       (str(fifo), "not a regular file"), (str(tmp_path / "none.gguf"), "no such file")):
        for argv in (["info", arg], ["generate", "hi", "-m", arg, "--device", "cpu"]):
            o = _cli(argv)
            assert o.outcome == "exit2" and words in o.stderr, (argv, o.stderr)


def test_long_prompt_in_chunks_matches_one_pass(seeds, monkeypatch):
    """The CPU reference's prompt and attention chunks give the same greedy tokens as one pass."""
    from impnb import engine_cpu
    from impnb.gguf_file import open_model_file
    from impnb.models import numpy_ops
    from impnb.sampling import SamplingParams

    ids = list(np.random.default_rng(0).integers(4, 260, 150))
    runs = []
    for chunk, scores in ((1024, 1 << 30), (37, 8 * 4 * 150 * 5)):
        monkeypatch.setattr(engine_cpu, "PREFILL_CHUNK", chunk)
        monkeypatch.setattr(numpy_ops, "SCORES_BYTES", scores)
        engine = engine_cpu.CpuEngine(open_model_file(seeds["gemma3"]), 256)
        engine.reset(SamplingParams(temperature=0))
        runs.append([engine.prefill(ids)] + [engine.step(t) for t in (5, 6, 7)])
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("greedy", [True, False])
def test_gpu_nan_logits_stop_with_the_flag(greedy, seeds):
    """The GPU sampler's non-finite flag reaches the host with the token, eager (the prompt) and
    in a replayed decode graph. The load refuses NaN weights, so the final norm's weight is
    poisoned on the device after it; the same engine then stops naming the step."""
    from impnb.engine_cuda import CudaEngine
    from impnb.errors import NumericalError
    from impnb.gguf_file import open_model_file
    from impnb.sampling import SamplingParams

    params = SamplingParams(temperature=0) if greedy else SamplingParams(temperature=0.8, seed=3)
    engine = CudaEngine(open_model_file(seeds["llama"]), 64)
    norm = engine.m.w["output_norm"]
    good = norm.copy_to_host()
    engine.reset(params)
    token = engine.prefill([5, 6, 7])
    for _ in range(4):  # the decode graph captured, then replayed
        token = engine.step(token)
    norm.copy_to_device(np.full_like(good, np.nan))
    with pytest.raises(NumericalError, match=r"NaN or inf logits at generated token \d+ on the GPU"):
        for _ in range(3):  # a step queued ahead may still hold a clean token
            token = engine.step(token)
    engine.reset(params)
    with pytest.raises(NumericalError, match="NaN or inf logits at the prompt on the GPU"):
        engine.prefill([5, 6, 7])
    norm.copy_to_device(good)
    engine.reset(params)
    engine.prefill([5, 6, 7])  # and runs again once the weight is clean


def test_nan_weights_refused_at_load(seeds, tmp_path):
    """A NaN in a float weight or an fp16 block scale is refused before a load, naming the tensor,
    on either device (the GPU's int8 activations would turn it into finite nonsense)."""
    m = parse(seeds["llama"])
    info = next(i for i in m.infos if i.name == "blk.1.ffn_norm.weight")
    path = copy(m, patches=[(info.offset, catalogue.NAN32)]).write(tmp_path / "nan.gguf")
    for device in ("cpu", "cuda"):
        o = run_in_process(argv_for("generate", path, device=device))
        assert o.outcome == "exit2", o.stderr
        if device == "cpu" or "no CUDA" not in o.stderr:
            assert "blk.1.ffn_norm.weight holds a NaN or inf (byte 0 of its data)" in o.stderr, o.stderr


def test_real_gemma3_transposed_q_names_tensor_and_shape(tmp_path):
    from tests.conftest import real_model_path

    m = parse(real_model_path("gemma3-270m"))
    path = set_info(m, "blk.4.attn_q.weight", dims=(1024, 640)).write(tmp_path / "m.gguf")
    _refused(path, "blk.4.attn_q.weight has shape [1024, 640]; gemma3 with d_model 640 and 4 heads "
                   "of 256 needs [640, 1024]", command="info")
