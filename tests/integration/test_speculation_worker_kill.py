"""A worker SIGKILLed while its requests verify n-gram drafts (issue 32): its requests
are recomputed on the other worker (prefilled over prompt + output so far, where the
n-gram index is rebuilt from those tokens) and every reply is, token for token, the
greedy reply of plain decoding.

Real processes on loopback: two one-thread workers (the fault tests' workers,
tests/integration/liveness.py; q4_1, and float32 in the slow tier) behind a scheduler
with `--speculative-config` and `--speculative-drafts fixed`, so that every decode
whose text repeats itself verifies drafts whatever the measured cost of a row. The
prompts ask the model to copy text, so the replies repeat prompt tokens and drafts
are found and accepted (a chat question would find none, and the test would pass
without speculating). The kill comes once every stream has a few tokens: the
scheduler's spec_decode counters must have counted accepted drafts by then, every
stream must be mid-reply, and some request must have been recomputed, so that the
comparison is of replies that were cut mid-speculation. The reference is the same
requests on one worker of the same path without speculation.

"Token identically" up to a near tie (tests/near_ties.py): the recompute's prefill and
the drafts' rows are other batch shapes than plain decoding's, and on the q4_1 path a
projection of 16 rows or more takes 16-bit activations, so a greedy choice between two
tokens within 0.05 nats may go either way; past such a tie the replies are different
texts. Both runs ask for logprobs to tell a tie from a bug.
"""

from __future__ import annotations

import pytest

from cbserve.local_stack import LocalStack
from tests.integration.liveness import (
    WORKER_ARGS,
    WORKER_TIMEOUT_S,
    Outcome,
    losses,
    run_greedy,
    wait_until,
    workers_connected,
)
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle
from tests.integration.test_speculative_decoding import CODE, SPECULATIVE
from tests.near_ties import assert_same_reply_up_to_a_near_tie

MAX_TOKENS = 48
# Top logprobs each token carries, to judge a difference (tests/near_ties.py).
LOGPROBS = 5
# Tokens every stream has when the worker is killed: past the first decodes, which
# already verify drafts (fixed drafts), and far from MAX_TOKENS.
TOKENS_BEFORE_KILL = 8
KILLED = 0
ACCEPTED = "cbserve_spec_decode_num_accepted_tokens_total"
DRAFTS = "cbserve_spec_decode_num_drafts_total"
RECOMPUTED = "cbserve_requests_recomputed_total"
LETTER = (
    "Dear Anna, the train leaves at nine from platform four. Bring the blue bag, "
    "the map and the tickets. The train leaves at nine from platform four."
)
EDITS = [
    {"chat": [("user", f"Repeat this code exactly:\n{CODE}")]},
    {"chat": [("user", f"Copy this letter word for word:\n{LETTER}")]},
    {"chat": [("user", f"Rewrite this code with the same names:\n{CODE}")]},
    {"chat": [("user", f"Repeat this text exactly:\n{LETTER}")]},
]


@pytest.fixture(
    scope="module",
    # q4_1: what --dtype auto runs on the development machine (a Zen 4), whose decodes,
    # drafts included, run in the native decode step (models/qblock/native.py);
    # float32: the Python forward the other fault and speculation tests run.
    # Both in make test-slow (26 s for q4_1's stacks): make test kills a speculating
    # worker mid-grammar (test_structured_faults.py, two_speculative_workers).
    params=[pytest.param(p, marks=pytest.mark.slow) for p in ("q4_1", "float32")],
)
def worker_args(request) -> list[str]:
    return [*WORKER_ARGS, "--dtype", request.param]  # the last --dtype counts


@pytest.fixture(scope="module")
def speculating_workers(worker_args):
    running = started_stack(
        num_workers=2,
        worker_args=worker_args,
        scheduler_args=[
            "--worker-timeout",
            str(WORKER_TIMEOUT_S),
            "--speculative-config",
            SPECULATIVE,
            "--speculative-drafts",
            "fixed",
        ],
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def plain_replies(worker_args) -> list[Outcome]:
    """The same requests, all at once, on a worker of the same path without speculation
    and without a fault."""
    with LocalStack(num_workers=1, worker_args=worker_args) as plain:
        outcomes, _ = run_greedy(plain.address, EDITS, MAX_TOKENS, logprobs=LOGPROBS)
    assert all(outcome.finish_reason for outcome in outcomes)
    return outcomes


def test_a_worker_killed_mid_speculation_recomputes_token_identically(
    speculating_workers, plain_replies
):
    stack = speculating_workers
    wait_until("2 workers connected", lambda: workers_connected(stack) == 2)
    before, lost_before = stack.metrics(), losses(stack)
    at_kill: dict[str, float] = {}

    def kill() -> None:
        at_kill.update(stack.metrics())
        stack.workers[KILLED].process.kill()

    outcomes, streamed_at_kill = run_greedy(
        stack.address, EDITS, MAX_TOKENS, kill, after_tokens=TOKENS_BEFORE_KILL, logprobs=LOGPROBS
    )
    # Nothing runs, waits or holds a block (the killed worker stays dead: the stack is
    # this test's alone): rolled-back drafts and recomputed requests left nothing behind.
    after = wait_until_idle(stack)

    # Not vacuous: drafts were verified and accepted before the kill...
    assert at_kill[DRAFTS] > before[DRAFTS], at_kill
    assert at_kill[ACCEPTED] > before[ACCEPTED], at_kill
    # ... the kill cut every stream mid-reply, and moved the killed worker's requests.
    assert all(0 < count < MAX_TOKENS for count in streamed_at_kill), streamed_at_kill
    assert after[RECOMPUTED] > before[RECOMPUTED], after
    assert losses(stack)["disconnected"] == lost_before["disconnected"] + 1
    # Drafting went on after the kill, on the surviving worker.
    assert after[ACCEPTED] > at_kill[ACCEPTED], after

    for i, (outcome, expected) in enumerate(zip(outcomes, plain_replies, strict=True)):
        assert outcome.finish_reason
        assert len(outcome.logprobs) == len(outcome.tokens) == MAX_TOKENS
        assert_same_reply_up_to_a_near_tie(outcome, expected, label=f"request {i}")
