"""The request path is written against scheduler_svc/api/pool_view.py's Protocols; both
implementations (one process: WorkerPool, RequestHandle, WorkerEngine; an API process:
RemotePool, RemoteHandle, RemoteEngine) must offer every member. A member the request
path starts to use and only one side has fails here, not in a split deployment."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from scheduler_svc.api.pool_view import ConnectedWorker, PlacedRequest, PoolView
from scheduler_svc.split.remote_pool import RemoteEngine, RemoteHandle, RemotePool
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import RequestHandle
from scheduler_svc.workers.pool import WorkerPool


def protocol_members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name in vars(protocol) if not name.startswith("_")}
    return names


def offered(cls: type) -> set[str]:
    """Class attributes, properties and methods, dataclass fields, and what __init__
    assigns to self (read from its source: instance attributes have no other trace)."""
    names = {name for name in dir(cls) if not name.startswith("_")}
    if dataclasses.is_dataclass(cls):  # its __init__ is generated: no source
        return names | {field.name for field in dataclasses.fields(cls)}
    init = cls.__dict__.get("__init__")
    if init is not None:
        source = inspect.getsource(init)
        names |= {
            line.split("self.", 1)[1].split("=")[0].split(":")[0].strip()
            for line in source.splitlines()
            if line.strip().startswith("self.") and "=" in line
        }
    return names


@pytest.mark.parametrize(
    ("protocol", "implementations"),
    [
        (PoolView, (WorkerPool, RemotePool)),
        (PlacedRequest, (RequestHandle, RemoteHandle)),
        (ConnectedWorker, (WorkerEngine, RemoteEngine)),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_both_sides_offer_every_member(protocol, implementations):
    wanted = protocol_members(protocol)
    assert wanted, f"{protocol.__name__} lists no members"
    for cls in implementations:
        missing = wanted - offered(cls)
        assert not missing, f"{cls.__name__} lacks {sorted(missing)} of {protocol.__name__}"


def test_the_check_sees_a_missing_member():
    class Partial:
        def __init__(self):
            self.request_id = "r"

    assert protocol_members(PlacedRequest) - offered(Partial) >= {"abort", "fail", "queue"}
