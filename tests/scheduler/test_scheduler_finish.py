"""How requests end, and what their clients see: update_from_output end to end.

Token ids come from the real SmolLM2 tokenizer, so detokenization, stop
strings and multi-byte characters are the real thing.
"""

from __future__ import annotations

import pytest

from scheduler_svc.core.request import FinishReason, RequestStatus, TokenLogprob
from scheduler_svc.output.detokenizer import REPLACEMENT_CHARACTER

from .harness import EOS, THE, Harness, encode, load_tokenizer, make_request

SENTENCE = encode(" the cat sat on the mat.")


def _run_one(tokens, harness=None, prompt=6, **sampling):
    harness = harness or Harness()
    request = harness.add(make_request(prompt=prompt, **sampling), tokens=tokens)
    harness.run()
    return harness, request


def test_eos_stops_and_its_id_is_reported_but_not_its_text():
    harness, request = _run_one([*SENTENCE, EOS, *SENTENCE], max_tokens=50)
    final = harness.final(request.request_id)
    assert final.finish_reason is FinishReason.STOP
    assert harness.token_ids(request.request_id) == [*SENTENCE, EOS]
    assert harness.text(request.request_id) == " the cat sat on the mat."
    assert (final.prompt_tokens, final.completion_tokens) == (6, len(SENTENCE) + 1)
    assert request.status is RequestStatus.FINISHED
    assert request.finish_reason is FinishReason.STOP


def test_ignore_eos_runs_to_max_tokens():
    harness, request = _run_one([EOS, EOS, EOS], max_tokens=5, ignore_eos=True)
    assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    assert harness.token_ids(request.request_id) == [EOS, EOS, EOS, THE, THE]
    assert harness.text(request.request_id) == " the the"


def test_stop_token_id_stops_and_its_text_is_not_returned():
    period = encode(".")[0]
    harness, request = _run_one(SENTENCE, max_tokens=50, stop_token_ids=(period,))
    assert harness.final(request.request_id).finish_reason is FinishReason.STOP
    assert harness.token_ids(request.request_id) == SENTENCE
    assert harness.text(request.request_id) == " the cat sat on the mat"


def test_max_tokens_ends_with_length_after_exactly_max_tokens():
    harness, request = _run_one(SENTENCE, max_tokens=3)
    final = harness.final(request.request_id)
    assert final.finish_reason is FinishReason.LENGTH
    assert final.completion_tokens == 3
    assert harness.text(request.request_id) == " the cat sat"
    # One output per step, each with one token; only the last has a finish reason.
    assert [len(o.new_token_ids) for o in harness.outputs[request.request_id]] == [1, 1, 1]
    assert [o.finish_reason for o in harness.outputs[request.request_id][:-1]] == [None, None]


def test_model_length_ends_with_length():
    harness, request = _run_one(SENTENCE, harness=Harness(max_model_len=10), max_tokens=4)
    assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    assert request.num_tokens == 10
    # Also when the limit comes before max_tokens (which the server would refuse).
    harness, request = _run_one(SENTENCE, harness=Harness(max_model_len=9), max_tokens=10)
    assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    assert harness.final(request.request_id).completion_tokens == 3


def test_min_tokens_delays_eos_stop_ids_and_stop_strings():
    period = encode(".")[0]
    tokens = [EOS, period, *encode(" cat"), EOS]
    harness, request = _run_one(
        tokens, max_tokens=10, min_tokens=3, stop_token_ids=(period,), stop=(" cat",)
    )
    # EOS (1st), "." (2nd) and " cat" (3rd) come too early to stop; EOS (4th) stops.
    assert harness.final(request.request_id).finish_reason is FinishReason.STOP
    assert harness.token_ids(request.request_id) == tokens
    assert harness.text(request.request_id) == ". cat"


def test_min_tokens_then_a_stop_string_after_it():
    tokens = encode(" the cat sat")
    harness, request = _run_one(tokens, max_tokens=10, min_tokens=1, stop=(" cat",))
    assert harness.final(request.request_id).finish_reason is FinishReason.STOP
    assert harness.text(request.request_id) == " the"


