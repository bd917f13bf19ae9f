"""KV events from real processes: a scheduler started with --kv-events-config (alone, and
as a core with API processes, where the core publishes), a real ZeroMQ SUB socket, a
few requests; and the gauges the endpoint picker reads on the HTTP port's /metrics.

Null workers (real token ids, no model): what is checked is the scheduler's bookkeeping.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest
import yaml

from cbserve.client import Client
from cbserve.local_stack import free_port
from common.metrics import parse_samples
from scheduler_svc.core.prefix_hash import extend_block_hashes
from scheduler_svc.kv_events.wire import wire_hash
from tests.integration.liveness import restart_worker
from tests.integration.split import API_PROCESSES, NULL_WORKER_ARGS
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle
from tests.kv_events.zmq_client import ReplayingSubscriber
from tests.waiting import wait_until

POOL_BLOCKS = 48
ENGINE_CONFIG = Path(__file__).parents[2] / "deploy/k8s/inference-gateway/engine-config.yaml"


def _epp_gauges() -> list[str]:
    """The series the shipped engineConfigs entry tells the endpoint picker to read."""
    [entry] = yaml.safe_load(ENGINE_CONFIG.read_text())["parameters"]["engineConfigs"]
    assert entry["name"] == "cbserve"
    return [entry[key] for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")]


@pytest.fixture(scope="module", params=["one process", "api processes"])
def events_stack(request):
    pub_port, replay_port, http_port = free_port(), free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": f"kv@127.0.0.1:{http_port}@SmolLM2-135M-Instruct",
    }
    scheduler_args = ["--kv-events-config", json.dumps(config)]
    if request.param == "api processes":
        scheduler_args += ["--api-processes", str(API_PROCESSES)]
    running = started_stack(
        worker_args=[*NULL_WORKER_ARGS, "--num-kv-blocks", str(POOL_BLOCKS)],
        scheduler_args=scheduler_args,
        http_port=http_port,
    )
    running.topic = config["topic"].encode()
    running.events = (f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
    yield running
    stop_stack(running)


def _prompt_hashes(prompt: list[int], block_size: int) -> set[int]:
    hashes: list[int] = []
    extend_block_hashes(hashes, prompt, block_size)
    return {wire_hash(h) for h in hashes}


def test_a_subscriber_sees_the_prompts_blocks_stored_and_evicted_as_the_scheduler_counts(
    events_stack,
):
    subscriber = ReplayingSubscriber(*events_stack.events)
    subscriber.connect()
    try:
        with Client(events_stack.address) as client:
            block_size = client.model_info().block_size
            prompts = [[300 + i * 50 + j for j in range(3 * block_size + 5)] for i in range(4)]
            for prompt in prompts:
                client.complete(token_ids=prompt, max_tokens=4, ignore_eos=True)
            wanted = set().union(*(_prompt_hashes(p, block_size) for p in prompts))
            # Events published before the SUB socket joined come from the replay socket.
            subscriber.drain_until(lambda: wanted <= subscriber.view.blocks)
            assert subscriber.view.num_cleared >= 1  # the stream opened with it
            assert subscriber.topics == {events_stack.topic}
            # More unique prompts than the pool holds: the first ones are evicted.
            for index in range(12):
                prompt = [9000 + index * 100 + j for j in range(4 * block_size)]
                client.complete(token_ids=prompt, max_tokens=2, ignore_eos=True)
        metrics = wait_until_idle(events_stack)
        # Idle, every block the prefix cache holds is a free cached one: as many as the
        # subscriber holds.
        cached = metrics["cbserve_kv_blocks_cached"]
        subscriber.drain_until(
            lambda: subscriber.view.num_removed > 0 and len(subscriber.view.blocks) == cached
        )
        assert not wanted <= subscriber.view.blocks
    finally:
        subscriber.close()


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_samples(response.read().decode())


def test_the_http_port_serves_the_gauges_the_endpoint_picker_reads(events_stack):
    # No key is needed (none is configured here; the route is outside the key check).
    wait_until_idle(events_stack)
    front = _scrape(f"{events_stack.http_url}/metrics")
    core = _scrape(events_stack.metrics_url)
    gauges = _epp_gauges()
    assert gauges == [
        "cbserve_num_requests_waiting",
        "cbserve_num_requests_running",
        "cbserve_kv_cache_usage_ratio",
    ]
    for name in gauges:
        assert front[name] == core[name] == 0
    assert front["cbserve_kv_blocks_total"] == POOL_BLOCKS


def test_the_gauges_follow_requests_in_flight(events_stack):
    with Client(events_stack.address) as client:
        stream = client.generate(token_ids=[5] * 40, max_tokens=600, ignore_eos=True)
        next(stream)
        try:
            seen: dict[str, float] = {}

            def running() -> bool:
                seen.update(_scrape(f"{events_stack.http_url}/metrics"))
                return seen["cbserve_num_requests_running"] == 1

            wait_until("one request running on the HTTP port's /metrics", running)
            used = seen["cbserve_kv_blocks_used"]
            assert used >= 3
            assert seen["cbserve_kv_cache_usage_ratio"] == pytest.approx(used / POOL_BLOCKS)
        finally:
            stream.close()


def test_a_lost_worker_takes_its_blocks_out_of_the_stream(events_stack):
    subscriber = ReplayingSubscriber(*events_stack.events)
    subscriber.connect()
    try:
        with Client(events_stack.address) as client:
            block_size = client.model_info().block_size
            prompt = [7000 + j for j in range(3 * block_size)]
            client.complete(token_ids=prompt, max_tokens=1, ignore_eos=True)
        subscriber.drain_until(lambda: _prompt_hashes(prompt, block_size) <= subscriber.view.blocks)
        cleared = subscriber.view.num_cleared
        events_stack.workers[0].process.send_signal(signal.SIGKILL)
        # The worker's KV is gone with it: every block removed, then AllBlocksCleared.
        subscriber.drain_until(
            lambda: subscriber.view.num_cleared > cleared and not subscriber.view.blocks
        )
        restart_worker(events_stack, 0)
        wait_until(
            "the worker back", lambda: events_stack.metrics()["cbserve_workers_connected"] == 1
        )
    finally:
        subscriber.close()


def test_render_answers_on_an_api_processes_front_too(events_stack, tokenizer):
    body = json.dumps({"prompt": "The capital of France is"}).encode()
    request = urllib.request.Request(
        f"{events_stack.http_url}/v1/completions/render",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        [rendered] = json.loads(response.read())
    assert rendered["token_ids"] == tokenizer.encode("The capital of France is")
