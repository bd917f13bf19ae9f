"""The one stack of the storm and load tests (see harness), shared by their files."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.stacks import started_stack, stop_stack
from tests.integration.storm_and_load.harness import (
    MAX_CONCURRENT_STREAMS,
    MAX_NUM_SEQS,
    POOL_BLOCKS,
    Plan,
    StormStack,
    run_round,
    stderr_to,
)


@pytest.fixture(scope="package")
def storm_stack(tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("storm") / "children.stderr")
    with stderr_to(log_path):
        running = started_stack(
            worker_args=["--dtype", "float32", "--num-kv-blocks", str(POOL_BLOCKS)],
            scheduler_args=[
                "--max-num-seqs",
                str(MAX_NUM_SEQS),
                "--max-concurrent-streams",
                str(MAX_CONCURRENT_STREAMS),
            ],
        )
    # One request first, so that the model's first (slow) steps are not in any timing.
    asyncio.run(run_round(running.address, [([1, 2, 3], 2)], [Plan()]))
    yield StormStack(running, log_path)
    stop_stack(running)
