"""Decode GEMVs (T <= 8 rows) on quantized weights: the plain fused-dequant family, dp4a on int8 activations, the streaming GEMV, residual tails."""
