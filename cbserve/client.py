"""Python client for cbserve.v1.Generation, blocking (`Client`) and asyncio (`AsyncClient`).

    from cbserve import Client

    with Client("localhost:50051") as client:
        for chunk in client.generate(chat=[("user", "Hi!")], temperature=0):
            print(chunk.text, end="", flush=True)
        completion = client.complete("Once upon a time", max_tokens=32, seed=7)
        print(completion.text, completion.finish_reason, completion.usage)
        print(client.model_info().model_name)

The input is exactly one of: `prompt` (a string, tokenized by the server), `token_ids`
(a list of ints) or `chat` (turns rendered with the model's chat template). Sampling
settings are keyword arguments named like SamplingParams' fields (temperature, top_p,
top_k, min_p, seed, max_tokens, min_tokens, stop, stop_token_ids, ignore_eos,
presence_penalty, frequency_penalty, repetition_penalty, logprobs, prompt_logprobs); what
is not given takes the server's default (temperature 1, max_tokens 256: see generation.proto).
`request_id` and `priority` (lower runs first) are GenerateRequest fields.

Errors are gRPC statuses raised as `grpc.RpcError` (`grpc.aio.AioRpcError` for the
asyncio client): INVALID_ARGUMENT for bad input, with a message naming the field,
RESOURCE_EXHAUSTED when the queue is full, DEADLINE_EXCEEDED past `timeout`,
UNAVAILABLE when no server or worker answers. Example: examples/python_client.py.

A call refused with UNAVAILABLE or RESOURCE_EXHAUSTED before anything was streamed is
retried by gRPC itself, with exponential backoff, up to 5 attempts in all (`retry`,
a cbserve.retry.RetryPolicy, or None for no retries); a stream that fails after its
first response is not. See cbserve/retry.py.

A scheduler started with --api-key wants `api_key="..."` (else UNAUTHENTICATED); one
started with --tls-cert wants `tls_ca=` the CA that signed its certificate (a path or
the PEM bytes), or the connection fails with UNAVAILABLE:

    Client("scheduler.example:50051", api_key=os.environ["CBSERVE_API_KEY"], tls_ca="ca.pem")
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from cbserve.connection import call_metadata, open_channel
from cbserve.retry import DEFAULT_RETRY, RetryPolicy
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc

Message = tuple[str, str] | dict


def build_request(
    prompt: str | None = None,
    *,
    token_ids: Sequence[int] | None = None,
    chat: Sequence[Message] | None = None,
    request_id: str = "",
    priority: int = 0,
    lora_name: str = "",
    **sampling,
) -> pb.GenerateRequest:
    """The GenerateRequest that `generate` and `complete` send.

    Exactly one of prompt, token_ids or chat (else ValueError); chat turns are
    (role, content) pairs or {"role": ..., "content": ...} dicts. `request_id` is echoed
    on every response (the server assigns one when empty); lower `priority` values run
    first. `lora_name` names a LoRA adapter the server serves ("": the base model).
    Other keyword arguments are SamplingParams fields (`stop` may be one string);
    an unknown name raises ValueError.
    """
    given = [value is not None for value in (prompt, token_ids, chat)]
    if sum(given) != 1:
        raise ValueError("pass exactly one of prompt, token_ids or chat")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    request = pb.GenerateRequest(
        request_id=request_id,
        priority=priority,
        lora_name=lora_name,
        sampling=pb.SamplingParams(**sampling),
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
    """A whole reply, assembled from the stream.

    `text` and `token_ids` are the concatenated deltas, `logprobs` has one entry per
    token when asked for, `prompt_logprobs` one per prompt token when asked for (the
    first one's logprob NaN), `finish_reason` is "STOP", "LENGTH" or "ABORT", and `usage`
    (prompt_tokens, completion_tokens, cached_prompt_tokens) comes with the last message.
    """

    request_id: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str = ""
    usage: pb.Usage | None = None

    def add(self, response: pb.GenerateResponse) -> None:
        """Appends one streamed GenerateResponse."""
        self.request_id = response.request_id
        self.text += response.text
        self.token_ids.extend(response.token_ids)
        self.logprobs.extend(response.logprobs)
        self.prompt_logprobs.extend(response.prompt_logprobs)
        if response.finish_reason:
            self.finish_reason = pb.FinishReason.Name(response.finish_reason)
            self.usage = response.usage


class Client:
    """A blocking client over one gRPC channel to the scheduler at `address`.

    Thread-safe, like the channel under it. Use it as a context manager, or call close().
    `retry`: how refused calls (UNAVAILABLE, RESOURCE_EXHAUSTED) are retried, by gRPC's
    service-config retryPolicy (cbserve/retry.py); None turns retries off. A streaming
    `generate` is retried only before its first response arrives.
    `api_key`: sent as `authorization: Bearer KEY` with every call. `tls_ca`: speak TLS,
    trusting this CA (a PEM file's path or its bytes); None: plaintext.
    """

    def __init__(
        self,
        address: str = "localhost:50051",
        *,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        api_key: str | None = None,
        tls_ca: str | os.PathLike | bytes | None = None,
    ) -> None:
        self._metadata = call_metadata(api_key)
        self._channel = open_channel(address, retry, tls_ca, asyncio=False)
        self._stub = pb_grpc.GenerationStub(self._channel)

    def generate(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Iterator[pb.GenerateResponse]:
        """Streams GenerateResponses as the model produces them.

        Takes `build_request`'s arguments. Each response carries only the new `text` and
        `token_ids`; the last one has `finish_reason` and `usage`. `timeout` (seconds)
        becomes the gRPC deadline. Raises grpc.RpcError on a non-OK status. Closing the
        iterator early (break, or close()) cancels the request on the server.
        """
        call = self._stub.Generate(
            build_request(prompt, **kwargs), timeout=timeout, metadata=self._metadata
        )
        try:
            yield from call
        finally:
            call.cancel()

    def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Completion:
        """Like `generate`, but waits for the end and returns the whole reply."""
        completion = Completion()
        for response in self.generate(prompt, timeout=timeout, **kwargs):
            completion.add(response)
        return completion

    def model_info(self, timeout: float | None = 10.0) -> pb.ModelInfo:
        """GetModelInfo: model name, max_model_len, vocab size, EOS ids, block size,
        KV capacity in tokens and the connected workers."""
        return self._stub.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata
        )

    def close(self) -> None:
        """Closes the channel; streams still open are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """The asyncio flavour of `Client`: the same methods, to be awaited (`generate` is an
    async iterator), and the same `retry`, `api_key` and `tls_ca`; `async with` closes it."""

    def __init__(
        self,
        address: str = "localhost:50051",
        *,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        api_key: str | None = None,
        tls_ca: str | os.PathLike | bytes | None = None,
    ) -> None:
        self._metadata = call_metadata(api_key)
        self._channel = open_channel(address, retry, tls_ca, asyncio=True)
        self._stub = pb_grpc.GenerationStub(self._channel)

    async def generate(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Streams GenerateResponses; see `Client.generate`. Raises grpc.aio.AioRpcError
        on a non-OK status; cancelling the task cancels the request on the server."""
        call = self._stub.Generate(
            build_request(prompt, **kwargs), timeout=timeout, metadata=self._metadata
        )
        async for response in call:
            yield response

    async def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **kwargs
    ) -> Completion:
        """Like `generate`, but waits for the end and returns the whole reply."""
        completion = Completion()
        async for response in self.generate(prompt, timeout=timeout, **kwargs):
            completion.add(response)
        return completion

    async def model_info(self, timeout: float | None = 10.0) -> pb.ModelInfo:
        """GetModelInfo; see `Client.model_info`."""
        return await self._stub.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata
        )

    async def close(self) -> None:
        """Closes the channel; streams still open are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
