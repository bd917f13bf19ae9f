"""Errors both processes share: those that carry the gRPC status a client should see,
and the one that stops a process at start."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """An error meant for the client, with its gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class InvalidArgument(ServiceError, ValueError):
    """Bad input: the message names the field and the allowed range (a ValueError
    too, so that code validating its own input catches it as one)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class StartupError(RuntimeError):
    """The process cannot start (a port taken, a model that does not load, ...): its
    main prints the message and exits 1."""
