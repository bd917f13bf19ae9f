"""Fakes for the split scheduler's fast tests: a channel that records what is sent and
returns what the test feeds, and the parts of WorkerPool that the core's EdgeHub uses."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

from cbserve.worker.v1 import worker_pb2
from scheduler_svc.core.request import FinishReason, RequestOutput
from scheduler_svc.split.channel import ChannelClosed
from scheduler_svc.workers.handle import RequestHandle

WORKER = "10.0.0.7:50061"
_CLOSED = object()


class FakeChannel:
    """Records what is sent; recv() returns what the test feeds, ChannelClosed at close."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.inbox: asyncio.Queue = asyncio.Queue()

    def send(self, message: tuple) -> None:
        # As the real channel does: what crosses must pickle.
        self.sent.append(pickle.loads(pickle.dumps(message)))

    async def recv(self) -> tuple:
        message = await self.inbox.get()
        if message is _CLOSED:
            raise ChannelClosed("closed by the test")
        return message

    def feed(self, *messages) -> None:
        for message in messages:
            self.inbox.put_nowait(message)

    def hang_up(self) -> None:
        self.inbox.put_nowait(_CLOSED)

    async def close(self) -> None:
        self.hang_up()

    def of_kind(self, kind: str) -> list[tuple]:
        return [message for message in self.sent if message[0] == kind]


class FakeHolder:
    address = WORKER

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_local(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True


class FakePool:
    """What EdgeHub reads and calls of WorkerPool."""

    def __init__(self, connected: bool = True) -> None:
        description = worker_pb2.WorkerDescription(model_name="m", block_size=16)
        engine = SimpleNamespace(address=WORKER, capacity_tokens=4096, client=None)
        engine.client = SimpleNamespace(description=description)
        self.engines = [engine] if connected else []
        self.holder = FakeHolder()
        self.submitted: list = []
        self.handles: dict[str, RequestHandle] = {}
        self.num_waiting = 0
        self.max_model_len, self.vocab_size, self.max_worker_capacity_tokens = 2048, 49152, 4096
        self.changed = asyncio.Event()
        self.lora_enabled = False

    def adapters(self) -> list:
        return []

    def adapter(self, name: str):
        return None

    def connected_engines(self):
        return self.engines

    def accepts_without_worker(self) -> bool:
        return False

    def submit(self, request) -> RequestHandle:
        self.submitted.append(request)
        handle = self.handles[request.request_id] = RequestHandle(request.request_id, self.holder)
        return handle


def make_output(request_id: str, tokens: list[int], reason: FinishReason | None = None, **extra):
    return RequestOutput(
        request_id=request_id,
        new_token_ids=tokens,
        new_text="",
        logprobs=extra.pop("logprobs", []),
        finish_reason=reason,
        prompt_tokens=extra.pop("prompt_tokens", 3),
        completion_tokens=extra.pop("completion_tokens", len(tokens)),
        **extra,
    )
