"""One API process of a split scheduler (--api-processes N): the gRPC and HTTP doors
on the shared ports, over the core's pool (remote_pool.RemotePool).

Started by the core (supervisor.py) as `python -m scheduler_svc.split.api_process`
with the core's own flags, the core's socket in CBSERVE_CORE_SOCKET and its index in
CBSERVE_API_INDEX. It serves exactly what a single scheduler process serves (keys,
TLS, health, reflection, the stream limit, the drain on SIGTERM); its request
metrics go to PROMETHEUS_MULTIPROC_DIR, which the core's registry reads. It exits
when the core goes.
"""

from __future__ import annotations

import asyncio
import os
import sys

import structlog
import uvloop

from common import parent_watch
from common.defaults import default_model_path
from common.errors import StartupError
from common.grpc_server import PortUnavailable, create_server, enable_reflection, set_serving
from common.logging import configure_logging
from scheduler_svc.api.admin import SERVICE_NAME as ADMIN_SERVICE_NAME
from scheduler_svc.api.admin import add_admin_to_server
from scheduler_svc.api.server import GenerationService
from scheduler_svc.api.serving_status import follow_workers
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.wire import add_to_server
from scheduler_svc.flags import SERVICE_NAME, configs_from_args, edge_config_from_args, parse_args
from scheduler_svc.grpc_security import grpc_server_security
from scheduler_svc.lifecycle import bounded_stage, start_http, stop_event
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.split.channel import connect
from scheduler_svc.split.remote_pool import RemotePool

SOCKET_ENV, INDEX_ENV = "CBSERVE_CORE_SOCKET", "CBSERVE_API_INDEX"

log = structlog.get_logger("scheduler.api_process")


async def serve(args, socket_path: str, index: int) -> None:
    process, config, faults = configs_from_args(args)
    edge = edge_config_from_args(args)
    try:
        grpc_credentials, interceptors = grpc_server_security(edge)
        tokenizer = Tokenizer(process.tokenizer or default_model_path())
        server, health, _ = create_server(
            f"{process.host}:{process.port}",
            credentials=grpc_credentials,
            interceptors=interceptors,
            share_port=True,
        )
    except (ValueError, FileNotFoundError, PortUnavailable) as error:
        raise StartupError(str(error)) from error
    pool = RemotePool(await connect(socket_path), lora_enabled=config.lora is not None)
    reader = asyncio.create_task(pool.run(), name="core channel")
    service = GenerationService(
        pool,
        tokenizer,
        config.max_waiting_requests,
        SchedulerMetrics(tokenizer.name, engine=False),
        max_concurrent_streams=faults.max_concurrent_streams,
        remote_exposition=pool.metrics,
    )
    add_to_server(service, server)
    # cbserve drain: forwarded to the core, whose pool holds the workers.
    add_admin_to_server(pool, server)
    enable_reflection(server, [SERVICE_NAME, ADMIN_SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], serving=False)
    await server.start()
    http_front = await start_http(service, edge, process.host, server, reuse_port=True)
    pool.hello(index)
    await pool.first_snapshot.wait()
    health_task = asyncio.create_task(follow_workers(pool, health, [SERVICE_NAME]))
    stop = stop_event()
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({stopped, reader}, return_when=asyncio.FIRST_COMPLETED)
    if reader.done():
        log.error("the core process is gone; stopping", api_process=index)
    health_task.cancel()
    await asyncio.gather(health_task, return_exceptions=True)
    await set_serving(health, [SERVICE_NAME], serving=False)
    cut = await service.drain(faults.grace_period_s)
    log.info("drained", requests_cut=cut, api_process=index)
    stages = [("grpc server", server.stop(grace=1.0))]
    if http_front is not None:
        stages.insert(0, ("http server", http_front.stop()))
    for name, stage in stages:
        await bounded_stage(name, stage)
    reader.cancel()
    stopped.cancel()
    await asyncio.gather(reader, stopped, return_exceptions=True)


def main() -> int:
    parent_watch.die_with_parent()
    args = parse_args(sys.argv[1:])
    configure_logging(args.log_level)
    structlog.contextvars.bind_contextvars(api_process=int(os.environ[INDEX_ENV]))
    try:
        uvloop.run(serve(args, os.environ[SOCKET_ENV], int(os.environ[INDEX_ENV])))
    except StartupError as error:
        print(f"scheduler_svc API process: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
