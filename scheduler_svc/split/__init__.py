"""The edge spread over processes (--api-processes N): N API processes (gRPC and HTTP
servers, validation, tokenizing, detokenizing, stop strings, streaming) beside the one
core process that schedules and drives the workers, as vLLM V1's API servers and
engine core. The two talk over a Unix socket (channel.py, messages.py)."""
