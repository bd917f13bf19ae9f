"""How `cbserve.Client` retries a call the server refused: gRPC's own retry policy.

The policy goes to the channel as a service config (`grpc.service_config`), so gRPC
itself re-sends a call that ended UNAVAILABLE (no worker connected, the server
draining or not yet up) or RESOURCE_EXHAUSTED (the queue or the stream limit full),
with exponential backoff and jitter: the n-th retry waits a random time up to
min(initial_backoff_s * backoff_multiplier**(n-1), max_backoff_s). The call's
deadline (`timeout`) covers every attempt.

gRPC retries a call only until it is committed: for `Generate`, a server-streaming
call, that is when the first response (its headers or first message) arrives. A
refusal comes before any (the server aborts at admission), so it is retried; a
stream that fails after tokens have been streamed (a worker lost mid-reply) is not,
since a second attempt would stream the reply again from its start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import grpc

from cbserve.v1 import generation_pb2 as pb
from common.grpc_options import MESSAGE_SIZE_OPTIONS

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name
RETRYABLE_STATUS_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
# gRPC clamps maxAttempts to 5 (the first attempt included) whatever is asked.
GRPC_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC's retryPolicy for every cbserve.v1.Generation method."""

    # Attempts in all, the first included: 2 to 5.
    max_attempts: int = GRPC_MAX_ATTEMPTS
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 5.0
    backoff_multiplier: float = 2.0
    retryable_status_codes: tuple[str, ...] = RETRYABLE_STATUS_CODES

    def __post_init__(self) -> None:
        if not 2 <= self.max_attempts <= GRPC_MAX_ATTEMPTS:
            raise ValueError(
                f"max_attempts must be in 2..{GRPC_MAX_ATTEMPTS} (gRPC's limit), "
                f"got {self.max_attempts}"
            )
        for name in ("initial_backoff_s", "max_backoff_s", "backoff_multiplier"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        codes = self.retryable_status_codes
        if isinstance(codes, str) or not codes:
            raise ValueError(f"retryable_status_codes must be a tuple of names, got {codes!r}")
        unknown = [code for code in codes if code not in grpc.StatusCode.__members__]
        if unknown or "OK" in codes:
            raise ValueError(f"retryable_status_codes: not a gRPC error code: {unknown or 'OK'}")

    def service_config(self) -> str:
        """The JSON service config that asks gRPC for this policy."""
        policy = {
            "maxAttempts": self.max_attempts,
            "initialBackoff": _duration(self.initial_backoff_s),
            "maxBackoff": _duration(self.max_backoff_s),
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": list(self.retryable_status_codes),
        }
        method_config = {"name": [{"service": SERVICE_NAME}], "retryPolicy": policy}
        return json.dumps({"methodConfig": [method_config]})


DEFAULT_RETRY = RetryPolicy()


def channel_options(retry: RetryPolicy | None) -> list[tuple[str, object]]:
    """The client channel's options: message sizes, and the retry policy (None: no retries)."""
    if retry is None:
        return [*MESSAGE_SIZE_OPTIONS, ("grpc.enable_retries", 0)]
    return [
        *MESSAGE_SIZE_OPTIONS,
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry.service_config()),
    ]


def _duration(seconds: float) -> str:
    # protobuf's JSON Duration: decimal seconds with an "s", at most 9 fractional digits.
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"
