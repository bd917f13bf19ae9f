"""A client holding no .proto file and no generated code lists and calls every method.

Everything here comes from server reflection: grpcio-reflection's
ProtoReflectionDescriptorDatabase fetches the descriptors, a fresh DescriptorPool
builds them, and message classes are made from those descriptors at run time.
This module deliberately imports nothing from cbserve.v1 or cbserve.worker.v1;
other modules of the session may have, so the pool used is never the default one.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.integration.conftest import POOL_STACK_BLOCKS

REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
HEALTH = "grpc.health.v1.Health"


@pytest.fixture(scope="module")
def reflected_stack(pool_stack):
    return pool_stack  # the session's, with POOL_STACK_BLOCKS blocks


class ReflectedServer:
    """Calls any method of a server by name, with requests and replies as dicts."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.database = ProtoReflectionDescriptorDatabase(channel)
        self.pool = DescriptorPool(self.database)

    def services(self) -> list[str]:
        return list(self.database.get_services())

    def methods(self, service: str) -> list[str]:
        return [method.name for method in self.pool.FindServiceByName(service).methods]

    def call(self, service: str, method: str, request: dict, timeout: float = 120.0) -> list[dict]:
        """Every reply, for unary and server-streaming methods alike."""
        descriptor = self.pool.FindServiceByName(service).methods_by_name[method]
        request_class = GetMessageClass(descriptor.input_type)
        reply_class = GetMessageClass(descriptor.output_type)
        make_call = (
            self.channel.unary_stream if descriptor.server_streaming else self.channel.unary_unary
        )
        stub = make_call(
            f"/{service}/{method}",
            request_serializer=request_class.SerializeToString,
            response_deserializer=reply_class.FromString,
        )
        replies = stub(json_format.ParseDict(request, request_class()), timeout=timeout)
        if not descriptor.server_streaming:
            replies = [replies]
        return [json_format.MessageToDict(reply) for reply in replies]


def test_scheduler_lists_its_services_and_their_methods(reflected_stack):
    with grpc.insecure_channel(reflected_stack.address) as channel:
        server = ReflectedServer(channel)
        assert set(server.services()) == {
            "cbserve.v1.Generation",
            "cbserve.v1.AdminService",
            HEALTH,
            REFLECTION,
        }
        assert server.methods("cbserve.v1.Generation") == ["Generate", "GetModelInfo"]


def test_generate_through_reflection_alone(reflected_stack):
    with grpc.insecure_channel(reflected_stack.address) as channel:
        server = ReflectedServer(channel)
        replies = server.call(
            "cbserve.v1.Generation",
            "Generate",
            {
                "requestId": "reflection-1",
                "chat": {"messages": [{"role": "user", "content": "What is 2+2?"}]},
                "sampling": {"temperature": 0, "maxTokens": 12},
            },
        )
        info = server.call("cbserve.v1.Generation", "GetModelInfo", {})
        health = server.call(HEALTH, "Check", {"service": "cbserve.v1.Generation"})
    assert all(reply["requestId"] == "reflection-1" for reply in replies)
    final = replies[-1]
    assert final["finishReason"] in ("STOP", "LENGTH")
    assert int(final["usage"]["completionTokens"]) == sum(
        len(r.get("tokenIds", [])) for r in replies
    )
    assert "".join(reply.get("text", "") for reply in replies).strip()
    assert info[0]["modelName"] and info[0]["numWorkers"] == 1
    assert health == [{"status": "SERVING"}]


def test_invalid_request_through_reflection_gets_its_status(reflected_stack):
    with grpc.insecure_channel(reflected_stack.address) as channel:
        server = ReflectedServer(channel)
        with pytest.raises(grpc.RpcError) as raised:
            server.call(
                "cbserve.v1.Generation", "Generate", {"prompt": "hi", "sampling": {"topP": 2}}
            )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_worker_lists_and_describes_itself_through_reflection(reflected_stack):
    address = f"{reflected_stack.host}:{reflected_stack.worker_ports[0]}"
    with grpc.insecure_channel(address) as channel:
        server = ReflectedServer(channel)
        assert set(server.services()) == {"cbserve.worker.v1.Worker", HEALTH, REFLECTION}
        assert server.methods("cbserve.worker.v1.Worker") == [
            "Describe",
            "Step",
            "LoadAdapter",
            "UnloadAdapter",
            "SendKv",
            "ReceiveKv",
        ]
        (description,) = server.call("cbserve.worker.v1.Worker", "Describe", {})
        (health,) = server.call(HEALTH, "Check", {})
    assert int(description["numKvBlocks"]) == POOL_STACK_BLOCKS
    assert health == {"status": "SERVING"}
