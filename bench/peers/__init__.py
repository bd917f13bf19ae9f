"""The peers cbserve is measured against on the same requests: llama.cpp (llama-server
and llama-perplexity, built once by `make bench-peers`), vLLM's CPU build (installed
once by it too), transformers' own batched `generate`, and any OpenAI-compatible server."""
