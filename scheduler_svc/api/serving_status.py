"""The scheduler's health status follows its workers: SERVING while one is connected.

Both the overall status ("", what probes ask by default) and the Generation
service's: a scheduler without a connected worker can only answer UNAVAILABLE,
so load balancers and Kubernetes readiness should send clients elsewhere.
The pool's `changed` is set at every connect and disconnect; it is cleared
before the pool is read, so a change during the health update is not missed.
"""

from __future__ import annotations

import structlog

from common.grpc_server import set_serving
from scheduler_svc.api.pool_view import PoolView

log = structlog.get_logger("scheduler.health")


async def follow_workers(pool: PoolView, health_servicer, service_names: list[str]) -> None:
    """Runs until cancelled."""
    serving: bool | None = None
    while True:
        pool.changed.clear()
        connected = len(pool.connected_engines())
        if (connected > 0) != serving:
            serving = connected > 0
            await set_serving(health_servicer, service_names, serving=serving)
            log.info("serving" if serving else "not serving", workers_connected=connected)
        await pool.changed.wait()
