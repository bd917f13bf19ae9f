"""OpenAI request bodies -> cbserve.v1.GenerateRequests: the one translation.

One GenerateRequest per choice: `n` choices of each prompt (a completions call may
send several prompts, whose choices are numbered prompt by prompt, as OpenAI does).
Everything else a request means is decided on the one request path; what is
only HTTP's (n, the logprobs switches, echo) is checked and worked out here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from common.sampling_codec import sampling_request_from
from scheduler_svc.api.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)
from scheduler_svc.api.http.tools import template_tools, tool_plan

SEED_MODULUS = 2**64
# Prompts times n: every choice is a request in the scheduler, so one call is bounded.
MAX_REQUESTS_PER_CALL = 64


@dataclass(frozen=True)
class Choice:
    """One choice of the response: its index, and the request that produces it."""

    index: int
    # Which prompt it answers (choices of one prompt share the prompt's usage).
    prompt_index: int
    request: pb.GenerateRequest


def _sampling(body: SamplingFields, max_tokens: int | None, logprobs: int) -> pb.SamplingParams:
    """The body's sampling fields under their proto names; one the body leaves at None
    stays unset, which the scheduler reads as the default."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    # Where HTTP's field means something else than the proto's of the same name.
    worked_out = {"max_tokens": max_tokens, "logprobs": logprobs, "stop": stop}
    return sampling_request_from({**dict(body), **worked_out})


def _choices(
    body: SamplingFields, prompts: list[pb.GenerateRequest], request_id: str
) -> list[Choice]:
    """n copies of each prompt's request, each with its own id and seed."""
    choices: list[Choice] = []
    total = len(prompts) * body.n
    if total > MAX_REQUESTS_PER_CALL:
        raise InvalidArgument(
            "n", f"{len(prompts)} prompts times n={body.n} is over {MAX_REQUESTS_PER_CALL} choices"
        )
    for prompt_index, template in enumerate(prompts):
        for copy in range(body.n):
            index = prompt_index * body.n + copy
            request = pb.GenerateRequest()
            request.CopyFrom(template)
            # One id per request in the scheduler, all found by the response's id.
            request.request_id = request_id if total == 1 else f"{request_id}-{index}"
            if body.seed is not None and index:
                # Choice i samples with seed + i: with one seed for all, the n choices
                # of a prompt would be n copies of the same text.
                request.sampling.seed = (body.seed + index) % SEED_MODULUS
            choices.append(Choice(index, prompt_index, request))
    return choices


def structured_output(body: SamplingFields) -> pb.StructuredOutput | None:
    """response_format (OpenAI) or structured_outputs (vLLM) as the proto's constraint;
    its content (schema, regex, grammar) is checked on the one request path."""
    outputs: list[pb.StructuredOutput] = []
    form = body.response_format
    if form is not None and form.type == "json_object":
        outputs.append(pb.StructuredOutput(json_object=True))
    elif form is not None and form.type == "json_schema":
        if form.json_schema is None or form.json_schema.json_schema is None:
            raise InvalidArgument("response_format.json_schema.schema", "is required")
        outputs.append(pb.StructuredOutput(json_schema=json.dumps(form.json_schema.json_schema)))
    vllm = body.structured_outputs
    if vllm is not None:
        given = {
            name: value
            for name, value in (
                ("json", vllm.json_value),
                ("regex", vllm.regex),
                ("choice", vllm.choice),
                ("grammar", vllm.grammar),
                ("json_object", vllm.json_object or None),
            )
            if value is not None
        }
        if len(given) != 1:
            raise InvalidArgument(
                "structured_outputs",
                "set exactly one of json, regex, choice, grammar, json_object",
            )
        [(name, value)] = given.items()
        if name == "json":
            text = value if isinstance(value, str) else json.dumps(value)
            outputs.append(pb.StructuredOutput(json_schema=text))
        elif name == "choice":
            outputs.append(pb.StructuredOutput(choice=pb.ChoiceList(choices=value)))
        else:
            outputs.append(pb.StructuredOutput(**{name: value}))
    if len(outputs) > 1:
        raise InvalidArgument("structured_outputs", "give response_format or it, not both")
    return outputs[0] if outputs else None


def chat_top_logprobs(body: ChatCompletionRequest) -> int | None:
    """How many alternatives each token's logprobs list, or None for no logprobs."""
    if not body.logprobs:
        if body.top_logprobs:
            raise InvalidArgument("top_logprobs", "needs logprobs: true")
        return None
    return body.top_logprobs or 0


def chat_requests(body: ChatCompletionRequest, request_id: str) -> list[Choice]:
    top = chat_top_logprobs(body)
    # The proto's logprobs N returns each token's logprob with its N most likely
    # alternatives; 0 returns none, so "the sampled token only" asks for 1 and the
    # response drops the alternatives.
    logprobs = 0 if top is None else max(top, 1)
    # max_completion_tokens is OpenAI's newer name; it wins when both are sent (as in vLLM).
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    request = pb.GenerateRequest(
        sampling=_sampling(body, max_tokens, logprobs), priority=body.priority
    )
    request.chat.SetInParent()
    for message in body.messages:
        request.chat.messages.add(role=message.role, content=message.text())
    constraint = structured_output(body)
    tools = tool_plan(body)
    if tools is not None:
        request.chat.tools.extend(template_tools(body))
        if tools.forced:
            if constraint is not None:
                raise InvalidArgument(
                    "tool_choice", "a required or named tool call cannot have a response_format"
                )
            constraint = tools.constraint()
    if constraint is not None:
        request.structured_output.CopyFrom(constraint)
    return _choices(body, [request], request_id)


def completion_prompt_logprobs(body: CompletionRequest) -> int | None:
    """The prompt logprobs a completions call asks for: what `echo` with `logprobs`
    shows (the prompt's tokens with that many alternatives), and vLLM's
    `prompt_logprobs`; the larger of the two, or None."""
    wanted = [body.prompt_logprobs]
    if body.echo and body.logprobs is not None:
        wanted.append(body.logprobs)
    asked = [k for k in wanted if k is not None]
    return max(asked) if asked else None


def scores_prompt_only(body: CompletionRequest) -> bool:
    """`echo` with `max_tokens: 0`: the prompt is the whole answer (lm-evaluation-harness's
    loglikelihood). The scheduler still samples one token; the response drops it."""
    return body.echo and body.max_tokens == 0


def completion_requests(body: CompletionRequest, request_id: str) -> list[Choice]:
    if body.logprobs is not None and body.logprobs < 0:
        raise InvalidArgument("logprobs", f"must be >= 0, got {body.logprobs}")
    logprobs = 0 if body.logprobs is None else max(body.logprobs, 1)
    max_tokens = 1 if scores_prompt_only(body) else body.max_tokens
    sampling = _sampling(body, max_tokens, logprobs)
    prompt_logprobs = completion_prompt_logprobs(body)
    if prompt_logprobs is not None:
        sampling.prompt_logprobs = prompt_logprobs
    prompts = body.prompt
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        raise InvalidArgument("prompt", "must not be empty")
    requests = []
    constraint = structured_output(body)
    for prompt in prompts:
        request = pb.GenerateRequest(
            sampling=sampling, priority=body.priority, structured_output=constraint
        )
        if isinstance(prompt, str):
            request.prompt = prompt
        else:
            request.prompt_token_ids.SetInParent()  # present even when empty
            request.prompt_token_ids.ids.extend(prompt)
        requests.append(request)
    return _choices(body, requests, request_id)
