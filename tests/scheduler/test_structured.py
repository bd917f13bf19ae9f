"""scheduler_svc.structured on SmolLM2's real tokenizer: constraints, the compile
cache, matchers and the packed mask."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from scheduler_svc.api.tokenizer import ChatTurn
from scheduler_svc.structured.bitmask import TokenBitmask, allowed_ids
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import (
    Constraint,
    constraint_from_proto,
    constraint_to_proto,
)
from scheduler_svc.structured.matcher import PARALLEL_MIN_ROWS

from .harness import EOS, encode, load_tokenizer

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer(), max_cached=4)


def schema(value: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(value))


def test_constraint_round_trips_through_the_proto():
    for message in (
        pb.StructuredOutput(json_schema='{"type": "integer"}'),
        pb.StructuredOutput(json_object=True),
        pb.StructuredOutput(regex=r"\d+"),
        pb.StructuredOutput(choice=pb.ChoiceList(choices=["yes", "no"])),
        pb.StructuredOutput(grammar='start: "a"+'),
    ):
        constraint = constraint_from_proto(message)
        assert constraint_to_proto(constraint) == message
    assert constraint_from_proto(pb.StructuredOutput()) is None


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (pb.StructuredOutput(json_schema="{not json"), "is not valid JSON"),
        (pb.StructuredOutput(json_schema="[1]"), "must be a JSON schema"),
        (pb.StructuredOutput(choice=pb.ChoiceList()), "1 to 1024 strings"),
        (pb.StructuredOutput(regex=""), "must not be empty"),
    ],
)
def test_malformed_constraints_are_refused_before_compiling(message, words):
    with pytest.raises(InvalidArgument, match=words):
        constraint_from_proto(message)


@pytest.mark.parametrize(
    ("constraint", "words"),
    [
        (Constraint("regex", "a("), "unclosed group"),
        (schema({"type": "foo"}), "foo"),
        (Constraint("grammar", "start: undefined_rule"), "unknown name"),
    ],
)
def test_bad_grammars_get_llguidances_message(compiler, constraint, words):
    with pytest.raises(InvalidArgument, match=words) as raised:
        compiler.compile_now(constraint)
    assert raised.value.field == constraint.field


def test_compile_cache_shares_one_compilation_and_evicts_the_oldest(compiler):
    async def main():
        constraint = Constraint("regex", r"[0-9]{4}")
        before = compiler.num_compiled
        first, second = await asyncio.gather(
            compiler.compile(constraint), compiler.compile(constraint)
        )
        assert first is second and compiler.num_compiled == before + 1
        assert await compiler.compile(constraint) is first
        for width in range(5, 10):  # max_cached=4: the first one falls out
            await compiler.compile(Constraint("regex", f"[0-9]{{{width}}}"))
        assert compiler.num_cached == 4
        assert await compiler.compile(constraint) is not first

    asyncio.run(main())


def test_matcher_follows_valid_json_and_allows_eos_only_at_the_end(compiler):
    matcher = compiler.compile_now(schema(PERSON)).new_matcher()
    row = np.zeros(compiler.num_words, dtype=np.int32)
    text_ids = encode('{"name": "Ann", "age": 7}')
    for token_id in text_ids:
        matcher.fill_mask(row)
        assert token_id in allowed_ids(row)
        assert EOS not in allowed_ids(row)
        assert matcher.advance(token_id)
    assert matcher.is_accepting
    matcher.fill_mask(row)
    assert list(allowed_ids(row)) == [EOS]


def test_matcher_refuses_an_off_grammar_token_and_sync_rebuilds(compiler):
    matcher = compiler.compile_now(schema(PERSON)).new_matcher()
    good = encode('{"name": "B')
    assert all(matcher.advance(t) for t in good)
    assert not matcher.advance(EOS)  # the text is not complete: no EOS yet
    assert matcher.is_error
    # A rebuild from the tokens the request kept gives the state after them.
    assert matcher.sync(good)
    assert not matcher.is_error and matcher.num_tokens == len(good)
    assert not matcher.sync(good)  # in step already: nothing to do
    rest = encode('ob", "age": 30}')
    assert all(matcher.advance(t) for t in rest) and matcher.is_accepting


def test_choice_and_regex_masks(compiler):
    choice = compiler.compile_now(Constraint("choice", json.dumps(["yes", "no"]))).new_matcher()
    row = np.zeros(compiler.num_words, dtype=np.int32)
    choice.fill_mask(row)
    first = {load_tokenizer().decode([int(t)]) for t in allowed_ids(row)}
    assert first and all("yes".startswith(t) or "no".startswith(t) for t in first)
    regex = compiler.compile_now(Constraint("regex", r"[0-9]{3}")).new_matcher()
    regex.fill_mask(row)
    for token_id in allowed_ids(row):
        assert load_tokenizer().decode([int(token_id)]).isdigit()


def test_bitmask_packs_rows_in_order_and_grows(compiler):
    compiled = compiler.compile_now(Constraint("regex", r"[ab]"))
    mask = TokenBitmask(compiler.num_words)
    matchers = [compiled.new_matcher() for _ in range(20)]  # past the initial 8 rows
    for seq_id, matcher in enumerate(matchers, start=100):
        mask.add(seq_id, matcher)
    assert mask.seq_ids == list(range(100, 120))
    rows = np.frombuffer(mask.words, dtype="<i4").reshape(20, compiler.num_words)
    expected = sorted(encode("a") + encode("b"))
    for row in rows:
        assert list(allowed_ids(row)) == expected
    assert len(mask.words) == 20 * 4 * ((load_tokenizer().vocab_size + 31) // 32)


def test_many_rows_filled_by_llguidances_pool_equal_rows_filled_one_by_one(compiler):
    compiled = compiler.compile_now(Constraint("json_object", ""))
    reply = encode('{"name": "Ann", "tags": [1, 2]}')
    matchers = [compiled.new_matcher() for _ in range(2 * PARALLEL_MIN_ROWS)]
    for index, matcher in enumerate(matchers):  # each in a different state
        assert all(matcher.advance(token_id) for token_id in reply[: index % len(reply)])
    mask = TokenBitmask(compiler.num_words)
    for seq_id, matcher in enumerate(matchers):
        mask.add(seq_id, matcher)
    for matcher, row in zip(matchers, mask.fill().rows, strict=True):
        alone = np.zeros(compiler.num_words, dtype=np.int32)
        matcher.fill_mask(alone)
        assert np.array_equal(row, alone)


def test_a_template_without_tools_gets_them_in_the_system_message():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    turns = [ChatTurn("system", "Be brief."), ChatTurn("user", "Weather?")]
    text = load_tokenizer().render_chat(turns, tools)
    system = text.split("<|im_end|>")[0]
    assert "Be brief." in system and '"name": "get_weather"' in system
    assert load_tokenizer().render_chat(turns) == load_tokenizer().render_chat(turns, None)
    assert "get_weather" not in load_tokenizer().render_chat(turns)
