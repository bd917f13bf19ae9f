"""What a failed call's status says about its connection, for both processes.

grpc's core ends a call whose connection broke under it (the peer's process killed,
its socket reset) with UNAVAILABLE or CANCELLED, and now and then with INTERNAL and
its own words, CORE_INTERNAL_ERROR: a KV transfer to a destination killed mid-stream
read so once in a `make test` run (2026-11-29). No cbserve service answers INTERNAL
with those words (a worker's failed step says "step failed: ..."), so the words tell a
broken connection from a peer that answered with an error.
"""

from __future__ import annotations

import grpc

CORE_INTERNAL_ERROR = "Internal error from Core"


def connection_broke(code: grpc.StatusCode, details: str | None) -> bool:
    """Whether the call ended because its connection did, not by the peer's answer."""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return True
    return code == grpc.StatusCode.INTERNAL and details == CORE_INTERNAL_ERROR
