"""`bench`'s weight bytes per decode step: the whole file for a tied model, the embedding as one
row when `output` is separate, routed expert tensors at k/E."""

from impnb.commands.bench import bytes_per_token
from impnb.gguf_file import open_model_file
from impnb.models import model_config
from impnb.synthetic import tiny_gguf


def test_tied_model_reads_every_tensor(smollm2_path):
    mf = open_model_file(smollm2_path)
    assert "output.weight" not in mf.tensors
    assert bytes_per_token(mf, model_config(mf)) == sum(t.data.nbytes for t in mf.tensors.values())


def test_moe_counts_the_chosen_experts_only(tmp_path):
    _, path = tiny_gguf("qwen3moe", "Q8_0", tmp_path)
    mf = open_model_file(path)
    cfg = model_config(mf)
    nbytes = {name: t.data.nbytes for name, t in mf.tensors.items()}
    experts = sum(n for name, n in nbytes.items() if "_exps." in name)
    embd = nbytes["token_embd.weight"]
    want = (sum(nbytes.values()) - experts - embd + embd // cfg.n_vocab
            + experts * cfg.n_expert_used // cfg.n_expert)
    assert cfg.n_expert_used < cfg.n_expert and "output.weight" in mf.tensors
    assert bytes_per_token(mf, cfg) == want
