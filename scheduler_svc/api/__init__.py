"""The API edge: the public gRPC service, request validation, tokenization, health.

Everything a client's bytes touch before a request becomes the core's Request,
and the summary each call leaves behind (RequestTrace).
"""
