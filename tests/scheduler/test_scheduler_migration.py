"""Moving a lost worker's requests to another scheduler: take_unfinished, then adopt.

The source scheduler is left empty and consistent; the requests resume on the
destination from prompt + output so far (their text state stays with their
streams, the harness's TextStreams), and their clients see exactly the tokens
and text of a run without the fault.
"""

from __future__ import annotations

import pytest

from scheduler_svc.core.request import RequestStatus

from .books import check_books
from .fake_worker import FakeWorker, scripted
from .harness import THE, Harness, encode, make_request, unique_prompt

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve")


def _add_all(harness: Harness, prompts, max_tokens=10, **sampling):
    return [
        harness.add(
            make_request(prompt=prompt, request_id=f"r{i}", max_tokens=max_tokens, **sampling),
            tokens=WORDS,
        )
        for i, prompt in enumerate(prompts)
    ]


def _prompts():
    # A long one (prefilled in chunks with a small budget) and short ones.
    return [unique_prompt(30), unique_prompt(5), unique_prompt(6), unique_prompt(9)]


def _reference(prompts, **sampling) -> tuple[dict[str, list[int]], dict[str, str]]:
    harness = Harness(max_num_batched_tokens=16)
    requests = _add_all(harness, prompts, **sampling)
    harness.run()
    ids = [r.request_id for r in requests]
    return {i: harness.token_ids(i) for i in ids}, {i: harness.text(i) for i in ids}


def _migrate(source: Harness, destination: Harness) -> list:
    taken = source.scheduler.take_unfinished()
    check_books(source.scheduler)
    assert not source.scheduler.has_unfinished_requests()
    assert source.block_manager.num_used_blocks == 0
    for request in taken:
        destination.adopt(request, source)
        check_books(destination.scheduler)
    return taken


@pytest.mark.parametrize("steps_before", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("in_flight", [False, True])
def test_moved_requests_stream_exactly_what_a_run_without_fault_streams(steps_before, in_flight):
    prompts = _prompts()
    expected_tokens, expected_text = _reference(prompts)
    source = Harness(max_num_batched_tokens=16)
    requests = _add_all(source, prompts)
    for _ in range(steps_before):
        source.step()
    if in_flight:
        assert source.schedule() is not None  # its result never comes: the worker died
    finished_before = {r.request_id for r in requests if source.finished(r.request_id)}
    destination = Harness(max_num_batched_tokens=16)
    taken = _migrate(source, destination)
    assert {r.request_id for r in taken} == {r.request_id for r in requests} - finished_before
    for request in taken:
        assert request.status is RequestStatus.WAITING
        assert (request.num_computed_tokens, request.seen_by_worker) == (0, False)
    destination.run()
    check_books(destination.scheduler)
    assert destination.block_manager.num_used_blocks == 0
    for request in requests:
        rid = request.request_id
        harness = source if rid in finished_before else destination
        assert harness.token_ids(rid) == expected_tokens[rid]
        assert harness.text(rid) == expected_text[rid]
        assert harness.final(rid).completion_tokens == 10


def test_a_moved_request_is_prefilled_over_its_prompt_and_output():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    for _ in range(3):
        source.step()
    assert request.num_output_tokens == 3
    destination = Harness()
    _migrate(source, destination)
    plan = destination.schedule()
    (new,) = plan.new_sequences
    assert new.seq_id == request.seq_id
    assert list(new.prompt_token_ids) == request.prompt_token_ids
    assert list(new.output_token_ids) == WORDS[:3]
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (0, 10)


def test_the_source_sends_nothing_stale_and_accepts_a_fresh_step():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    source.scheduler.abort_request("missing")  # no-op
    source.schedule()  # in flight; then the worker is lost
    _migrate(source, Harness())
    # No step in flight, no sequence to drop on a worker that is gone.
    assert source.scheduler.schedule() is None
    source.worker = FakeWorker(64, 4, scripted(source.scripts, lambda *_: THE))  # a fresh worker
    late = source.add(make_request(prompt=unique_prompt(5), max_tokens=2))
    source.run()
    assert source.finished(late.request_id)
    check_books(source.scheduler)


def test_stop_strings_and_held_back_text_survive_the_move():
    # " three" ends the request; " thr"-like partial matches are held back meanwhile.
    prompts = [unique_prompt(6), unique_prompt(8)]
    expected_tokens, expected_text = _reference(prompts, stop=[" four"])
    for steps_before in range(1, 5):
        source = Harness(max_num_batched_tokens=16)
        requests = _add_all(source, prompts, stop=[" four"])
        for _ in range(steps_before):
            source.step()
        destination = Harness(max_num_batched_tokens=16)
        _migrate(source, destination)
        destination.run()
        for request in requests:
            rid = request.request_id
            harness = destination if rid in destination.outputs else source
            assert harness.text(rid) == expected_text[rid]
            assert harness.token_ids(rid) == expected_tokens[rid]


def test_adopt_refuses_a_request_in_another_state_or_too_long_or_a_duplicate():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    (taken,) = source.scheduler.take_unfinished()
    small = Harness(max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len"):
        small.scheduler.adopt(taken)
    destination = Harness()
    destination.adopt(taken, source)
    with pytest.raises(ValueError, match="already scheduled"):
        destination.scheduler.adopt(taken)
    destination.step()
    other = Harness()
    with pytest.raises(ValueError, match="not a waiting request"):
        other.scheduler.adopt(taken)
    check_books(destination.scheduler)


def test_aborting_a_moved_request_frees_it_on_the_destination():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    destination = Harness()
    _migrate(source, destination)
    destination.step()
    destination.scheduler.abort_request(request.request_id)
    destination.step()
    check_books(destination.scheduler)
    assert destination.block_manager.num_used_blocks == 0


def test_preempted_requests_move_too_and_keep_their_usage():
    source = Harness(num_blocks=6, enable_prefix_caching=False)
    requests = _add_all(source, [unique_prompt(7) for _ in range(3)], max_tokens=8)
    for _ in range(4):
        source.step()
    assert sum(r.num_preemptions for r in requests) >= 1
    destination = Harness(num_blocks=64)
    _migrate(source, destination)
    destination.run()
    for request in requests:
        rid = request.request_id
        harness = destination if rid in destination.outputs else source
        assert harness.token_ids(rid) == (WORDS * 2)[:8]
        assert harness.final(rid).completion_tokens == 8
