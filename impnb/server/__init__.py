"""The OpenAI-compatible HTTP server (`python -m impnb serve`): FastAPI routes over one engine
thread that steps the batched LLMEngine and feeds each request's stream."""
