"""The CUDA side: context and stream, cuBLAS, device weights and the GPU engine."""
