"""Many sequences at once: requests, a paged KV pool with prefix caching, a scheduler that mixes
prompt chunks with decode steps under a token budget, model runners, and the Python API
(`impnb.LLM`). No module here imports numba: the CUDA runner loads the GPU path when built."""
