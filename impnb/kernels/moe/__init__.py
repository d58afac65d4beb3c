"""Mixture of experts: routing, the router folded into attn_output, the routed experts' GEMVs and the grouped prefill GEMM."""
