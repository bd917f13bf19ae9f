"""Flags whose value is a JSON object, as vLLM spells `--speculative-config` and
`--kv-events-config`: read once, refused with the flag's name when it is not an object
or names a key the config does not know (a misspelt key never passes silently)."""

from __future__ import annotations

import json
from collections.abc import Collection


def json_object_flag(text: str, flag: str, known_keys: Collection[str]) -> dict | None:
    """The flag's object; None for an empty flag. Raises ValueError naming the flag."""
    if not text.strip():
        return None
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{flag} must be a JSON object")
    unknown = sorted(fields.keys() - set(known_keys))
    if unknown:
        raise ValueError(f"{flag}: unknown keys {unknown} (known: {sorted(known_keys)})")
    return fields
