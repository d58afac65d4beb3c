"""CUDA graph capture and replay for decode and prefill."""
