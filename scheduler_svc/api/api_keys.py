"""The API keys both doors check: HTTP's `Authorization: Bearer KEY` header and gRPC's
`authorization` metadata carry the same value, so one check serves both.

With no key configured everything is accepted (a laptop, a private network).
Keys are compared in constant time, so a caller cannot find one by timing refusals.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

BEARER = "bearer "
# Said to a refused caller: what to send, never which keys exist.
MISSING_KEY = "an API key is required: send `Authorization: Bearer <key>`"
WRONG_KEY = "the API key is not valid"


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def refusal(self, authorization: str | None) -> str | None:
        """Why a call with this authorization value is refused, or None to accept it."""
        if not self._keys:
            return None
        if not authorization or authorization[: len(BEARER)].lower() != BEARER:
            return MISSING_KEY
        offered = authorization[len(BEARER) :].strip().encode()
        # Every key is compared, matched or not, so the time taken says nothing.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(offered, key)
        return None if matched else WRONG_KEY
