"""LoRA adapters with --api-processes N: the core's registry (a real WorkerPool, no
worker) behind its EdgeHub, two API processes' RemotePools joined to it by in-memory
pipes. A load or unload through one is seen by the other before the caller's answer
comes; a refusal crosses with its status; a request naming an adapter unloaded since
an API process's copy is NOT_FOUND from the core. No process is started."""

from __future__ import annotations

import asyncio
import pickle

import grpc
import pytest

from common.errors import ServiceError
from common.metrics import new_registry
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.split.channel import ChannelClosed
from scheduler_svc.split.core_side import EdgeHub
from scheduler_svc.split.remote_pool import RemotePool
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.workers.pool import WorkerPool

from .harness import load_tokenizer, make_request
from .lora_dirs import make_adapter_dir

_CLOSED = object()


class _End:
    """One end of an in-memory pipe: what it sends (pickled, as the socket does) the
    other end receives."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.peer: _End | None = None

    def send(self, message) -> None:
        self.peer.inbox.put_nowait(pickle.loads(pickle.dumps(message)))

    async def recv(self):
        message = await self.inbox.get()
        if message is _CLOSED:
            raise ChannelClosed("closed")
        return message

    async def close(self) -> None:
        self.inbox.put_nowait(_CLOSED)
        self.peer.inbox.put_nowait(_CLOSED)


def _pipe() -> tuple[_End, _End]:
    core, api = _End(), _End()
    core.peer, api.peer = api, core
    return core, api


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_loads_and_unloads_through_one_api_process_reach_every_one(tmp_path):
    async def scenario():
        tokenizer = load_tokenizer()
        pool = WorkerPool(SchedulerConfig(enable_lora=True), tokenizer)
        hub = EdgeHub(
            pool,
            new_registry(),
            GrammarCompiler.for_tokenizer(tokenizer),
            num_edges=2,
            max_waiting_requests=10,
            max_concurrent_streams=10,
            on_edge_lost=lambda index: None,
        )
        remotes, tasks = [], []
        for index in range(2):
            core_end, api_end = _pipe()
            remote = RemotePool(api_end)
            remote.hello(index)
            tasks += [
                asyncio.create_task(hub.on_channel(core_end)),
                asyncio.create_task(remote.run()),
            ]
            remotes.append(remote)
        await _settle()
        first, second = remotes
        assert first.lora_enabled and second.adapters() == []

        info = await first.load_adapter("sql", str(make_adapter_dir(tmp_path, "sql")), "Base")
        assert (info.name, info.lora_id, info.base_model_name) == ("sql", 1, "Base")
        assert [a.name for a in first.adapters()] == ["sql"], "the caller's copy, before its answer"
        await _settle()
        assert second.adapter("sql") == info

        with pytest.raises(ServiceError) as refused:
            await second.load_adapter("x", str(tmp_path / "missing"))
        assert refused.value.code is grpc.StatusCode.NOT_FOUND
        with pytest.raises(ServiceError) as twice:
            await second.load_adapter("sql", info.path)
        assert twice.value.code is grpc.StatusCode.INVALID_ARGUMENT

        # A request made while first's copy still lists sql, arriving after the unload.
        request = make_request(8, max_tokens=2)
        request.adapter = first.adapter("sql")
        await second.unload_adapter("sql")
        handle = first.submit(request)
        ending = await asyncio.wait_for(handle.queue.get(), 5.0)
        assert isinstance(ending, ServiceError) and ending.code is grpc.StatusCode.NOT_FOUND
        await _settle()
        with pytest.raises(ServiceError) as gone:
            first.adapter("sql")
        assert gone.value.code is grpc.StatusCode.NOT_FOUND

        await hub.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
