"""What structured outputs cost per step: `python -m bench.scheduler.structured_cost`.

On the served tokenizer (SmolLM2's by default): compiling a typical schema (cold,
and a cache hit), a request's matcher (a copy), and per step at 64 constrained rows
the scheduler's mask rows (TokenBitmask.add), the matchers' advance, and the worker's
mask over the logits. The rows walk a real JSON reply token by token, so the masks
are computed in the states a reply goes through (keys, strings, numbers, lists).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from common.defaults import converted_model_dir
from common.sampling_params import SamplingParams
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.structured.bitmask import TokenBitmask
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import Constraint
from worker_svc.sampler import Sampler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "age", "tags", "address", "kind"],
    "additionalProperties": False,
}
REPLY = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "tags": ["math", "engines"],
        "address": {"city": "London", "zip": "W1"},
        "kind": "b",
    }
)


class _Row:
    """A greedy sampling row, as the worker's sequences are to its sampler."""

    sampling = SamplingParams(temperature=0.0)
    num_output_tokens = 0
    penalties = None


def _us(seconds: float) -> float:
    return seconds * 1e6


def main(
    argv: list[str] | None = None, prog: str = "python -m bench.scheduler.structured_cost"
) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args(argv)
    tokenizer = Tokenizer(converted_model_dir())
    compiler = GrammarCompiler.for_tokenizer(tokenizer)
    compiler.compile_now(Constraint("regex", "warm"))  # builds the llguidance tokenizer
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    started = time.perf_counter()
    compiled = compiler.compile_now(constraint)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    compiler.compile_now(constraint)
    hit = time.perf_counter() - started
    started = time.perf_counter()
    matchers = [compiled.new_matcher() for _ in range(args.rows)]
    copy = (time.perf_counter() - started) / args.rows
    reply = tokenizer.encode(REPLY, add_special_tokens=False)
    mask_s, advance_s, sample_s, masked_s = [], [], [], []
    logits = torch.randn(args.rows, tokenizer.vocab_size)
    sampler = Sampler()
    rows = [_Row() for _ in range(args.rows)]
    for token_id in reply:
        mask = TokenBitmask(compiler.num_words)
        started = time.perf_counter()
        for seq_id, matcher in enumerate(matchers):
            mask.add(seq_id, matcher)
        words = mask.words
        mask_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        sampler.sample(logits, rows)
        sample_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        sampler.sample(logits, rows, list(mask.rows))
        masked_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert all(matcher.advance(token_id) for matcher in matchers)
        advance_s.append(time.perf_counter() - started)
    num_rows = args.rows
    print(f"tokenizer {tokenizer.name}, vocab {tokenizer.vocab_size}, {len(words)} mask bytes")
    print(
        f"compile (cold) {cold * 1e3:.2f} ms, cache hit {_us(hit):.1f} us, "
        f"matcher copy {_us(copy):.1f} us"
    )
    print(f"per step at {num_rows} rows over {len(reply)} tokens (median; per row in brackets):")
    table = (
        ("scheduler mask", mask_s),
        ("matcher advance", advance_s),
        ("worker sample", sample_s),
        ("  with masks", masked_s),
    )
    for name, samples in table:
        median = statistics.median(samples)
        print(
            f"  {name:16s} {_us(median):8.0f} us  ({_us(median) / num_rows:.1f} us/row, "
            f"max {_us(max(samples)):.0f} us)"
        )


if __name__ == "__main__":
    main()
