"""Drains over real processes beyond test_kv_drain.py's (issue 46), on its requests
(greedy and seeded, stop strings, one structured):

- with n-gram speculation on (--speculative-config): every stream token-identical to
  the undrained run, nothing recomputed, drafts proposed;
- with a transfer killed halfway: three workers, the drain of the first while the
  second, a destination, is stopped (SIGSTOP: its transfers hang mid-way) and then
  killed (SIGKILL): the transfers into it fail, their requests and the killed
  worker's own are recomputed on the third, and every stream is still token-identical,
  nothing lost; the drained worker holds no block afterwards, nor does the third.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import grpc
import pytest

from cbserve.v1 import admin_pb2, admin_pb2_grpc
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.liveness import WORKER_ARGS
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle
from tests.integration.test_kv_drain import MAX_TOKENS, _run

SPECULATIVE = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
    '"prompt_lookup_max": 4}'
)
# How long the destination stays stopped with transfers into it hanging, before its kill.
STOPPED_S = 2.0


@pytest.fixture(scope="module")
def speculative_drain_stack():
    running = started_stack(
        num_workers=2,
        worker_args=WORKER_ARGS,
        scheduler_args=["--speculative-config", SPECULATIVE, "--speculative-drafts", "fixed"],
    )
    yield running
    stop_stack(running)


@pytest.mark.slow  # the plain drain test is in make test; this adds speculation
def test_a_drain_with_speculation_on_keeps_every_stream_token_identical(
    speculative_drain_stack,
):
    stack = speculative_drain_stack
    drained = f"{stack.host}:{stack.worker_ports[0]}"
    reference, _, _ = asyncio.run(_run(stack.address, None))
    results, reply, at_drain = asyncio.run(_run(stack.address, drained))
    assert any(count < MAX_TOKENS for count in at_drain), at_drain  # mid-run
    for index, (got, expected) in enumerate(zip(results, reference, strict=True)):
        assert got == expected, f"request {index}"
    assert reply.requests_recomputed == 0 and reply.requests_moved > 0
    metrics = stack.metrics()
    assert metrics["cbserve_requests_recomputed_total"] == 0
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == 0
    assert metrics["cbserve_spec_decode_num_drafts_total"] > 0  # speculation was on


@pytest.fixture(scope="module")
def three_worker_stack():
    """Its own stack: a worker of it is killed and not brought back."""
    running = started_stack(num_workers=3, worker_args=WORKER_ARGS)
    yield running
    stop_stack(running)


@pytest.mark.slow  # 15 s; the source-killed case below is the mid-stream one
def test_transfers_into_a_stopped_then_killed_destination_recompute_and_lose_nothing(
    three_worker_stack,
):
    stack = three_worker_stack
    drained = f"{stack.host}:{stack.worker_ports[0]}"
    killed, resumed = stack.workers[1].process, stack.workers[2].process
    reference, _, _ = asyncio.run(_run(stack.address, None))

    def kill_and_resume() -> None:
        os.killpg(killed.pid, signal.SIGKILL)
        os.killpg(resumed.pid, signal.SIGCONT)

    def stop_destinations() -> None:
        # Stopped, both still hold their place in the pool (keepalive: 10 s), so the
        # drain reserves room on them; a transfer waits for its destination's plans in
        # flight, which a stopped worker never answers. Then one is killed (its own
        # requests and those meant for it recomputed or moved to the other) and the other
        # resumed, where the moves waiting for it may go on.
        for process in (killed, resumed):
            os.killpg(process.pid, signal.SIGSTOP)
        threading.Timer(STOPPED_S, kill_and_resume).start()

    results, reply, at_drain = asyncio.run(_run(stack.address, drained, fault=stop_destinations))
    killed.wait(30)
    assert any(count < MAX_TOKENS for count in at_drain), at_drain  # mid-run
    for index, (got, expected) in enumerate(zip(results, reference, strict=True)):
        assert got == expected, f"request {index}"
    metrics = wait_until_idle(stack)
    print(
        f"[stopped destinations] {reply.requests_moved} moved, "
        f"{reply.requests_recomputed} recomputed; "
        f"{metrics['cbserve_requests_recomputed_total']:.0f} recomputed in all"
    )
    # However the moves ended (into the resumed worker, or failed with the killed one),
    # each drained request either moved or was recomputed, and only failures recomputed.
    assert reply.requests_moved + reply.requests_recomputed > 0
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == reply.requests_recomputed
    for port in (stack.worker_ports[0], stack.worker_ports[2]):
        worker = f"{stack.host}:{port}"
        assert metrics[f'cbserve_worker_kv_blocks_used{{worker="{worker}"}}'] == 0


# The source killed mid-transfer: few requests with long prompts, whose KV (about 35 MB
# each in float32, 17 chunks) the source sends with CHUNK_PAUSE_S before each chunk, so
# that a transfer lasts well over KILL_AFTER_S on any machine (the drain's settling
# first: a couple of steps); the source dies within.
LONG_PROMPT_NUMBERS = 150
LONG_MAX_TOKENS = 16
CHUNK_PAUSE_S = 0.1
KILL_AFTER_S = 0.6


def _long_requests() -> list[pb.GenerateRequest]:
    requests = []
    for index in range(4):
        # Counting: a continuation the model is sure of, so that float32's small
        # differences between a prefix-cache hit and a whole prefill never flip a token.
        start = 1000 * (index + 1)
        words = ", ".join(str(n) for n in range(start, start + LONG_PROMPT_NUMBERS))
        sampling = pb.SamplingParams(max_tokens=LONG_MAX_TOKENS, ignore_eos=True)
        if index % 2:
            sampling.temperature, sampling.seed = 0.8, 3000 + index
        requests.append(pb.GenerateRequest(prompt=f"Note {index}: {words}", sampling=sampling))
    return requests


async def _run_long(address: str, drained: str | None = None, kill=None):
    """Streams the long requests; with `drained`, drains it once each has a token and
    calls kill() KILL_AFTER_S later. Each stream's tokens, and the drain's reply."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        started = [asyncio.Event() for _ in range(4)]

        async def one(index: int, request) -> list[int]:
            tokens = []
            async for response in stub.Generate(request, timeout=300):
                tokens.extend(response.token_ids)
                started[index].set()
            return tokens

        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(_long_requests())]
        reply = None
        if drained is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 240)
            threading.Timer(KILL_AFTER_S, kill).start()
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            request = admin_pb2.DrainWorkerRequest(address=drained)
            reply = await admin.DrainWorker(request, timeout=240)
        return await asyncio.wait_for(asyncio.gather(*tasks), 300), reply


