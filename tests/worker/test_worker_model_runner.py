"""The model runner against transformers' own `generate`, driven by a tiny scheduler.

Greedy, float32: token ids must be identical while sequences join, leave,
prefill in chunks, share prefix blocks and get recomputed.
"""

from __future__ import annotations

import random

import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path
from tests.reference_cache import GreedyReference, greedy_outputs
from tests.worker.conftest import TEST_DTYPE

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
NUM_NEW = 32
# Prompts whose greedy continuation runs 32 tokens without EOS, of different lengths.
RAW_PROMPT = "def fibonacci(n):\n    # return the n-th Fibonacci number\n"
CHAT_PROMPTS = [
    "Why is the sky blue?",
    "Write a short poem about the sea and a lighthouse keeper.",
    "Explain in simple words why continuous batching improves the throughput of an inference "
    "server that serves many users at once.",
]


class MiniScheduler:
    """Just enough of a scheduler to drive the runner: per-sequence chunk sizes,
    blocks from a shuffled free list (so block ids are scattered), diffs as plans."""

    def __init__(self, runner, num_blocks: int, block_size: int = 16, seed: int = 0):
        self.runner = runner
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.seqs: dict[int, dict] = {}
        self.finished: list[int] = []
        self.step_id = 0

    def add(self, sid, prompt, chunk=10_000, max_tokens=NUM_NEW, sampling=GREEDY, **extra):
        self.seqs[sid] = dict(
            prompt=list(prompt),
            outputs=list(extra.pop("outputs", [])),
            computed=extra.pop("computed", 0),
            blocks=list(extra.pop("blocks", [])),
            chunk=chunk,
            max_tokens=max_tokens,
            sampling=sampling,
            sent=False,
        )

    def release(self, sid):
        """Free a sequence's blocks, except those another sequence still reads (shared prefix)."""
        in_use = {b for other, s in self.seqs.items() if other != sid for b in s["blocks"]}
        self.free.extend(b for b in self.seqs[sid]["blocks"] if b not in in_use)
        self.finished.append(sid)

    def preempt(self, sid):
        """Drop a sequence's KV; it comes back as a new sequence carrying its outputs."""
        self.release(sid)
        self.seqs[sid].update(blocks=[], computed=0, sent=False)

    def step(self) -> pb.StepResult:
        self.step_id += 1
        plan = pb.StepPlan(step_id=self.step_id, finished_seq_ids=self.finished)
        self.finished = []
        scheduled = {}
        for sid, s in self.seqs.items():
            total = len(s["prompt"]) + len(s["outputs"])
            n = min(s["chunk"], total - s["computed"])
            needed = -(-(s["computed"] + n) // self.block_size) - len(s["blocks"])
            new_blocks = [self.free.pop() for _ in range(max(needed, 0))]
            s["blocks"].extend(new_blocks)
            scheduled[sid] = n
            if not s["sent"]:
                plan.new_sequences.append(
                    pb.NewSequence(
                        seq_id=sid,
                        prompt_token_ids=s["prompt"],
                        output_token_ids=s["outputs"],
                        num_computed_tokens=s["computed"],
                        num_scheduled_tokens=n,
                        block_ids=s["blocks"],
                        sampling=s["sampling"],
                    )
                )
                s["sent"] = True
            else:
                plan.continuing_sequences.append(
                    pb.ContinuingSequence(
                        seq_id=sid, num_scheduled_tokens=n, new_block_ids=new_blocks
                    )
                )
        result = self.runner.execute(plan)
        assert result.step_id == self.step_id
        assert result.num_tokens == sum(scheduled.values())
        for sid, n in scheduled.items():
            self.seqs[sid]["computed"] += n
        for sid, token in zip(result.seq_ids, result.token_ids, strict=True):
            s = self.seqs[sid]
            assert s["computed"] == len(s["prompt"]) + len(s["outputs"]), "sampled mid-prefill"
            s["outputs"].append(token)
        for sid in [sid for sid, s in self.seqs.items() if len(s["outputs"]) >= s["max_tokens"]]:
            self.release(sid)
            self.done[sid] = self.seqs.pop(sid)["outputs"]
        return result

    done: dict[int, list[int]]

    def run(self, joins: dict[int, tuple] | None = None, max_steps: int = 500):
        self.done = {}
        joins = dict(joins or {})
        for step in range(max_steps):
            for args in joins.pop(step, []):
                self.add(*args[:2], **args[2] if len(args) > 2 else {})
            if not self.seqs and not joins:
                return self.done
            if self.seqs:
                self.step()
        raise AssertionError("did not finish")


def runner_prompt_ids(tokenizer) -> list[list[int]]:
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        for text in CHAT_PROMPTS
    ]
    return [tokenizer(text)["input_ids"] for text in [RAW_PROMPT, *chats]]


