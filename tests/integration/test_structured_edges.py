"""Structured outputs where they meet the other ways a request ends, on the session's
stack through the official `openai` client, with replies the grammar fixes token by
token (a `const` schema), so that each case asserts an exact text on any model:

- min_tokens or ignore_eos past the grammar's end: the reply ends there, with "stop"
  and valid JSON (what vLLM gives since it lets a forced EOS through min_tokens);
  the scheduler takes the forced EOS without a step (core/token_intake.py).
- a stop string inside the reply: cut before it, "stop", as vLLM does (the text is
  then not valid JSON: the client asked for the cut).
- max_tokens before the grammar's end: "length", never "stop" on a partial reply.
- logprobs under a constraint: from the masked logits, as vLLM's, so the allowed
  tokens share all the probability; banned ones show vLLM's floor of -9999.0.
"""

from __future__ import annotations

import json
import math

import pytest

CONST_SCHEMA = {
    "type": "object",
    "properties": {"k": {"const": "abc"}},
    "required": ["k"],
    "additionalProperties": False,
}
# The one text the schema allows, as the scheduler's JSON defaults write it.
CONST_REPLY = '{"k": "abc"}'
CHOICES = ["yes", "no"]
# llguidance allows every tokenization of a choice: these are the first tokens of
# "yes" and "no" in the default model's vocabulary (SmolLM2).
FIRST_TOKENS = {"y", "ye", "yes", "n", "no"}


def chat(api, max_tokens: int = 32, **fields):
    return api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Answer with JSON."}],
        temperature=0.0,
        max_tokens=max_tokens,
        **fields,
    )


def const_format() -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "const", "schema": CONST_SCHEMA, "strict": True},
    }


@pytest.mark.parametrize("extra", [{"min_tokens": 24}, {"ignore_eos": True}])
def test_min_tokens_and_ignore_eos_end_where_the_grammar_ends(openai_api, extra):
    reply = chat(openai_api, response_format=const_format(), extra_body=extra)
    [choice] = reply.choices
    assert (choice.message.content, choice.finish_reason) == (CONST_REPLY, "stop")
    # The reply's tokens and the EOS the grammar forced: far fewer than min_tokens.
    assert reply.usage.completion_tokens < 24


def test_a_stop_string_inside_the_reply_cuts_it_with_stop(openai_api):
    reply = chat(openai_api, response_format=const_format(), stop=["abc"])
    [choice] = reply.choices
    assert (choice.message.content, choice.finish_reason) == ('{"k": "', "stop")


def test_max_tokens_before_the_grammars_end_is_length(openai_api):
    reply = chat(openai_api, max_tokens=3, response_format=const_format())
    [choice] = reply.choices
    assert choice.finish_reason == "length"
    assert CONST_REPLY.startswith(choice.message.content)
    assert choice.message.content != CONST_REPLY
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)


def test_streamed_min_tokens_reply_ends_with_stop(openai_api):
    stream = openai_api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Answer with JSON."}],
        temperature=0.0,
        max_tokens=32,
        response_format=const_format(),
        extra_body={"min_tokens": 24},
        stream=True,
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert "".join(c.delta.content or "" for c in chunks) == CONST_REPLY
    assert chunks[-1].finish_reason == "stop"


def test_logprobs_under_a_constraint_are_over_the_allowed_tokens(openai_api):
    reply = chat(
        openai_api,
        max_tokens=8,
        logprobs=True,
        top_logprobs=8,
        extra_body={"structured_outputs": {"choice": CHOICES}},
    )
    [choice] = reply.choices
    assert choice.message.content in CHOICES
    first = choice.logprobs.content[0]
    allowed = [top for top in first.top_logprobs if top.logprob > -9999.0]
    banned = [top for top in first.top_logprobs if top.logprob == -9999.0]
    assert {top.token for top in allowed} == FIRST_TOKENS
    assert len(banned) == len(first.top_logprobs) - len(FIRST_TOKENS)
    # All the probability is on the allowed tokens (raw logits would leave most of it
    # on the rest of a 49152-token vocabulary).
    assert math.fsum(math.exp(top.logprob) for top in allowed) == pytest.approx(1.0, abs=1e-4)
    assert first.token in FIRST_TOKENS and first.logprob <= 0.0
