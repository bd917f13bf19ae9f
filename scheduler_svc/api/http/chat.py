"""/v1/chat/completions responses: `chat.completion` and `chat.completion.chunk`.

With tools (tools.py), a reply that is a call is answered as `tool_calls` with
finish_reason "tool_calls"; a forced call (named or required) cut by max_tokens is
still answered as `tool_calls`, with finish_reason "length", as vLLM answers it.
A stream holds a choice's text back while it may still become a call (always, for a
forced call) and sends the call whole, arguments included, in the choice's last
chunk; text found not to be a call is sent as content from then on. Held text carries no logprobs.
"""

from __future__ import annotations

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.shaping import Shaper, finish_reason, json_logprob
from scheduler_svc.api.http.tools import ToolPlan

TOOL_CALLS = "tool_calls"


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": json_logprob(logprob), "bytes": list(token.encode())}


class ChatShaper(Shaper):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, *args, tools: ToolPlan | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tools = tools
        # Per choice: the text held back while it may be a call; the choices whose
        # text is not a call (streamed as it comes); those whose role was sent.
        self._held: dict[int, str] = {}
        self._passing: set[int] = set()
        self._role_sent: set[int] = set()

    def logprobs(self, responses: list[pb.GenerateResponse]) -> dict | None:
        if self.top_logprobs is None:
            return None
        content = []
        for response in responses:
            for entry in response.logprobs:
                alternatives = entry.top_logprobs
                token = next(
                    (top.token for top in alternatives if top.token_id == entry.token_id),
                    None,
                )
                if token is None:
                    token = self.token_text(entry.token_id)
                item = _entry(token, entry.logprob)
                item["top_logprobs"] = [
                    _entry(top.token, top.logprob) for top in alternatives[: self.top_logprobs]
                ]
                content.append(item)
        return {"content": content}

    def _calls(self, text: str, reason: str | None) -> list[dict] | None:
        if self.tools is None:
            return None
        if reason == "stop":
            return self.tools.calls(text)
        # A forced reply is a call even when max_tokens cut it; an "auto" one cut short,
        # or any reply aborted, is returned as text.
        if reason == "length":
            return self.tools.cut_calls(text)
        return None

    def full_choice(self, index: int, responses: list[pb.GenerateResponse]) -> dict:
        text = "".join(r.text for r in responses)
        reason = finish_reason(responses[-1]) if responses else None
        message: dict = {"role": "assistant", "content": text}
        calls = self._calls(text, reason)
        if calls:
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            reason = TOOL_CALLS if reason == "stop" else reason
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs(responses),
            "finish_reason": reason,
        }

    def chunk_choices(self, index: int, response: pb.GenerateResponse, first: bool) -> list[dict]:
        if self.tools is not None and index not in self._passing:
            return self._tool_chunk(index, response)
        return [self._chunk_choice(index, {"content": response.text}, response, first)]

    def _chunk_choice(
        self, index: int, delta: dict, response: pb.GenerateResponse, first: bool
    ) -> dict:
        if first:
            # OpenAI's first delta of a choice names the role.
            delta = {"role": "assistant", **delta}
        return {
            "index": index,
            "delta": delta,
            "logprobs": self.logprobs([response]),
            "finish_reason": finish_reason(response),
        }

    def _tool_chunk(self, index: int, response: pb.GenerateResponse) -> list[dict]:
        """A chunk of a choice that may be a call: none while held, the call at its end."""
        text = self._held.pop(index, "") + response.text
        reason = finish_reason(response)
        first = index not in self._role_sent
        if reason is None and self.tools.may_become_call(text):
            self._held[index] = text
            return []
        self._role_sent.add(index)
        calls = self._calls(text, reason)
        if calls:
            delta = {"role": "assistant", "content": None}
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            reason = TOOL_CALLS if reason == "stop" else reason
            return [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}]
        self._passing.add(index)
        choice = self._chunk_choice(index, {"content": text}, response, first)
        choice["logprobs"] = None if text != response.text else choice["logprobs"]
        return [choice]
