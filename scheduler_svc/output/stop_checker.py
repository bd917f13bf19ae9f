"""When a request stops generating, and which text may be streamed before it does.

Token rules (StopChecker), in vLLM's order of precedence: EOS (unless
ignore_eos) or a stop token id ends with STOP; then max_tokens or the model's
maximum length ends with LENGTH. A stop on EOS, a stop token id or a stop
string needs min_tokens output tokens before the token that stops: the worker
masks those ids for the first min_tokens tokens, and a stop string completed by
one of them is ordinary text. Length limits always apply.

Stop strings (StopStringMatcher) are never streamed, not even in part: text
whose end could still grow into a stop string is held back, only as much as
can (the longest tail that is a prefix of some stop string, rather than a
blanket len(longest stop) - 1 characters), and released once it no longer can.
On a match the text is cut right before the stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.sampling_params import SamplingParams
from scheduler_svc.core.request import FinishReason


def stops_active(num_output_tokens: int, min_tokens: int) -> bool:
    """Whether the num_output_tokens-th output token may stop the request (EOS, a stop
    token id in the core, a stop string at the edge): only past min_tokens."""
    return num_output_tokens > min_tokens


class StopChecker:
    """Decides from a request's token ids whether it has finished."""

    def __init__(
        self, sampling: SamplingParams, eos_token_ids: Sequence[int], max_model_len: int
    ) -> None:
        eos = () if sampling.ignore_eos else tuple(eos_token_ids)
        self._stop_ids = frozenset(eos) | frozenset(sampling.stop_token_ids)
        self._min_tokens = sampling.min_tokens
        self._max_tokens = sampling.max_tokens
        self._max_model_len = max_model_len

    def stops_active(self, num_output_tokens: int) -> bool:
        return stops_active(num_output_tokens, self._min_tokens)

    def check(
        self, token_id: int, num_output_tokens: int, num_prompt_tokens: int
    ) -> FinishReason | None:
        """The finish reason the num_output_tokens-th output token, token_id, brings."""
        if stops_active(num_output_tokens, self._min_tokens) and token_id in self._stop_ids:
            return FinishReason.STOP
        if (
            num_output_tokens >= self._max_tokens
            or num_prompt_tokens + num_output_tokens >= self._max_model_len
        ):
            return FinishReason.LENGTH
        return None


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
