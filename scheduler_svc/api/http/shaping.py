"""What chat and completions responses share: ids, finish reasons, usage, and the
server-sent-event stream that interleaves the choices.

A Shaper turns the GenerateResponses of one call's choices into OpenAI's JSON: the
whole response (collected) or its chunks (streamed, `data: {...}\n\n` each, then
`data: [DONE]`). chat.py and completions.py say what a choice looks like.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

from cbserve.v1 import generation_pb2 as pb
from common.errors import ServiceError
from scheduler_svc.api.http.errors import from_service_error
from scheduler_svc.api.http.fan_out import FanOut
from scheduler_svc.api.http.translate import Choice

FINISH_REASONS = {pb.STOP: "stop", pb.LENGTH: "length", pb.ABORT: "abort"}
DONE_EVENT = "data: [DONE]\n\n"


# JSON has no -Infinity: a token the allowed-token mask banned (structured outputs)
# has logprob -inf, and goes out as this, the floor vLLM's API server uses.
MIN_LOGPROB = -9999.0


def json_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def finish_reason(response: pb.GenerateResponse) -> str | None:
    return FINISH_REASONS.get(response.finish_reason)


def usage(choices: list[Choice], finals: dict[int, pb.GenerateResponse]) -> dict:
    """Usage over the choices that have finished. As OpenAI and vLLM count, a prompt is
    counted once however many choices answer it (its first choice's numbers), and
    the completion tokens of every choice are summed."""
    prompt_tokens = cached = completion_tokens = 0
    counted_prompts: set[int] = set()
    for choice in choices:
        final = finals.get(choice.index)
        if final is None:
            continue
        completion_tokens += final.usage.completion_tokens
        if choice.prompt_index not in counted_prompts:
            counted_prompts.add(choice.prompt_index)
            prompt_tokens += final.usage.prompt_tokens
            cached += final.usage.cached_prompt_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Shaper:
    """One call's response; subclasses give the object names and the choice shapes."""

    id_prefix = ""
    object_name = ""
    chunk_object_name = ""

    def __init__(
        self,
        request_id: str,
        model: str,
        choices: list[Choice],
        token_text: Callable[[int], str],
        top_logprobs: int | None = None,
        include_usage: bool = False,
    ) -> None:
        self.id = self.id_prefix + request_id
        self.model = model
        self.created = int(time.time())
        self.choices = choices
        self.token_text = token_text
        # None: no logprobs; else how many alternatives each token lists.
        self.top_logprobs = top_logprobs
        self.include_usage = include_usage

    # What a subclass says.
    def full_choice(self, index: int, responses: list[pb.GenerateResponse]) -> dict:
        raise NotImplementedError

    def chunk_choices(self, index: int, response: pb.GenerateResponse, first: bool) -> list[dict]:
        raise NotImplementedError

    def usage(self, finals: dict[int, pb.GenerateResponse]) -> dict:
        return usage(self.choices, finals)

    def _envelope(self, object_name: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def response(self, collected: dict[int, list[pb.GenerateResponse]]) -> dict:
        body = self._envelope(
            self.object_name,
            [self.full_choice(index, collected[index]) for index in sorted(collected)],
        )
        finals = {index: responses[-1] for index, responses in collected.items() if responses}
        body["usage"] = self.usage(finals)
        return body

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = self._envelope(self.chunk_object_name, choices)
        if self.include_usage:
            # OpenAI: with include_usage, every chunk but the last has usage: null.
            chunk["usage"] = None
        return chunk

    async def stream(self, fan_out: FanOut) -> AsyncIterator[str]:
        """The events of a stream whose choices have all answered once (FanOut.first).

        If the client goes away, Starlette cancels this generator at its await: the
        finally cancels the choices, and their requests are aborted."""
        started: set[int] = set()
        finals: dict[int, pb.GenerateResponse] = {}
        try:
            async for index, response in fan_out.events():
                first = index not in started
                started.add(index)
                if response.finish_reason:
                    finals[index] = response
                choices = self.chunk_choices(index, response, first)
                if choices:  # none while a choice holds its text back (chat.py, tools)
                    yield sse(self._chunk(choices))
            if self.include_usage:
                last = self._envelope(self.chunk_object_name, [])
                last["usage"] = self.usage(finals)
                yield sse(last)
        except ServiceError as error:
            # The status line is sent already: the error is the stream's last event.
            yield from_service_error(error).sse()
        finally:
            fan_out.cancel()
        yield DONE_EVENT
