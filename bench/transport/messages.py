"""The messages between a scheduler's core process and its API processes, and two codecs.

The shapes are those of issue 21's split: once per step the core sends each API process
ONE message with the outputs of that step for every request the process owns; an API
process sends the core one message per submitted request (and sometimes an abort).

Each codec turns a message into bytes and back into objects the receiver can use:
- `msgspec`: msgspec Structs encoded as MessagePack arrays (array_like=True: no field
  names on the wire), decoded straight into Structs by a typed decoder;
- `pickle`: protocol 5 over plain tuples and dicts, pickle's best case (a dataclass or
  any class with a __reduce__ would cost more per entry).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec


# gc=False: decoded by the hundred every step and never part of a reference cycle, so the
# garbage collector need not track them (the lists inside them are still tracked).
class RequestOutput(msgspec.Struct, array_like=True, gc=False):
    """What one request got from one step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    logprobs: list[tuple[int, float]]


class StepOutputs(msgspec.Struct, array_like=True, gc=False):
    """core -> one API process, once a step."""

    step: int
    sent_at_ns: int
    outputs: list[RequestOutput]


class SamplingParams(msgspec.Struct, array_like=True, gc=False):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int = 0
    skip_special_tokens: bool = True
    n: int = 1


# tag=True: the core decodes one union of every message an API process may send.
class Submit(msgspec.Struct, array_like=True, gc=False, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int
    deadline: float | None
    sent_at_ns: int


class Abort(msgspec.Struct, array_like=True, gc=False, tag=True):
    request_id: str


ApiToCore = Submit | Abort


@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[Any], bytes]
    decode_outputs: Callable[[Any], Any]
    decode_request: Callable[[Any], Any]
    build_outputs: Callable[[int, int, int], Any]
    build_submit: Callable[[int, int], Any]
    stamp: Callable[[Any, int], Any]
    sent_at: Callable[[Any], int]


def _request_id(index: int) -> str:
    return f"req-{index:08d}-4f1c2b7a9e3d5a60c81e"  # 32 characters, as a uuid-ish id


def _struct_outputs(entries: int, step: int, sent_at_ns: int) -> StepOutputs:
    return StepOutputs(
        step=step,
        sent_at_ns=sent_at_ns,
        outputs=[
            RequestOutput(_request_id(i), [1000 + i], None, 64, step, 0, []) for i in range(entries)
        ],
    )


def _tuple_outputs(entries: int, step: int, sent_at_ns: int) -> tuple:
    return (
        step,
        sent_at_ns,
        [(_request_id(i), [1000 + i], None, 64, step, 0, []) for i in range(entries)],
    )


def _struct_submit(index: int, prompt_tokens: int) -> Submit:
    return Submit(
        _request_id(index),
        list(range(1000, 1000 + prompt_tokens)),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=256, seed=index),
        0,
        None,
        0,
    )


def _tuple_submit(index: int, prompt_tokens: int) -> tuple:
    sampling = {
        field: getattr(SamplingParams(), field) for field in SamplingParams.__struct_fields__
    }
    sampling.update(temperature=0.7, top_p=0.9, max_tokens=256, seed=index)
    return (
        "submit",
        _request_id(index),
        list(range(1000, 1000 + prompt_tokens)),
        sampling,
        0,
        None,
        0,
    )


def _struct_stamp(message: Any, now_ns: int) -> Any:
    message.sent_at_ns = now_ns
    return message


def _tuple_stamp(message: tuple, now_ns: int) -> tuple:
    # Both tuple messages carry their time stamp last but one (outputs) or last (submit).
    if message[0] == "submit":
        return (*message[:-1], now_ns)
    return (message[0], now_ns, message[2])


def _tuple_sent_at(message: tuple) -> int:
    return message[-1] if message[0] == "submit" else message[1]


_encoder = msgspec.msgpack.Encoder()
_outputs_decoder = msgspec.msgpack.Decoder(StepOutputs)
_request_decoder = msgspec.msgpack.Decoder(ApiToCore)

MSGSPEC = Codec(
    name="msgspec",
    encode=_encoder.encode,
    decode_outputs=_outputs_decoder.decode,
    decode_request=_request_decoder.decode,
    build_outputs=_struct_outputs,
    build_submit=_struct_submit,
    stamp=_struct_stamp,
    sent_at=lambda message: message.sent_at_ns,
)
PICKLE = Codec(
    name="pickle",
    encode=lambda message: pickle.dumps(message, protocol=5),
    decode_outputs=pickle.loads,
    decode_request=pickle.loads,
    build_outputs=_tuple_outputs,
    build_submit=_tuple_submit,
    stamp=_tuple_stamp,
    sent_at=_tuple_sent_at,
)
CODECS = {codec.name: codec for codec in (MSGSPEC, PICKLE)}


def codec_costs(codec: Codec, entries: int, prompt_tokens: int, rounds: int) -> dict[str, float]:
    """In one process, no transport: CPU us per output entry to encode and to decode a
    StepOutputs of `entries`, and us per Submit of `prompt_tokens` ids. What a transport
    row costs beyond these is the transport's own."""
    outputs = codec.build_outputs(entries, 1, 0)
    submit = codec.build_submit(0, prompt_tokens)
    outputs_payload, submit_payload = codec.encode(outputs), codec.encode(submit)
    timings = {
        "encode outputs": (lambda: codec.encode(outputs), entries),
        "decode outputs": (lambda: codec.decode_outputs(outputs_payload), entries),
        "encode submit": (lambda: codec.encode(submit), 1),
        "decode submit": (lambda: codec.decode_request(submit_payload), 1),
    }
    costs = {}
    for name, (work, per) in timings.items():
        start = time.process_time()
        for _ in range(rounds):
            work()
        costs[name] = (time.process_time() - start) * 1e6 / (rounds * per)
    return costs
