"""The CLI: bad input gives one line on stderr and exit 2; generation answers on the CPU path."""

import os
import subprocess
import sys

import pytest

import numpy as np
from gguf import GGUFWriter


def write_tiny_gguf(path, arch):
    w = GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_cli(*args, stdin=None, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "impnb", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=env)


def assert_user_error(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("impnb: error:")
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), lines[0]
    assert proc.stdout == ""


def test_missing_file():
    assert_user_error(run_cli("generate", "hi", "-m", "/nonexistent/model.gguf"), "no such file")


def test_unknown_model_name():
    assert_user_error(run_cli("generate", "hi", "-m", "llama-9000"), "unknown model")


def test_random_bytes_file(tmp_path):
    bad = tmp_path / "random.gguf"
    bad.write_bytes(os.urandom(4096))
    assert_user_error(run_cli("generate", "hi", "-m", bad), "not a gguf")


def test_truncated_file(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(3_000_000))
    assert_user_error(run_cli("generate", "hi", "-m", cut), "past the end")


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_tiny_gguf(path, arch="mamba")
    assert_user_error(run_cli("info", path), "architecture 'mamba'")


@pytest.mark.parametrize("drop,config,words", [
    (("blk.0.ssm_a",), {}, ["blk.0.ssm_a is missing"]),
    ((), {"linear_num_key_heads": 3}, ["ssm.time_step_rank 4", "ssm.group_count 3"]),
])
def test_broken_qwen35_file(tmp_path, drop, config, words):
    # a hybrid missing a Gated DeltaNet tensor, or with V heads not a multiple of the QK heads
    import copy

    from impnb.synthetic import MINIMAL_VOCAB
    from impnb.synthetic_qwen35 import build_hf_model, export_gguf

    model = build_hf_model("qwen35", MINIMAL_VOCAB)
    changed = copy.deepcopy(model.config)
    for key, value in config.items():
        setattr(changed, key, value)
    path = tmp_path / "qwen35.gguf"
    export_gguf(model, path, drop=drop, config=changed)
    assert_user_error(run_cli("generate", "hi", "-m", path, "--device", "cpu"), *words)


@pytest.mark.parametrize("command", [["info"], ["generate", "hi", "--device", "cpu", "-m"]])
def test_gemma4_inconsistent_per_layer_metadata(tmp_path, command):
    from gguf import GGUFValueType

    from impnb.fuzz.mutate import parse, set_kv
    from impnb.fuzz.seeds import write_seed

    seed = parse(write_seed("gemma4", tmp_path / "seed.gguf"))  # four layers
    bad = set_kv(seed, "gemma4.attention.head_count_kv", [2, 1, 2], GGUFValueType.ARRAY)
    path = bad.write(tmp_path / "bad.gguf")
    assert_user_error(run_cli(*command, path), "gemma4.attention.head_count_kv has 3 entries")


@pytest.mark.parametrize("flags,words", [
    (["--max-tokens", "0"], ["max-tokens"]),
    (["--temperature", "-1"], ["temperature"]),
    (["--top-p", "0"], ["top-p"]),
    (["--top-p", "1.5"], ["top-p"]),
    (["--ctx", "4"], ["context"]),
    (["--max-tokens", "ten"], ["invalid int"]),
    (["--device", "tpu"], ["invalid choice"]),
    (["--presence-penalty", "3"], ["presence-penalty"]),
    (["--frequency-penalty", "-2.5"], ["frequency-penalty"]),
])
def test_bad_parameters(flags, words, smollm2_path):
    prompt = "one two three four five six seven eight nine ten"
    assert_user_error(run_cli("generate", prompt, "-m", smollm2_path, *flags), *words)


def test_no_gpu_with_device_cuda(smollm2_path):
    from impnb.devices import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    assert_user_error(run_cli("generate", "hi", "-m", smollm2_path, "--device", "cuda"), "cuda")


def test_info(smollm2_path):
    proc = run_cli("info", smollm2_path)
    assert proc.returncode == 0, proc.stderr
    assert "llama" in proc.stdout and "Q4_1" in proc.stdout and "134.5 M" in proc.stdout


@pytest.mark.slow
def test_gemma3_says_paris(gemma3_path):
    proc = run_cli("generate", "The Eiffel Tower is located in the city of", "-m", gemma3_path,
                   "--temperature", "0", "--max-tokens", "6", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "prefill" in proc.stderr and "decode" in proc.stderr


@pytest.mark.slow
def test_smollm2_chat_says_paris(smollm2_path):
    proc = run_cli("generate", "What is the capital of France?", "-m", smollm2_path, "--chat",
                   "--temperature", "0", "--max-tokens", "24", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


@pytest.mark.slow
def test_prompt_from_stdin_and_sampling_is_seeded(smollm2_path):
    args = ("generate", "-m", smollm2_path, "--max-tokens", "12", "--seed", "5", "--device", "cpu")
    a = run_cli(*args, stdin="Once upon a time")
    b = run_cli(*args, stdin="Once upon a time")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout.strip()) > 0


@pytest.mark.parametrize("flags,words", [(["-p", "x"], ["-p"]), (["-n", "0"], ["-n"]), (["-r", "0"], ["-r"])])
def test_bench_bad_parameters(flags, words, smollm2_path):
    assert_user_error(run_cli("bench", "-m", smollm2_path, *flags), *words)


def test_bench_on_cpu(smollm2_path):
    proc = run_cli("bench", "-m", smollm2_path, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "pp8" in proc.stdout and "tg2" in proc.stdout