@pytest.fixture(scope="module")
def source_kill_stack():
    """Its own stack: its first worker is killed mid-drain and not brought back; its
    workers pause before each chunk they send (worker_svc/kv_transfer/sender.py)."""
    os.environ["CBSERVE_KV_CHUNK_PAUSE_S"] = str(CHUNK_PAUSE_S)
    try:
        running = started_stack(num_workers=2, worker_args=WORKER_ARGS)
    finally:
        del os.environ["CBSERVE_KV_CHUNK_PAUSE_S"]
    yield running
    stop_stack(running)


# make test-slow (27 s with its own stack): make test keeps the drain itself
# (test_kv_drain.py) and the worker-level source-killed transfers
# (tests/worker/kv_transfer/test_between_workers.py).
@pytest.mark.slow
def test_a_source_killed_mid_transfer_falls_back_to_recompute_and_loses_nothing(
    source_kill_stack,
):
    stack = source_kill_stack
    source = stack.workers[0].process
    drained = f"{stack.host}:{stack.worker_ports[0]}"
    reference, _ = asyncio.run(_run_long(stack.address))
    results, reply = asyncio.run(
        _run_long(stack.address, drained, lambda: os.killpg(source.pid, signal.SIGKILL))
    )
    source.wait(30)
    assert results == reference
    metrics = wait_until_idle(stack)
    failed = metrics['cbserve_kv_transfers_total{outcome="failed"}']
    print(
        f"[killed source] {reply.requests_moved} moved, {reply.requests_recomputed} "
        f"recomputed, {reply.seconds:.2f} s; transfers failed: {failed:.0f}"
    )
    assert reply.requests_recomputed > 0 and failed > 0
    other = f"{stack.host}:{stack.worker_ports[1]}"
    assert metrics[f'cbserve_worker_kv_blocks_used{{worker="{other}"}}'] == 0
