"""Prefill GEMMs on tensor cores (mma.sync and Hopper wgmma tiles, fp16 and quantized weights) and dequantization for the cuBLAS fallback."""
