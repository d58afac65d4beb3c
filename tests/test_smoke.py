"""scripts/smoke.py multi-model: the quick CPU gate passes on every model, and its per-model
check turns a degenerate or wrong output, or poor parity, into FAIL."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "smoke.py"
GATE_MODELS = ("smollm2-135m", "gemma3-270m", "tiny-qwen3", "tiny-qwen3moe", "tiny-qwen35", "tiny-qwen35moe",
               "tiny-gemma4", "tiny-gemma4moe")


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("impnb_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_smoke(*args, env=None, timeout=600):
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def rows(stdout: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in stdout.splitlines() if line.split()[:1]
            and line.split()[0] in GATE_MODELS}


def result(smoke, name, prompt, tokens, text, eog_at_start=False, synthetic=False):
    r = smoke.ModelResult(name, "cpu", synthetic=synthetic)
    r.outputs.append(smoke.Output(prompt, tokens, text, eog_at_start))
    return smoke.check_model(r)


PARIS = dict(text="What is the capital of France?", chat=True, expect=r"\bParis\b")


def test_healthy_answer_passes(smoke):
    r = result(smoke, "smollm2-135m", smoke.Prompt(**PARIS), [504, 3575, 282, 4649, 314, 7042, 30],
               "The capital of France is Paris.")
    assert (r.status, r.coherence, r.degeneration, r.reasons) == ("PASS", "1/1", "ok", [])


def test_degenerate_output_fails(smoke):
    r = result(smoke, "smollm2-135m", smoke.Prompt(**PARIS), [7042] + [28] * 32, " Paris" + "," * 32)
    assert r.status == "FAIL" and r.coherence == "1/1" and r.degeneration == "1/1 bad"
    assert any("low diversity" in x for x in r.reasons) and any("loop" in x for x in r.reasons)
    row = rows(smoke.table([r]))["smollm2-135m"]
    assert row[-1] == "FAIL"
    assert "smollm2-135m: FAIL: degeneration:" in smoke.table([r])
    assert smoke.exit_code([r]) == 1


def test_wrong_answer_fails(smoke):
    r = result(smoke, "smollm2-135m", smoke.Prompt(**PARIS), [504, 3575, 282, 4649, 314, 6394, 30],
               "The capital of France is Lyon.")
    assert r.status == "FAIL" and r.coherence == "0/1" and r.degeneration == "ok"
    assert r.reasons[0].startswith("coherence:")


def test_synthetic_babble_passes_but_an_immediate_eos_fails(smoke):
    story = smoke.Prompt("Once upon a time")
    babble = result(smoke, "tiny-qwen3", story, [77] * 16, " Ngu" * 16, synthetic=True)
    assert (babble.status, babble.coherence) == ("PASS", "n/a")
    eos = result(smoke, "tiny-qwen3", story, [], "", eog_at_start=True, synthetic=True)
    assert eos.status == "FAIL" and "immediate EOS" in eos.reasons[0]


def test_poor_parity_fails(smoke):
    r = smoke.ModelResult("tiny-qwen3", "cuda", synthetic=True, top1=0.97, max_rel=0.2)
    r.outputs.append(smoke.Output(smoke.Prompt("Once upon a time"), [1, 2, 3], "a b c", False))
    smoke.check_model(r)
    assert r.status == "FAIL" and sum(x.startswith("parity:") for x in r.reasons) == 2
    r.top1, r.max_rel = 1.0, 1e-3
    assert smoke.check_model(r).status == "PASS"


def test_exit_code_needs_one_model_that_ran(smoke):
    skip = smoke.ModelResult("gemma3-270m", "cpu", status="SKIP", reasons=["not installed"])
    ok = smoke.ModelResult("smollm2-135m", "cpu", status="PASS")
    assert smoke.exit_code([skip]) == 1
    assert smoke.exit_code([skip, ok]) == 0


def test_usage_mistakes_exit_2():
    assert run_smoke("multi-model", "--models", "llama-9000", timeout=120).returncode == 2
    assert run_smoke("multi-model", "--max-tokens", "0", timeout=120).returncode == 2


def test_no_gpu_with_device_cuda():
    from impnb.devices import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    proc = run_smoke("multi-model", "--device", "cuda", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "cuda" in proc.stderr


@pytest.mark.slow
def test_quick_cpu_gate_passes_on_every_model(smollm2_path, gemma3_path, tmp_path):
    env = dict(os.environ)
    if smollm2_path.parent == gemma3_path.parent:  # the models the fixtures found, e.g. .dev/models
        env["IMPNB_MODELS_DIR"] = str(smollm2_path.parent)
    out = tmp_path / "smoke.json"
    proc = run_smoke("multi-model", "--device", "cpu", "--quick", "--json", out, env=env)
    print(proc.stdout, proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    table = rows(proc.stdout)
    assert set(table) == set(GATE_MODELS)
    for name, row in table.items():
        assert row[1] == "cpu" and row[-1] == "PASS", row
    data = json.loads(out.read_text())
    assert data["exit"] == 0 and [m["status"] for m in data["models"]] == ["PASS"] * len(GATE_MODELS)
    smollm2 = next(m for m in data["models"] if m["name"] == "smollm2-135m")
    assert any("Paris" in o["text"] for o in smollm2["outputs"])


def test_cuda_rows_name_their_graphs_mode(smoke):
    """On cuda a model gets a row with graphs on and one with graphs off; a failing row's reasons
    say which."""
    ok = smoke.ModelResult("gemma3-270m", "cuda", "on", status="PASS")
    bad = smoke.ModelResult("gemma3-270m", "cuda", "off", status="FAIL", reasons=["parity: top-1 0.5"])
    text = smoke.table([ok, bad])
    graphs = [line.split()[2] for line in text.splitlines() if line.startswith("gemma3-270m ")]
    assert graphs == ["on", "off"]
    assert "gemma3-270m[graphs off]: FAIL: parity: top-1 0.5" in text
