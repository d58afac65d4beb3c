"""Per-token kernels: RMSNorm, GLU activations, embedding gather, row gather, fp16 casts."""