@pytest.mark.parametrize(
    ("stop", "expected_text"),
    [
        # " sat on" spans two tokens; " s" and "at" start inside tokens.
        (" sat on", " the cat"),
        ("at on", " the cat s"),
        ("mat.", " the cat sat on the "),
        ("e ca", " th"),
        # Never matches: everything flushes at the end, including a held prefix.
        (".!", " the cat sat on the mat."),
    ],
)
def test_stop_strings_split_across_tokens_are_never_streamed(stop, expected_text):
    harness, request = _run_one([*SENTENCE, EOS], max_tokens=50, stop=(stop,))
    streamed = ""
    for output in harness.outputs[request.request_id]:
        streamed += output.new_text
        # What was streamed so far is always a prefix of the final text: not a
        # single character of the stop string went out.
        assert expected_text.startswith(streamed)
    assert streamed == expected_text
    final = harness.final(request.request_id)
    assert final.finish_reason is FinishReason.STOP
    if stop != ".!":
        # The token that completed the stop string is reported, and nothing after it.
        decode = load_tokenizer().decode
        completing = next(i for i in range(len(SENTENCE)) if stop in decode(SENTENCE[: i + 1]))
        assert harness.token_ids(request.request_id) == SENTENCE[: completing + 1]


def test_held_back_text_is_released_when_it_can_no_longer_become_a_stop():
    # " sat" could start " sat down"; " on" rules it out.
    harness, request = _run_one(SENTENCE, max_tokens=50, stop=(" sat down",))
    texts = [o.new_text for o in harness.outputs[request.request_id]]
    assert texts[:4] == [" the", " cat", "", " sat on"]


def test_held_back_text_is_flushed_when_the_request_ends_otherwise():
    harness, request = _run_one(SENTENCE, max_tokens=3, stop=(" sat down",))
    assert [o.new_text for o in harness.outputs[request.request_id]] == [" the", " cat", " sat"]
    assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("text", [" hi 🤗!", " 日本語のテキスト", " 🚀🎉 naïve 𝕏"])
def test_multi_byte_characters_split_across_tokens_are_never_broken(text):
    tokens = encode(text)
    harness, request = _run_one([*tokens, EOS], max_tokens=50)
    outputs = harness.outputs[request.request_id]
    assert len(outputs) == len(tokens) + 1
    assert not any(REPLACEMENT_CHARACTER in o.new_text for o in outputs)
    # Some steps emit nothing: their token is the first part of a character.
    assert any(o.new_text == "" for o in outputs[:-1])
    assert harness.text(request.request_id) == text


def test_stop_string_made_of_multi_byte_characters():
    tokens = encode(" ok 🤗 then 🚀 more")
    harness, request = _run_one(tokens, max_tokens=50, stop=("🚀",))
    assert harness.text(request.request_id) == " ok 🤗 then "
    assert harness.final(request.request_id).finish_reason is FinishReason.STOP


def test_logprobs_are_passed_through_when_asked_for():
    harness, request = _run_one(SENTENCE[:2], max_tokens=2, logprobs=2)
    entries = [entry for o in harness.outputs[request.request_id] for entry in o.logprobs]
    assert entries == [
        TokenLogprob(token_id, -0.5, ((token_id, -0.5), (token_id + 1, -1.5)))
        for token_id in SENTENCE[:2]
    ]
    harness, request = _run_one(SENTENCE[:2], max_tokens=2)
    assert all(o.logprobs == [] for o in harness.outputs[request.request_id])


def test_finished_requests_free_their_blocks_and_are_dropped_by_the_worker():
    harness = Harness()
    first = harness.add(make_request(prompt=6, max_tokens=2))
    second = harness.add(make_request(prompt=6, max_tokens=8))
    harness.step()
    harness.step()
    assert harness.finished(first.request_id)
    assert not harness.block_manager.has_blocks(first.seq_id)
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [first.seq_id]
    assert first.seq_id not in harness.worker.sequences
    harness.run()
    assert harness.finished(second.request_id)
    assert harness.block_manager.num_free_blocks == harness.block_manager.num_blocks
    assert harness.worker.sequences == {}
