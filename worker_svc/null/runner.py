"""The null worker's runner: the real runner's bookkeeping, a simulated forward.

Each plan is answered no sooner than the simulated step time after it arrived,

    step time = --null-step-ms + --null-step-us-per-token x scheduled tokens

per step of a multi-step plan. The bookkeeping runs inside that time, as a GPU
worker's input preparation runs inside its step, so the step time is what the flags
say unless the Python alone takes longer. StepResult.forward_seconds (and the worker's
cbserve_worker_forward_seconds) is the whole time spent in the runner: its sum over
a run, divided by the wall time, is how busy the worker was.

Prompt logprobs are answered in the protocol's shape with made-up values (each
prompt token as the most likely one, as NullSampler.logprobs makes them): the
scheduler's side of them runs as it does on a real worker, no number means anything.

A step with deferred masks lets its simulated forward time pass first, then waits
for them, as a real worker's sampler does: so the scheduler's lateness with them
shows in the step times, as it would on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cbserve.worker.v1 import worker_pb2
from worker_svc.kv_pool import KVPool
from worker_svc.model_runner import ModelRunner, record_sample
from worker_svc.null.sampler import NullSampler
from worker_svc.prompt_logprobs import prompt_rows
from worker_svc.sequence import SequenceState
from worker_svc.step.deferred_masks import StepMasks
from worker_svc.token_bitmask import allowed_ids


@dataclass(frozen=True)
class NullModel:
    """The model as the runner and Describe see it; there are no weights behind it."""

    name: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_impl: str = "null"
    compute_path: str = "null"


@dataclass(frozen=True)
class StepTimeModel:
    step_ms: float = 0.0
    us_per_token: float = 0.0

    def __post_init__(self) -> None:
        if min(self.step_ms, self.us_per_token) < 0:
            raise ValueError(f"step times must be >= 0, got {self}")

    def seconds(self, num_tokens: int) -> float:
        return self.step_ms / 1e3 + self.us_per_token / 1e6 * num_tokens


class NullRunner(ModelRunner):
    def __init__(
        self, model: NullModel, pool: KVPool, sampler: NullSampler, step_time: StepTimeModel
    ):
        super().__init__(model, pool, backend=None, sampler=sampler)
        self.step_time = step_time
        self._simulated_s = 0.0
        self._started = 0.0

    def execute(self, plan: worker_pb2.StepPlan) -> worker_pb2.StepResult:
        started = self._started = time.perf_counter()
        self._simulated_s = 0.0
        result = super().execute(plan)
        # Sleep, not spin: the machines this runs on have few cores, and a spinning
        # worker would take them from the scheduler it is there to measure.
        self._sleep_until(started + self._simulated_s)
        result.forward_seconds = time.perf_counter() - started
        return result

    def _run(
        self,
        work: list[tuple[SequenceState, int]],
        masks: StepMasks,
        result: worker_pb2.StepResult,
        drafts=None,  # never any: a null worker does not accept drafts
    ) -> list[SequenceState]:
        """One simulated forward, with the real one's effect on the sequences and the
        result (ModelRunner._run): computed counts advance, sampling rows append a token."""
        samplers: list[SequenceState] = []
        num_tokens = 0
        for seq, n in work:
            num_tokens += n
            rows = prompt_rows(seq, seq.num_computed_tokens, seq.num_computed_tokens + n)
            if rows is not None:
                result.prompt_logprobs.append(self._made_up_prompt_logprobs(rows))
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                samplers.append(seq)
        self._simulated_s += self.step_time.seconds(num_tokens)
        if not samplers:
            return []
        first_step = not result.token_ids
        tokens = self.sampler.sample(samplers)
        if masks:
            if masks.waits:
                # As a real step: the forward's time passes before the sampler waits.
                self._sleep_until(self._started + self._simulated_s)
            tokens = self._within_masks(samplers, tokens, masks.rows())
        for seq, token in zip(samplers, tokens, strict=True):
            # Not seq.append_token: its penalty counts are tensors, and no torch op
            # runs per step here (penalties do not change which ids are drawn).
            seq.token_ids.append(token)
            wanted = seq.sampling.logprobs
            logprobs = self.sampler.logprobs(token, wanted) if wanted else None
            record_sample(result, seq.seq_id, token, logprobs, first_step)
        return samplers

    @staticmethod
    def _sleep_until(end: float) -> None:
        remaining = end - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    def _made_up_prompt_logprobs(self, rows) -> worker_pb2.PromptLogprobs:
        first, num_top = rows.first_position, rows.seq.prompt_logprobs
        result = worker_pb2.PromptLogprobs(
            seq_id=rows.seq.seq_id, first_position=first, num_top=num_top
        )
        for token in rows.seq.token_ids[first : first + rows.num_rows]:
            made_up = self.sampler.logprobs(token, max(num_top, 1))
            result.logprobs.append(made_up.logprob)
            result.top_token_ids.extend(made_up.top_token_ids[:num_top])
            result.top_logprobs.extend(made_up.top_logprobs[:num_top])
        return result

    def _within_masks(
        self, samplers: list[SequenceState], tokens: list[int], masks: Mapping[int, np.ndarray]
    ) -> list[int]:
        """A constrained row's token is one its mask allows (EOS, when the grammar is
        complete, is all it allows), so constrained runs end as real ones do."""
        chosen = list(tokens)
        for row, seq in enumerate(samplers):
            mask = masks.get(seq.seq_id)
            if mask is None:
                continue
            ids = allowed_ids(mask)
            if len(ids) and chosen[row] not in ids:
                chosen[row] = int(ids[self.sampler.index_below(len(ids))])
        return chosen
