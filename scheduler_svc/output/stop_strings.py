"""Stop strings: which text may be streamed before a request stops on one.

The token rules (EOS, stop token ids, max_tokens, model length) are the core's
(core/token_stops.py); a stop string can only be seen in text, so it is the edge's.
As with a stop token, a stop string completed within the first min_tokens output
tokens is ordinary text (the caller says whether stops are active).

Stop strings (StopStringMatcher) are never streamed, not even in part: text
whose end could still grow into a stop string is held back, only as much as
can (the longest tail that is a prefix of some stop string, rather than a
blanket len(longest stop) - 1 characters), and released once it no longer can.
On a match the text is cut right before the stop string.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Finds stop strings in streamed text, holding back what may become one."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stop_strings = tuple(stop_strings)
        # Text not streamed yet. A stop string can never start before it: text is
        # released only once no stop string can begin in it.
        self._pending = ""
        # Proper prefixes of the stop strings by their last character, longest first,
        # so that the hold-back check only tries prefixes that can match at all.
        self._prefixes_by_last_char: dict[str, list[str]] = {}
        for prefix in sorted(
            {stop[:length] for stop in self._stop_strings for length in range(1, len(stop))},
            key=len,
            reverse=True,
        ):
            self._prefixes_by_last_char.setdefault(prefix[-1], []).append(prefix)

    def add_text(self, text: str, stops_active: bool) -> tuple[str, bool]:
        """Takes new text; returns (text safe to stream now, whether a stop string matched).

        After a match the returned text ends right before the stop string, and
        nothing more should be streamed.
        """
        if not self._stop_strings:
            return text, False
        searched_up_to = len(self._pending)
        self._pending += text
        if stops_active:
            stop_start = self._find_stop(searched_up_to)
            if stop_start is not None:
                released, self._pending = self._pending[:stop_start], ""
                return released, True
        keep = self._longest_stop_prefix_at_end()
        cut = len(self._pending) - keep
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released, False

    def flush(self) -> str:
        """Releases the held text: the request finished for another reason."""
        released, self._pending = self._pending, ""
        return released

    def _find_stop(self, searched_up_to: int) -> int | None:
        """Start of the first stop string to complete in the new text, if any.

        "First" is the one that ends earliest, as if the text had arrived one
        character at a time; between equal ends, the longer one.
        """
        best: tuple[int, int] | None = None
        for stop in self._stop_strings:
            # Only matches that end in the new text: older ones were already ruled out
            # (or were completed while stops were not active yet).
            start = self._pending.find(stop, max(0, searched_up_to - len(stop) + 1))
            if start != -1:
                candidate = (start + len(stop), start)
                if best is None or candidate < best:
                    best = candidate
        return None if best is None else best[1]

    def _longest_stop_prefix_at_end(self) -> int:
        if not self._pending:
            return 0
        for prefix in self._prefixes_by_last_char.get(self._pending[-1], ()):
            if self._pending.endswith(prefix):
                return len(prefix)
        return 0