def runner_reference(prompt_ids: list[list[int]] | None = None) -> GreedyReference:
    """transformers' greedy continuation of each prompt (stops early only at EOS), in the
    dtype the worker tests run in."""
    if prompt_ids is None:
        from transformers import AutoTokenizer

        prompt_ids = runner_prompt_ids(AutoTokenizer.from_pretrained(default_model_path()))
    return GreedyReference(
        name="worker-runner",
        model_path=default_model_path(),
        prompts=tuple(tuple(ids) for ids in prompt_ids),
        max_new_tokens=NUM_NEW,
        ignore_eos=False,
        dtype=str(TEST_DTYPE).removeprefix("torch."),
    )


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return runner_prompt_ids(tokenizer)


@pytest.fixture(scope="module")
def expected(request, prompt_ids):
    """transformers' greedy continuations, from the on-disk cache (tests/reference_cache.py);
    the session's reference model computes them on a miss."""
    return greedy_outputs(
        runner_reference(prompt_ids), lambda: request.getfixturevalue("reference_model")
    )


def assert_matches(got: list[int], want: list[int]):
    assert len(want) == len(got), "reference stopped at EOS early; pick another prompt"
    assert got == want


# make test-slow (13 s): in make test, tests/integration/test_correctness.py holds
# staggered joins and chunked prefill (a token budget shared with decodes) on the real
# processes to the same transformers references.
@pytest.mark.slow
def test_staggered_joins_and_chunked_prefill_match_generate(make_runner, prompt_ids, expected):
    assert len({len(p) for p in prompt_ids}) == len(prompt_ids)
    sched = MiniScheduler(make_runner(num_blocks=96), num_blocks=96, seed=1)
    done = sched.run(
        joins={
            0: [(0, prompt_ids[0])],
            # Joins while 0 decodes, prefilled 5 tokens per step.
            2: [(1, prompt_ids[1], {"chunk": 5})],
            4: [(2, prompt_ids[2], {"chunk": 16})],
            # A long prompt in chunks of 7, not aligned to blocks.
            5: [(3, prompt_ids[3], {"chunk": 7})],
        }
    )
    for i in range(4):
        assert len(done[i]) == NUM_NEW
        assert_matches(done[i], expected[i])


def test_prefix_blocks_and_recompute_match_generate(make_runner, prompt_ids, expected):
    runner = make_runner(num_blocks=64)
    sched = MiniScheduler(runner, num_blocks=64, seed=2)
    sched.done = {}
    long_prompt = prompt_ids[3]
    sched.add(3, long_prompt, max_tokens=10)
    sched.step()
    # A second sequence whose first 32 tokens are already in sequence 3's first two blocks.
    shared = sched.seqs[3]["blocks"][:2]
    sched.add(13, long_prompt, computed=32, blocks=shared, max_tokens=10)
    for _ in range(3):
        sched.step()
    # Preempt 3: it is re-sent with its outputs and recomputed in fresh blocks.
    sched.preempt(3)
    while sched.seqs:
        sched.step()
    assert_matches(sched.done[13], expected[3][:10])
    assert_matches(sched.done[3], expected[3][:10])


# make test-slow (10 s): make test holds a seeded request to the same tokens alone and in
# a batch on a served stack (test_sampling_and_streaming.py).
@pytest.mark.slow
def test_seeded_sampling_survives_batching_and_recompute(make_runner, prompt_ids):
    seeded = pb.SequenceSampling(temperature=0.9, top_p=0.95, repetition_penalty=1.1, seed=42)
    unseeded = pb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0)

    alone = MiniScheduler(make_runner(seed=1), num_blocks=128)
    alone_out = alone.run({0: [(0, prompt_ids[1], {"sampling": seeded, "max_tokens": 12})]})[0]

    crowded = MiniScheduler(make_runner(seed=2), num_blocks=128, seed=5)
    crowded.done = {}
    crowded.add(0, prompt_ids[1], sampling=seeded, max_tokens=12, chunk=6)
    crowded.add(1, prompt_ids[0], sampling=unseeded, max_tokens=12)
    crowded.add(2, prompt_ids[2], sampling=unseeded, max_tokens=12)
    for _ in range(10):
        crowded.step()
    crowded.preempt(0)
    while crowded.seqs:
        crowded.step()
    assert crowded.done[0] == alone_out
