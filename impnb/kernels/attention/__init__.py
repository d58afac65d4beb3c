"""Attention: prefill (FA2, wgmma), decode (split-K and short-context), the paged KV cache, QK-norm + RoPE + KV write."""
