"""/v1/chat/completions responses: `chat.completion` and `chat.completion.chunk`."""

from __future__ import annotations

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.shaping import Shaper, finish_reason


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


class ChatShaper(Shaper):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

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

    def full_choice(self, index: int, responses: list[pb.GenerateResponse]) -> dict:
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(r.text for r in responses)},
            "logprobs": self.logprobs(responses),
            "finish_reason": finish_reason(responses[-1]) if responses else None,
        }

    def chunk_choices(self, index: int, response: pb.GenerateResponse, first: bool) -> list[dict]:
        delta: dict = {"content": response.text}
        if first:
            # OpenAI's first delta of a choice names the role.
            delta = {"role": "assistant", **delta}
        return [
            {
                "index": index,
                "delta": delta,
                "logprobs": self.logprobs([response]),
                "finish_reason": finish_reason(response),
            }
        ]
