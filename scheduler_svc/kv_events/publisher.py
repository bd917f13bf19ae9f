"""The ZeroMQ side of KV events, as vLLM's ZmqEventPublisher speaks it.

Every batch goes out on a PUB socket as three frames: the topic, the batch's sequence
number (8 bytes, big-endian, from 0, one per batch, no gaps) and the msgpack payload
(wire.py). The last `buffer_steps` payloads are kept, and a ROUTER socket on
`replay_endpoint` answers a subscriber that missed some: it sends
[identity, "", start_seq as 8 bytes big-endian] and gets every kept batch from that
number on as [identity, "", seq, payload], then [identity, "", -1 as 8 bytes, ""].

The step loop never waits here: publish() puts (ts, events) on a bounded queue and
returns; a thread encodes, numbers, sends and answers replays. When the queue is full
(the thread starved for longer than `max_queue_size` batches) the batch is dropped
and counted: a subscriber then misses those events without a gap in the numbers, so
the drop is logged as an error. The sockets are made and bound here, so that a port
taken fails at start, then handed to the thread, which alone uses them.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque

import structlog
import zmq

from scheduler_svc.config.kv_events import KVEventsConfig
from scheduler_svc.kv_events.wire import Event, encode_batch

log = structlog.get_logger("scheduler.kv_events")

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
# How long the thread waits for a batch before it looks at the replay socket again.
_POLL_S = 0.02
# How long the last batches may take to leave when the publisher stops.
_LINGER_MS = 500


def _binds(endpoint: str) -> bool:
    # vLLM's rule: an address with a wildcard (or a local transport) is bound; any
    # other is connected to (a collector that binds).
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig, context: zmq.Context | None = None) -> None:
        self._topic = config.topic.encode()
        self._context = context or zmq.Context.instance()
        self._queue: queue.Queue[tuple[float, list[Event]] | None] = queue.Queue(
            maxsize=config.max_queue_size
        )
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self.num_dropped = 0
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            if _binds(config.endpoint):
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            if config.replay_endpoint:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """Where the PUB socket is bound (the port chosen, for `tcp://*:0`)."""
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def replay_endpoint(self) -> str | None:
        return None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def num_sent(self) -> int:
        """Batches sent so far (the next batch's sequence number)."""
        return self._next_seq

    def publish(self, ts: float, events: list[Event]) -> None:
        """Queues one batch; never blocks."""
        try:
            self._queue.put_nowait((ts, events))
        except queue.Full:
            self.num_dropped += 1
            log.error(
                "KV events dropped: the publisher thread is behind",
                events=len(events),
                batches_dropped=self.num_dropped,
            )

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued (within timeout_s), then closes the sockets."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._close_sockets(linger=_LINGER_MS)

    def _close_sockets(self, linger: int) -> None:
        self._pub.close(linger=linger)
        if self._replay is not None:
            self._replay.close(linger=0)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._replay is not None:
                self._answer_replays()
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                self._send(*item)
            except Exception:  # noqa: BLE001 - the thread must outlive one bad batch
                log.exception("KV events: a batch could not be sent")

    def _send(self, ts: float, events: list[Event]) -> None:
        payload = encode_batch(ts, events)
        seq = self._next_seq
        self._next_seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._replay_buffer.append((seq, payload))

    def _answer_replays(self) -> None:
        replay = self._replay
        while replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV events: a replay request that is not [id, '', seq]")
                continue
            identity, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in self._replay_buffer:
                if seq >= start_seq:
                    replay.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
            replay.send_multipart((identity, b"", END_OF_REPLAY, b""))
