"""Two greedy replies compared as the same reply, up to one near tie.

Greedy decoding is exact only where the arithmetic is: a request recomputed after a
worker's loss, or decoded with drafts, meets other batch shapes than plain decoding,
and on the block paths a projection of VNNI_FROM_M rows or more takes 16-bit activations
where fewer rows take float32 (worker_svc/compute/qblock_linear.py), so logits move by
about 1e-5.
Where the two best tokens are that close, the replies may part; after that they are
different texts and nothing more can be compared. vLLM's tests compare replies so
(check_logprobs_close); here the tie must be tight: each reply's token is among the
other's top logprobs at the first difference, and no more than NEAR_TIE_NATS below
the token it lost to. A bug (a wrong position, stale K/V, a lost token) parts the
replies where one token clearly leads, and fails.
"""

from __future__ import annotations

# How far apart two tokens' logprobs may be and still count as a tie that
# arithmetic of 1e-5 relative error could flip (logits here are O(10)).
NEAR_TIE_NATS = 0.05


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the token lists differ (a length too), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _gap(logprobs, chosen: int, other: int) -> float | None:
    """How far `other` sits below `chosen` in one position's top logprobs (None: not
    among them)."""
    top = {entry.token_id: entry.logprob for entry in logprobs.top_logprobs}
    if chosen not in top or other not in top:
        return None
    return top[chosen] - top[other]


def assert_same_reply_up_to_a_near_tie(got, expected, label: str = "") -> bool:
    """Passes if the replies (objects with tokens and logprobs) are equal, or part once
    at a near tie; returns whether they parted. Logprobs with top entries are needed
    only where the tokens differ."""
    i = first_difference(got.tokens, expected.tokens)
    if i is None:
        return False
    where = f"{label} token {i}: {got.tokens[i : i + 1]} against {expected.tokens[i : i + 1]}"
    assert i < len(got.tokens) and i < len(expected.tokens), f"lengths differ at {where}"
    assert i < len(got.logprobs) and i < len(expected.logprobs), f"no logprobs at {where}"
    mine, theirs = got.tokens[i], expected.tokens[i]
    gaps = (_gap(got.logprobs[i], mine, theirs), _gap(expected.logprobs[i], theirs, mine))
    assert None not in gaps, f"not a tie (a token outside the other's top logprobs) at {where}"
    assert max(gaps) <= NEAR_TIE_NATS, f"not a near tie ({gaps} nats apart) at {where}"
    return True
