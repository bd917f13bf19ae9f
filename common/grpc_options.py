"""gRPC channel and server options both processes use."""

from __future__ import annotations

# A prompt at the model's full length plus its sampling settings is far below
# this; the limit only stops a hostile client from making us buffer gigabytes.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

# The shortest keepalive period a channel may ask for, and the shortest one our
# servers accept: twice as long, so that a ping a little early (timer jitter,
# a loaded machine) is never counted as abuse.
MIN_KEEPALIVE_TIME_MS = 1_000
SERVER_MIN_PING_INTERVAL_MS = MIN_KEEPALIVE_TIME_MS // 2

SERVER_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    # Accept keepalive pings as often as a scheduler with a short --worker-timeout
    # sends them, also on an idle stream and between calls; grpc's default policy
    # (one ping per 5 minutes without data) answers them with GOAWAY too_many_pings,
    # which would end every Step stream at its third idle ping.
    ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # A port held by another process must fail the start, not be shared.
    ("grpc.so_reuseport", 0),
]


def keepalive_options(timeout_s: float) -> list[tuple[str, int]]:
    """Keepalive that closes the connection when the peer has not answered a ping
    within timeout_s, whether or not a call is in flight.

    A ping goes out every timeout_s / 2 and may take timeout_s / 2 to be
    answered, so a peer that dies, stops (SIGSTOP) or drops off the network is
    found at most timeout_s after it last answered. The kernel still ACKs TCP
    for a stopped process and nothing at all comes back from a dropped link,
    so only an HTTP/2 ping tells these cases apart from a quiet peer.
    grpc.http2.ping_timeout_ms must be set too: grpc 1.85 times a keepalive
    ping out after it, not after keepalive_timeout_ms alone (measured: 60 s).
    """
    half_ms = max(MIN_KEEPALIVE_TIME_MS, int(timeout_s * 1000 / 2))
    return [
        ("grpc.keepalive_time_ms", half_ms),
        ("grpc.keepalive_timeout_ms", half_ms),
        ("grpc.http2.ping_timeout_ms", half_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        # No cap on pings sent while no data flows (an idle Step stream).
        ("grpc.http2.max_pings_without_data", 0),
    ]


def channel_options(keepalive_timeout_s: float) -> list[tuple[str, int]]:
    return [*MESSAGE_SIZE_OPTIONS, *keepalive_options(keepalive_timeout_s)]
