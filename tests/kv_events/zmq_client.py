"""A subscriber over real ZeroMQ sockets that fills gaps from the replay socket, as a
consumer that must not miss an event does (vLLM's example subscriber's protocol)."""

from __future__ import annotations

import time

import zmq

from tests.kv_events.subscriber import CacheView, decode_message

END_OF_REPLAY = -1
# How long without a live message before the subscriber asks the replay socket anyway.
QUIET_S = 0.5


class ReplayingSubscriber:
    def __init__(self, endpoint: str, replay_endpoint: str, view: CacheView | None = None):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.view = view if view is not None else CacheView()
        self.topics: set[bytes] = set()
        self.num_live = 0
        self.num_replayed = 0
        self._context = zmq.Context.instance()
        self._sub: zmq.Socket | None = None

    def connect(self) -> None:
        """Subscribes, then asks the replay socket for what was sent while away (a SUB
        socket hears only what is sent after it has joined)."""
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(self.endpoint)
        self.replay()

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    def drain_until(self, done, timeout_s: float = 10.0) -> None:
        """Applies live messages (replaying any gap before one) until done() holds."""
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while not done():
            assert time.monotonic() < deadline, f"not caught up (at seq {self.view.next_seq})"
            if not self._sub.poll(50):
                if time.monotonic() - quiet_since > QUIET_S:
                    # Nothing live for a while and not done: the last messages may have
                    # gone while the socket was joining, with nothing after to show it.
                    self.replay()
                    quiet_since = time.monotonic()
                continue
            quiet_since = time.monotonic()
            message = decode_message(self._sub.recv_multipart())
            self.topics.add(message.topic)
            if message.seq < self.view.next_seq:
                continue  # replayed already
            if message.seq > self.view.next_seq:
                self.replay()
                if message.seq < self.view.next_seq:
                    continue
            self.view.apply(message)
            self.num_live += 1

    def replay(self) -> None:
        """Asks the replay socket for everything from the next sequence number on."""
        dealer = self._context.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", self.view.next_seq.to_bytes(8, "big")])
            while True:
                assert dealer.poll(5000), "no answer from the replay socket"
                empty, seq_bytes, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_OF_REPLAY:
                    return
                assert empty == b""
                message = decode_message([b"", seq_bytes, payload])
                if message.seq == self.view.next_seq:
                    self.view.apply(message)
                    self.num_replayed += 1
        finally:
            dealer.close(linger=0)
