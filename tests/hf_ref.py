"""Load HF transformers' view of a GGUF (tokenizer and float32 model) for parity tests."""

import functools
from pathlib import Path


@functools.cache
def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@functools.cache
def hf_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


def hf_logits(model, ids):
    """Logits (T, vocab) float32 of one sequence."""
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].float().numpy()
