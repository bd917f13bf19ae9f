"""gRPC channel and server options both processes use."""

from __future__ import annotations

# A prompt at the model's full length plus its sampling settings is far below
# this; the limit only stops a hostile client from making us buffer gigabytes.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

# Keepalive on the scheduler-worker link: a dead peer is noticed within ~30 s
# even when no step is in flight.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

SERVER_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    # Accept the keepalive pings our own channels send (every 10 s, also
    # between calls); the default policy answers them with GOAWAY too_many_pings.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A port held by another process must fail the start, not be shared.
    ("grpc.so_reuseport", 0),
]

CHANNEL_OPTIONS = [*MESSAGE_SIZE_OPTIONS, *KEEPALIVE_OPTIONS]
