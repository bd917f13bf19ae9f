"""The pieces of a constrained row's draft masks: the scheduler's view of a request's
tokens that the n-gram lookup reads (it must propose what the worker proposes over
one list), and the matcher walked through the drafts and rolled back."""

from __future__ import annotations

import random

import numpy as np
import pytest

from common.ngram import NgramIndex
from scheduler_svc.structured.bitmask import TokenBitmask, allowed_ids
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import Constraint
from scheduler_svc.structured.draft_masks import JoinedTokens

from .harness import EOS, encode, load_tokenizer


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer())


def test_joined_tokens_slice_and_propose_as_one_list():
    rng = random.Random(7)
    for _ in range(200):
        prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        output = [rng.randrange(6) for _ in range(rng.randrange(0, 30))]
        joined, whole = JoinedTokens(prompt, output), prompt + output
        assert len(joined) == len(whole)
        a, b = sorted(rng.randrange(len(whole) + 1) for _ in range(2))
        assert joined[a:b] == whole[a:b] and joined[a:] == whole[a:]
        assert joined[-1] == whole[-1] and list(joined) == whole
        k = rng.randrange(1, 6)
        assert NgramIndex(1, 3).propose(joined, k) == NgramIndex(1, 3).propose(whole, k)


def rows_after(compiler, regex: str, drafts: list[int]) -> tuple[list[np.ndarray], object]:
    matcher = compiler.compile_now(Constraint("regex", regex)).new_matcher()
    mask = TokenBitmask(matcher.num_words)
    mask.add_drafting(7, matcher, drafts)
    return list(mask.rows_of(7)), matcher


def test_the_rows_stop_at_a_forbidden_draft_and_the_matcher_is_rolled_back(compiler):
    good, bad = encode("ab")[0], encode("x")[0]
    rows, matcher = rows_after(compiler, "(ab)+c", [good, good, bad, good])
    # Rows 0..2 (row 2 forbids the bad draft); nothing after it.
    assert len(rows) == 3
    assert good in allowed_ids(rows[1]) and bad not in allowed_ids(rows[2])
    # Looked through, never taken: the matcher is where it started.
    assert matcher.num_tokens == 0 and not matcher.is_error
    row = np.zeros(matcher.num_words, dtype=np.int32)
    matcher.fill_mask(row)
    assert np.array_equal(row, rows[0])


def test_the_rows_stop_after_a_draft_that_completes_the_grammar(compiler):
    abc = encode("abc")
    assert len(abc) == 1, abc
    rows, matcher = rows_after(compiler, "(ab)+c", [encode("ab")[0], abc[0], EOS])
    # Row 2 would follow a complete reply (the request ends there): never built.
    assert len(rows) == 2 and abc[0] in allowed_ids(rows[1])
    assert not matcher.must_end and matcher.num_tokens == 0
