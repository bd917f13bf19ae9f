"""SamplingParams to and from its two wire forms, field by field by name.

- the client's `cbserve.v1.SamplingParams` (the public API): a field left unset takes
  the dataclass field's default, so the defaults live in one place
  (common/sampling_params.py); the HTTP front writes it from an OpenAI body by name;
- the worker protocol's `cbserve.worker.v1.SequenceSampling`: what the sampler needs
  of it (no stop strings: those are the scheduler's).

Nothing here names a sampling setting except where a wire name differs from the
dataclass's (WORKER_WIRE_NAMES): a new setting is a field of the proto(s) and of the
dataclass, with the same name, and this file carries it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from google.protobuf.message import Message

from cbserve.v1 import generation_pb2 as pb
from cbserve.worker.v1 import worker_pb2 as wpb
from common.sampling_params import SamplingParams

# Worker wire name -> dataclass field, where they differ.
WORKER_WIRE_NAMES = {"num_logprobs": "logprobs"}
_DATACLASS_FIELDS = frozenset(field.name for field in dataclasses.fields(SamplingParams))


def _values_from(message: Message, renames: dict[str, str]) -> dict[str, Any]:
    """The dataclass fields the message sets: an unset optional field is left out (the
    dataclass's default applies), a repeated one becomes a tuple."""
    values: dict[str, Any] = {}
    for wire in message.DESCRIPTOR.fields:
        name = renames.get(wire.name, wire.name)
        if name not in _DATACLASS_FIELDS:
            continue
        if wire.has_presence and not message.HasField(wire.name):
            continue
        value = getattr(message, wire.name)
        values[name] = tuple(value) if wire.is_repeated else value
    return values


def _fill(message: Message, value_of: Callable[[str], Any], renames: dict[str, str]) -> Message:
    """Sets every field of message that the dataclass has to value_of(its dataclass name);
    None leaves it unset."""
    for wire in message.DESCRIPTOR.fields:
        name = renames.get(wire.name, wire.name)
        if name not in _DATACLASS_FIELDS:
            continue
        value = value_of(name)
        if value is None:
            continue
        if wire.is_repeated:
            getattr(message, wire.name).extend(value)
        else:
            setattr(message, wire.name, value)
    return message


def sampling_from_request(message: pb.SamplingParams) -> SamplingParams:
    """The client's settings, validated; raises InvalidArgument naming the field."""
    return SamplingParams(
        **_values_from(message, {}), max_tokens_explicit=message.HasField("max_tokens")
    )


def sampling_request_from(values: Mapping[str, Any]) -> pb.SamplingParams:
    """The client's message holding `values`, by field name (a missing or None one stays
    unset: the default): how the HTTP front writes an OpenAI body's settings."""
    return _fill(pb.SamplingParams(), values.get, {})


def sampling_to_worker(sampling: SamplingParams) -> wpb.SequenceSampling:
    """The plan's per-sequence settings, min_tokens_banned_ids included: the scheduler
    filled that field in for the model's EOS when it took the request in."""
    return _fill(wpb.SequenceSampling(), partial(getattr, sampling), WORKER_WIRE_NAMES)


def sampling_from_worker(message: wpb.SequenceSampling) -> SamplingParams:
    """A plan's settings, validated again on the worker, so that a plan from anything
    but the scheduler cannot put a NaN or a negative top_p into the sampler (a
    ValueError refuses the plan)."""
    values = _values_from(message, WORKER_WIRE_NAMES)
    # 0 from a scheduler that predates the field: as many as min_tokens asks.
    values["max_tokens"] = max(message.max_tokens, message.min_tokens, 1)
    return SamplingParams(**values)
