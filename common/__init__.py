"""Pieces both processes share: defaults, config helpers, logging, errors, the sampling
settings and their codec. The generated gRPC code is under cbserve/ (cbserve.v1,
cbserve.worker.v1)."""
