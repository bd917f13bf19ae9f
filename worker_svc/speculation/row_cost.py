"""What one more row costs a decode step on this worker, measured at start.

Speculation pays when the rows a draft adds cost less than the tokens they are
likely to give (scheduler_svc/core/speculation.py). A decode step on a CPU reads
every weight once however many rows it has, so a row costs a small share of the
step; how small depends on the CPU, the compute path and the model, so it is timed
here, on the real runner and pool, before the worker serves: one scratch sequence
(a repetitive prompt, so that drafts are found), decode steps with no drafts and
with `drafts` drafts alternated, the medians compared. About 10 small steps: a
fraction of a second on the default model.

Taken at start where the native decode step runs (a step of a few milliseconds);
the scheduler starts its cost fit from this figure (WorkerDescription.draft_row_cost)
and refines it from the steps it sees.
"""

from __future__ import annotations

import statistics
import time

from cbserve.worker.v1 import worker_pb2 as pb

_SEQ_ID = (1 << 63) - 1  # no scheduler's id: the stream has not started
# Ordinary tokens repeated: a model continues the cycle, so that drafts are found.
_PATTERN = (1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007)


def measure_draft_row_cost(runner, drafts: int = 4, repeats: int = 5) -> float:
    """(t(1 + drafts) / t(1) - 1) / drafts for this worker's decode steps; 0 when a
    step with drafts is not slower. Leaves the runner holding nothing."""
    pool = runner.pool
    prompt = list(_PATTERN) * 4
    tokens_needed = len(prompt) + 2 * repeats * (drafts + 1) + drafts + 1
    num_blocks = pool.spec.blocks_for_tokens(tokens_needed)
    if num_blocks > pool.num_blocks:
        return 0.0
    sampling = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
    step = _Steps(runner)
    step.run(
        new_sequences=[
            pb.NewSequence(
                seq_id=_SEQ_ID,
                prompt_token_ids=prompt,
                num_scheduled_tokens=len(prompt),
                block_ids=list(range(num_blocks)),
                sampling=sampling,
            )
        ]
    )
    lookup = pb.NgramLookup(min_n=1, max_n=1)
    plain, drafting = [], []
    try:
        for _ in range(repeats):
            for room, times in ((0, plain), (drafts, drafting)):
                decode = pb.ContinuingSequence(
                    seq_id=_SEQ_ID, num_scheduled_tokens=1, num_draft_tokens=room
                )
                started = time.perf_counter()
                result = step.run(continuing_sequences=[decode], ngram_lookup=lookup)
                if result.num_tokens == 1 + room:  # drafts found (the prompt repeats)
                    times.append(time.perf_counter() - started)
    finally:
        runner.reset()
    if not plain or not drafting:
        return 0.0
    base = statistics.median(plain)
    return max(statistics.median(drafting) / base - 1.0, 0.0) / drafts


class _Steps:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.step_id = 0

    def run(self, **fields) -> pb.StepResult:
        self.step_id += 1
        return self.runner.execute(pb.StepPlan(step_id=self.step_id, **fields))
