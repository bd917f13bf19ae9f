"""What the core and an API process say to each other, and the compact form of the
per-step outputs, which are most of the traffic.

API process -> core: HELLO once; SUBMIT per request; ABORT when a client leaves or a
stop string ends a request; METRICS when someone scrapes the API process's /metrics;
LOAD_ADAPTER / UNLOAD_ADAPTER (LoRA); DRAIN_WORKER (AdminService). Core -> API process:
SNAPSHOT (the pool as placement and health see it, the LoRA adapters too) on every change
of workers or adapters and a few times a second; CALL_REPLY; OUTPUTS once per step with every output
and failure of that step for the requests the API process owns; METRICS answers.

An output crosses as a plain tuple, not as the dataclass: pickling a tuple of ints,
strings and lists costs a fraction of pickling a dataclass instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from common.errors import ServiceError
from scheduler_svc.core.request import FinishReason, RequestOutput

HELLO, SUBMIT, ABORT, METRICS, SNAPSHOT, OUTPUTS = (
    "hello",
    "submit",
    "abort",
    "metrics",
    "snapshot",
    "outputs",
)
# Calls on the core's pool, API process -> core: LOAD_ADAPTER / UNLOAD_ADAPTER (LoRA)
# and DRAIN_WORKER (`cbserve drain`), each a nonce and the arguments; core -> API
# process CALL_REPLY (the nonce, the result or None, an error or None). An adapter
# call's reply comes after a SNAPSHOT with the new list to every API process.
LOAD_ADAPTER, UNLOAD_ADAPTER, DRAIN_WORKER = "load_adapter", "unload_adapter", "drain_worker"
CALL_REPLY = "call_reply"
POOL_CALLS = (LOAD_ADAPTER, UNLOAD_ADAPTER, DRAIN_WORKER)

_FINISH_BY_VALUE = {reason.value: reason for reason in FinishReason}


@dataclass(frozen=True)
class EngineSnapshot:
    address: str
    capacity_tokens: int
    # The worker's WorkerDescription, serialized (the API process parses it once).
    description: bytes


@dataclass(frozen=True)
class PoolSnapshot:
    """What an API process needs of the pool: validation limits, health, placement
    counts (the core checks its limits again on every submit; these may lag)."""

    engines: tuple[EngineSnapshot, ...]
    num_waiting: int
    max_model_len: int
    vocab_size: int
    max_worker_capacity_tokens: int
    accepts_without_worker: bool
    # LoRA: whether it is on, and the registry's adapters sorted by name (AdapterInfo).
    lora_enabled: bool = False
    adapters: tuple = ()


def encode_output(output: RequestOutput) -> tuple:
    reason = output.finish_reason
    return (
        output.request_id,
        output.new_token_ids,
        None if reason is None else reason.value,
        output.prompt_tokens,
        output.completion_tokens,
        output.cached_prompt_tokens,
        output.logprobs or None,
        output.prompt_logprobs,
    )


def decode_output(fields: tuple) -> RequestOutput:
    request_id, token_ids, reason, prompt, completion, cached, logprobs, prompt_logprobs = fields
    return RequestOutput(
        request_id=request_id,
        new_token_ids=token_ids,
        new_text="",
        logprobs=logprobs or [],
        finish_reason=None if reason is None else _FINISH_BY_VALUE[reason],
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_prompt_tokens=cached,
        prompt_logprobs=prompt_logprobs,
    )


def encode_error(error: ServiceError) -> tuple[str, str]:
    return (error.message, error.code.name)


def decode_error(fields: tuple[str, str]) -> ServiceError:
    message, code_name = fields
    return ServiceError(message, grpc.StatusCode[code_name])
