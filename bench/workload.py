"""The benchmark workload, shared by bench.throughput and bench.hf_baseline.

The issue's closing-note workload: N requests (64), prompt lengths uniform in
16..128 tokens, output lengths uniform in 16..256 tokens, EOS ignored, all drawn
from one fixed seed so that every run and every baseline sees the same requests.

Prompts are real English, not random ids: windows of exact length cut at random
offsets from the token ids of the public-domain passages below, so the model
attends over text it can make sense of, as it would in service. They are sent as
`prompt_token_ids`, so the lengths are exact on the server side too.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer

from common.defaults import converted_model_dir

PROMPT_LEN = (16, 128)
OUTPUT_LEN = (16, 256)

# Public domain: Austen (1813), Dickens (1859), Lincoln (1863), Melville (1851).
CORPUS = """\
It is a truth universally acknowledged, that a single man in possession of a good fortune,
must be in want of a wife. However little known the feelings or views of such a man may be
on his first entering a neighbourhood, this truth is so well fixed in the minds of the
surrounding families, that he is considered the rightful property of some one or other of
their daughters. "My dear Mr. Bennet," said his lady to him one day, "have you heard that
Netherfield Park is let at last?" Mr. Bennet replied that he had not. "But it is," returned
she; "for Mrs. Long has just been here, and she told me all about it."

It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the
season of Light, it was the season of Darkness, it was the spring of hope, it was the winter
of despair, we had everything before us, we had nothing before us, we were all going direct
to Heaven, we were all going direct the other way. There were a king with a large jaw and a
queen with a plain face, on the throne of England; there were a king with a large jaw and a
queen with a fair face, on the throne of France.

Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we
are engaged in a great civil war, testing whether that nation, or any nation so conceived and
so dedicated, can long endure. We are met on a great battle-field of that war. We have come
to dedicate a portion of that field, as a final resting place for those who here gave their
lives that that nation might live. It is altogether fitting and proper that we should do this.

Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in
my purse, and nothing particular to interest me on shore, I thought I would sail about a
little and see the watery part of the world. It is a way I have of driving off the spleen and
regulating the circulation. Whenever I find myself growing grim about the mouth; whenever it
is a damp, drizzly November in my soul; whenever I find myself involuntarily pausing before
coffin warehouses, and bringing up the rear of every funeral I meet, then, I account it high
time to get to sea as soon as I can. This is my substitute for pistol and ball.
"""


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_token_ids: list[int]
    max_tokens: int
    seed: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def corpus_token_ids(tokenizer_dir: Path) -> list[int]:
    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    return tokenizer.encode(CORPUS, add_special_tokens=False).ids


def make_workload(
    num_prompts: int = 64,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
    prompt_len: tuple[int, int] = PROMPT_LEN,
    output_len: tuple[int, int] = OUTPUT_LEN,
) -> list[BenchRequest]:
    """The same list for the same arguments, on any machine."""
    ids = corpus_token_ids(tokenizer_dir or converted_model_dir())
    if len(ids) <= prompt_len[1]:
        raise ValueError(f"corpus has {len(ids)} tokens, fewer than a {prompt_len[1]}-token prompt")
    rng = random.Random(seed)
    requests = []
    starts: set[int] = set()
    for index in range(num_prompts):
        length = rng.randint(*prompt_len)
        # Distinct offsets: no two prompts share a first block, so a prefix cache
        # cannot turn this into a cache benchmark.
        start = rng.randrange(len(ids) - length + 1)
        while start in starts and len(starts) < len(ids) - prompt_len[1]:
            start = rng.randrange(len(ids) - length + 1)
        starts.add(start)
        requests.append(
            BenchRequest(
                index=index,
                prompt_token_ids=ids[start : start + length],
                max_tokens=rng.randint(*output_len),
                seed=rng.randrange(2**31),
            )
        )
    return requests


def describe(requests: list[BenchRequest], seed: int) -> dict:
    """What a result file records about its workload, so runs can be compared."""
    return {
        "num_prompts": len(requests),
        "seed": seed,
        "prompt_len_range": list(PROMPT_LEN),
        "output_len_range": list(OUTPUT_LEN),
        "total_prompt_tokens": sum(r.prompt_len for r in requests),
        "total_output_tokens": sum(r.max_tokens for r in requests),
        "ignore_eos": True,
    }


def as_dicts(requests: list[BenchRequest]) -> list[dict]:
    return [asdict(r) for r in requests]
