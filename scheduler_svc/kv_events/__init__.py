"""KV-cache events in vLLM's format, published by the scheduler for prefix-aware routers
(llm-d's endpoint picker, NVIDIA Dynamo): what the replica's prefix cache holds."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from common.errors import StartupError
from scheduler_svc.config.kv_events import KVEventsConfig
from scheduler_svc.kv_events.publisher import ZmqEventPublisher
from scheduler_svc.kv_events.replica import ReplicaKVEvents


@dataclass
class KVEvents:
    """The replica's event stream and the publisher it goes out by."""

    replica: ReplicaKVEvents
    publisher: ZmqEventPublisher

    def stop(self) -> None:
        self.replica.flush()
        self.publisher.shutdown()


def open_kv_events(config: KVEventsConfig | None) -> KVEvents | None:
    """The publisher bound and the stream that feeds it, opened with AllBlocksCleared;
    None where no events are configured. StartupError if an address is taken."""
    if config is None:
        return None
    try:
        publisher = ZmqEventPublisher(config)
    except zmq.ZMQError as error:
        raise StartupError(f"--kv-events-config: {error}") from error
    return KVEvents(ReplicaKVEvents(publisher.publish), publisher)
