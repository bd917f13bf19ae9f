"""Exceptions the server maps to gRPC status codes; kept free of heavy imports so that the
server can bind its port before torch and transformers are loaded."""

from __future__ import annotations


class PlanError(ValueError):
    """The plan contradicts the worker's state or pool; the server answers INVALID_ARGUMENT."""


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message names the model path and the reason."""


class AdapterError(ValueError):
    """A LoRA adapter this worker cannot load (the reason says what to change); the
    server answers INVALID_ARGUMENT."""


class AdapterNotFoundError(AdapterError):
    """No adapter directory at the path given; the server answers NOT_FOUND."""
