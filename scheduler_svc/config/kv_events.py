"""`--kv-events-config`: vLLM's JSON for publishing KV-cache events.

    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                         "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                         "topic": "kv@10.0.0.7:8000@SmolLM2-135M-Instruct"}'

The keys and defaults are vLLM's KVEventsConfig, so that a deployment written for vLLM
(llm-d's guides, Dynamo's) reads the same here: `publisher` defaults to "zmq" when
events are enabled and to "null" otherwise; `endpoint` binds when it holds a `*`
(or is ipc:// or inproc://) and connects otherwise; `buffer_steps` batches are kept
for replay; `hwm` is the PUB socket's high-water mark; `max_queue_size` bounds the
batches waiting for the publisher thread; `topic` is sent verbatim as the first frame
(llm-d reads `kv@<pod-ip>:<port>@<model>` from it).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.config.json_flag import json_object_flag

PUBLISHERS = ("null", "zmq")
_KEYS = {
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
}


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError("--kv-events-config: enable_kv_cache_events must be true or false")
        if self.publisher not in PUBLISHERS:
            raise ValueError(
                f"--kv-events-config: publisher must be one of {PUBLISHERS}, got {self.publisher!r}"
            )
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"--kv-events-config: {name} must be a string")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise ValueError("--kv-events-config: replay_endpoint must be a string or null")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--kv-events-config: {name} must be an integer >= 1")
        if self.publishes and not self.endpoint:
            raise ValueError("--kv-events-config: endpoint must not be empty")

    @property
    def publishes(self) -> bool:
        """Whether a publisher runs: events enabled and a publisher other than null."""
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_kv_events_config(text: str) -> KVEventsConfig | None:
    """The flag's JSON as a config; None for an empty flag or one that publishes nothing."""
    fields = json_object_flag(text, "--kv-events-config", _KEYS)
    if fields is None:
        return None
    # vLLM's default: the zmq publisher when events are on, none when they are off.
    if fields.get("publisher") is None:
        fields["publisher"] = "zmq" if fields.get("enable_kv_cache_events") else "null"
    config = KVEventsConfig(**fields)
    return config if config.publishes else None
