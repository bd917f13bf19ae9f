"""Python client for cbserve.v1.Generation, blocking and asyncio flavours.

Sampling settings are keyword arguments named like SamplingParams' fields
(temperature, top_p, top_k, min_p, seed, max_tokens, min_tokens, stop,
stop_token_ids, ignore_eos, presence_penalty, frequency_penalty,
repetition_penalty, logprobs); what is not given takes the server's default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.grpc_options import MESSAGE_SIZE_OPTIONS

Message = tuple[str, str] | dict


def build_request(
    prompt: str | None = None,
    *,
    token_ids: Sequence[int] | None = None,
    chat: Sequence[Message] | None = None,
    request_id: str = "",
    priority: int = 0,
    **sampling,
) -> pb.GenerateRequest:
    """One of prompt, token_ids or chat; chat turns are (role, content) or {"role", "content"}.

    Lower priority values run first; other keyword arguments are SamplingParams fields.
    """
    given = [value is not None for value in (prompt, token_ids, chat)]
    if sum(given) != 1:
        raise ValueError("pass exactly one of prompt, token_ids or chat")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    request = pb.GenerateRequest(
        request_id=request_id, priority=priority, sampling=pb.SamplingParams(**sampling)
    )
    if prompt is not None:
        request.prompt = prompt
    elif token_ids is not None:
        request.prompt_token_ids.SetInParent()  # present even when empty
        request.prompt_token_ids.ids.extend(token_ids)
    else:
        request.chat.SetInParent()
        for turn in chat:
            role, content = (turn["role"], turn["content"]) if isinstance(turn, dict) else turn
            request.chat.messages.add(role=role, content=content)
    return request


@dataclass
class Completion:
    """A whole reply, assembled from the stream."""

    request_id: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str = ""
    usage: pb.Usage | None = None

    def add(self, response: pb.GenerateResponse) -> None:
        self.request_id = response.request_id
        self.text += response.text
        self.token_ids.extend(response.token_ids)
        self.logprobs.extend(response.logprobs)
        if response.finish_reason:
            self.finish_reason = pb.FinishReason.Name(response.finish_reason)
            self.usage = response.usage


class Client:
    def __init__(self, address: str = "localhost:50051") -> None:
        self._channel = grpc.insecure_channel(address, options=MESSAGE_SIZE_OPTIONS)
        self._stub = pb_grpc.GenerationStub(self._channel)

    def generate(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Iterator[pb.GenerateResponse]:
        """Streams GenerateResponses; raises grpc.RpcError on a non-OK status.

        Closing the iterator early cancels the request on the server.
        """
        call = self._stub.Generate(build_request(prompt, **kwargs), timeout=timeout)
        try:
            yield from call
        finally:
            call.cancel()

    def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Completion:
        completion = Completion()
        for response in self.generate(prompt, timeout=timeout, **kwargs):
            completion.add(response)
        return completion

    def model_info(self, timeout: float | None = 10.0) -> pb.ModelInfo:
        return self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    def __init__(self, address: str = "localhost:50051") -> None:
        self._channel = grpc.aio.insecure_channel(address, options=MESSAGE_SIZE_OPTIONS)
        self._stub = pb_grpc.GenerationStub(self._channel)

    async def generate(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> AsyncIterator[pb.GenerateResponse]:
        call = self._stub.Generate(build_request(prompt, **kwargs), timeout=timeout)
        async for response in call:
            yield response

    async def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Completion:
        completion = Completion()
        async for response in self.generate(prompt, timeout=timeout, **kwargs):
            completion.add(response)
        return completion

    async def model_info(self, timeout: float | None = 10.0) -> pb.ModelInfo:
        return await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
