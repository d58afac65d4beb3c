"""`python -m impnb info MODEL`: architecture, size, context, tokenizer and tensor types."""

from collections import Counter

from impnb.gguf_file import open_model_file
from impnb.model_registry import resolve_model
from impnb.models.validate import validate_model


def run(args) -> int:
    mf = open_model_file(resolve_model(args.model))
    cfg = validate_model(mf)
    print(f"model         {mf.path}")
    print(f"name          {mf.get('general.name', '?')}")
    print(f"architecture  {mf.arch}")
    print(f"parameters    {mf.n_params() / 1e6:.1f} M")
    print(f"layers        {cfg.n_layer}, d_model {cfg.n_embd}, heads {cfg.n_head}/{cfg.n_head_kv} "
          f"(head dim {cfg.head_dim}), ffn {cfg.n_ff}"
          + (f", experts {cfg.n_expert_used}/{cfg.n_expert}" if cfg.n_expert else "")
          + (" + 1 shared" if cfg.n_ff_shexp else ""))
    if cfg.deltanet:
        d = cfg.deltanet
        print(f"deltanet      {sum(cfg.recurrent_layers)} of the layers, QK heads {d.n_k_heads} of "
              f"{d.head_k_dim}, V heads {d.n_v_heads} of {d.head_v_dim}, conv kernel {d.conv_kernel}")
    print(f"context       {cfg.n_ctx}")
    print(f"vocabulary    {cfg.n_vocab} ({mf.get('tokenizer.ggml.model', '?')} tokenizer)")
    counts, sizes = Counter(), Counter()
    for t in mf.tensors.values():
        counts[t.fmt.name] += 1
        sizes[t.fmt.name] += t.data.nbytes
    print("tensor types  type      tensors       MiB")
    for name, n in counts.most_common():
        print(f"              {name:<8} {n:>8} {sizes[name] / 2**20:>9.1f}")
    return 0
