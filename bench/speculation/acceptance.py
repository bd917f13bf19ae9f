"""How many drafts a run verified and accepted, read from a server's Prometheus counters.

Both servers count as vLLM's spec_decode_* metrics do: `num_drafts` is the number of
verifications of a non-empty draft, `num_draft_tokens` the tokens proposed,
`num_accepted_tokens` those the target model confirmed, and `..._per_pos` the accepted
ones by position in the draft. cbserve names them `cbserve_spec_decode_*`
(scheduler_svc/pool_metrics.py); llama-server, started with `--metrics`,
`llamacpp:spec_decode_*` (its tools/server/server-task.cpp). The figures are the
counters' growth over one run (bench.harness.runner.counter_growth), so a server's
warm-up request and earlier runs do not count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

CBSERVE_PREFIX = "cbserve_"
LLAMACPP_PREFIX = "llamacpp:"
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class Acceptance:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: tuple[float, ...] = ()

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verifying step yields on average: the one the target samples in any
        case plus the accepted drafts (vLLM's mean acceptance length); nan with no drafts."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else math.nan

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed ones; nan with no drafts."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan

    def as_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "mean_acceptance_length": _rounded(self.mean_acceptance_length),
            "acceptance_rate": _rounded(self.acceptance_rate),
        }


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def from_counters(grown: dict[str, float], prefix: str = CBSERVE_PREFIX) -> Acceptance:
    """The acceptance of one run from its counters' growth, keyed as
    common.metrics.parse_samples writes them (labels other than `position` dropped)."""
    base = f"{prefix}spec_decode_"
    per_position: dict[int, float] = {}
    for key, value in grown.items():
        if key.startswith(f"{base}num_accepted_tokens_per_pos_total"):
            match = _POSITION.search(key)
            if match:
                per_position[int(match.group(1))] = value
    return Acceptance(
        drafts=grown.get(f"{base}num_drafts_total", 0.0),
        draft_tokens=grown.get(f"{base}num_draft_tokens_total", 0.0),
        accepted_tokens=grown.get(f"{base}num_accepted_tokens_total", 0.0),
        accepted_per_position=tuple(per_position[i] for i in sorted(per_position)),
    )
