"""`cbserve drain` against the scheduler's AdminService over real gRPC: behind the API
key like Generation, NOT_FOUND for an unknown worker, FAILED_PRECONDITION for the only
one left, and the counts of a drain (fake workers, their SendKv copying fake KV)."""

from __future__ import annotations

import asyncio

from cbserve import cli
from common.grpc_server import create_server
from scheduler_svc.api.admin import add_admin_to_server
from scheduler_svc.api.grpc_auth import interceptors_for
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import load_tokenizer, make_request, unique_prompt

KEY = "drain-key-1"


def test_cbserve_drain_over_the_admin_service(capsys, monkeypatch):
    monkeypatch.delenv("CBSERVE_API_KEY", raising=False)

    async def scenario():
        workers = [await GrpcFakeWorker().start() for _ in range(2)]
        peers = {worker.address: worker for worker in workers}
        for worker in workers:
            worker.peers, worker.delay_s = peers, 0.01
        pool = WorkerPool(SchedulerConfig(), load_tokenizer())
        await pool.start([worker.address for worker in workers], 5.0)
        server, _, port = create_server("127.0.0.1:0", interceptors=interceptors_for([KEY]))
        add_admin_to_server(pool, server)
        await server.start()
        target = ["--server", f"127.0.0.1:{port}"]

        async def drain(*args: str) -> int:
            return await asyncio.to_thread(cli.main, ["drain", *args, *target])

        first, second = (worker.address for worker in workers)
        handles = [
            pool.submit(make_request(prompt=unique_prompt(9), max_tokens=40, ignore_eos=True))
            for _ in range(6)
        ]
        await asyncio.sleep(0.2)  # some tokens out on both workers
        assert await drain("--worker", first) == 1  # no key
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert await drain("--worker", "nowhere:1", "--api-key", KEY) == 1
        assert "NOT_FOUND" in capsys.readouterr().err
        assert await drain("--worker", first, "--api-key", KEY) == 0
        out = capsys.readouterr().out
        assert f"drained {first}" in out and " 0 recomputed" in out
        assert " 0 requests moved" not in out  # it had running requests
        assert await drain("--worker", second, "--api-key", KEY) == 1
        assert "FAILED_PRECONDITION" in capsys.readouterr().err
        for handle in handles:
            tokens = 0
            while True:
                item = await asyncio.wait_for(handle.queue.get(), 20.0)
                tokens += len(item.new_token_ids)
                if item.finish_reason is not None:
                    break
            assert tokens == 40
        await server.stop(grace=None)
        await pool.stop()
        for worker in workers:
            await worker.stop()

    asyncio.run(scenario())
