"""The ZeroMQ publisher with real sockets: three frames, sequence numbers without gaps,
the replay socket filling what a subscriber missed, and --kv-events-config's JSON."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.config.kv_events import KVEventsConfig, parse_kv_events_config
from scheduler_svc.kv_events.publisher import ZmqEventPublisher
from scheduler_svc.kv_events.replica import ReplicaKVEvents
from scheduler_svc.kv_events.wire import all_blocks_cleared
from tests.kv_events.mixed_run import scheduler_view
from tests.kv_events.zmq_client import ReplayingSubscriber
from tests.scheduler.harness import Harness, make_request, unique_prompt

TOPIC = "kv@127.0.0.1:8000@SmolLM2-135M-Instruct"


@pytest.fixture
def publisher():
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic=TOPIC,
    )
    running = ZmqEventPublisher(config)
    yield running
    running.shutdown()


def _run_requests(harness: Harness, replica: ReplicaKVEvents, count: int) -> None:
    for _ in range(count):
        harness.add(make_request(unique_prompt(14), max_tokens=3, ignore_eos=True))
        harness.run()
        replica.flush()


def test_a_subscriber_that_reconnects_gets_what_it_missed_from_the_replay_socket(publisher):
    harness = Harness(num_blocks=20, block_size=4)
    replica = ReplicaKVEvents(publisher.publish)
    harness.block_manager.events = replica
    subscriber = ReplayingSubscriber(publisher.endpoint, publisher.replay_endpoint)
    subscriber.connect()

    def caught_up() -> bool:
        return subscriber.view.next_seq == publisher.num_sent and (
            subscriber.view.blocks == scheduler_view(harness)
        )

    _run_requests(harness, replica, 6)
    subscriber.drain_until(caught_up)
    seen_before, replayed_before = subscriber.view.next_seq, subscriber.num_replayed
    subscriber.close()
    _run_requests(harness, replica, 8)  # 8 batches published while nobody listens
    while publisher.num_sent < seen_before + 8:
        time.sleep(0.001)
    subscriber.connect()  # asks for what it missed
    assert subscriber.num_replayed == replayed_before + 8
    assert subscriber.view.next_seq == seen_before + 8
    live_before = subscriber.num_live
    # Then live messages go on where the replay stopped.
    while subscriber.num_live == live_before:
        _run_requests(harness, replica, 1)
        subscriber.drain_until(caught_up)
    assert subscriber.topics == {TOPIC.encode()}
    assert subscriber.view.num_removed > 0  # the 20-block pool evicted along the way


def test_messages_are_three_frames_numbered_from_zero_without_gaps(publisher):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(publisher.endpoint)
    try:
        # A SUB socket misses what is sent before it is connected: send until it hears.
        while not sub.poll(20):
            publisher.publish(0.0, [all_blocks_cleared()])
        received = [sub.recv_multipart()]
        start = publisher.num_sent
        for index in range(50):
            publisher.publish(float(index), [all_blocks_cleared()])
        while len(received) < 1 + start - int.from_bytes(received[0][1], "big") + 50 - 1:
            assert sub.poll(5000)
            received.append(sub.recv_multipart())
    finally:
        sub.close(linger=0)
    seqs = [int.from_bytes(frames[1], "big") for frames in received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    topic, seq, payload = received[-1]
    assert topic == TOPIC.encode() and len(seq) == 8
    assert msgpack.unpackb(payload) == [49.0, [["AllBlocksCleared"]], 0]


def test_the_replay_socket_answers_from_the_asked_number_and_ends_with_minus_one(publisher):
    for index in range(5):
        publisher.publish(float(index), [all_blocks_cleared()])
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    try:
        while publisher.num_sent < 5:
            pass
        dealer.send_multipart([b"", (2).to_bytes(8, "big")])
        answers = []
        while True:
            assert dealer.poll(5000)
            _, seq, payload = dealer.recv_multipart()
            answers.append((int.from_bytes(seq, "big", signed=True), payload))
            if answers[-1][0] == -1:
                break
    finally:
        dealer.close(linger=0)
    assert [seq for seq, _ in answers] == [2, 3, 4, -1]
    assert answers[-1][1] == b""
    assert msgpack.unpackb(answers[0][1])[0] == 2.0


def test_a_taken_endpoint_is_refused_at_start(publisher):
    port = publisher.endpoint.rsplit(":", 1)[1]
    taken = f"tcp://*:{port}"  # a wildcard address: bound, as vLLM's rule says
    with pytest.raises(zmq.ZMQError):
        ZmqEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=taken))


def test_the_config_takes_vllms_keys_and_defaults():
    config = parse_kv_events_config(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558", "topic": "kv@1.2.3.4:8000@m"}'
    )
    assert config == KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://*:5557",
        replay_endpoint="tcp://*:5558",
        buffer_steps=10_000,
        hwm=100_000,
        max_queue_size=100_000,
        topic="kv@1.2.3.4:8000@m",
    )
    # Off unless enabled, or with the null publisher, as in vLLM.
    assert parse_kv_events_config("") is None
    assert parse_kv_events_config('{"endpoint": "tcp://*:5557"}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"enable_kv_cache_events": true, "port": 1}', "unknown keys"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events"),
    ],
)
def test_a_bad_config_fails_when_the_scheduler_config_is_made(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        SchedulerConfig(kv_events_config=text)
