"""scripts/serve_host_ceiling.py's runner under the real engine: every request gets its tokens,
text included, with no model run."""

import sys
from pathlib import Path

from impnb.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import serve_host_ceiling  # noqa: E402


def test_null_runner_serves_every_request(smollm2_path):
    llm = serve_host_ceiling.NullLLM(str(smollm2_path), n_ctx=256, max_seqs=4)
    engine = llm.engine
    for i in range(6):  # more requests than sequences a step holds
        engine.add_request([300 + i] * (5 + i), SamplingParams(max_tokens=7, ignore_eos=True), f"r{i}")
    got, steps = {}, 0
    while engine.has_unfinished_requests():
        for d in engine.step():
            got.setdefault(d.request_id, []).extend(d.token_ids)
        steps += 1
        assert steps < 100
    assert sorted(got) == [f"r{i}" for i in range(6)]
    assert all(len(ids) == 7 and all(200 <= t < 10000 for t in ids) for ids in got.values())
    assert all(engine.completion(f"r{i}").text for i in range(6))
