"""A request's draft acceptance so far (speculative decoding, core/speculation.py)."""

from __future__ import annotations

from dataclasses import dataclass

# Before any acceptance is seen: one accepted in two (a Beta(1, 1) prior).
_PRIOR_ACCEPTED, _PRIOR_TRIALS = 1.0, 2.0
# Each observation keeps this much of the past (about the last 10 verifications).
_ACCEPTANCE_DECAY = 0.9
# Each decode planned without drafts moves the estimate this far back to the prior, so
# that a request whose drafts stopped paying tries again after a while (its text may
# have turned repetitive): about 20 decodes to get halfway.
_RELAX = 0.035


@dataclass
class DraftRecord:
    """One request's acceptance so far (on Request.draft_record)."""

    accepted: float = _PRIOR_ACCEPTED
    trials: float = _PRIOR_TRIALS

    @property
    def acceptance(self) -> float:
        """P(a draft token is accepted | the drafts before it were)."""
        return self.accepted / self.trials

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        # The positions after the first rejection were never tried.
        trials = num_accepted + (1 if num_accepted < num_drafts else 0)
        self.accepted = self.accepted * _ACCEPTANCE_DECAY + num_accepted
        self.trials = self.trials * _ACCEPTANCE_DECAY + trials

    def relax(self) -> None:
        """A decode without drafts: no evidence, so the estimate drifts to the prior."""
        self.accepted += (_PRIOR_ACCEPTED - self.accepted) * _RELAX
        self.trials += (_PRIOR_TRIALS - self.trials) * _RELAX
