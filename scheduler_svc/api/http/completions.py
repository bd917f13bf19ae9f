"""/v1/completions responses: `text_completion`, streamed or not."""

from __future__ import annotations

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.shaping import Shaper, finish_reason


class CompletionShaper(Shaper):
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Where each choice's next token starts in its text (text_offset).
        self._offsets: dict[int, int] = {}

    def logprobs(self, index: int, responses: list[pb.GenerateResponse]) -> dict | None:
        if self.top_logprobs is None:
            return None
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for response in responses:
            for entry in response.logprobs:
                token = next(
                    (top.token for top in entry.top_logprobs if top.token_id == entry.token_id),
                    None,
                )
                if token is None:
                    token = self.token_text(entry.token_id)
                offset = self._offsets.get(index, 0)
                offsets.append(offset)
                self._offsets[index] = offset + len(token)
                tokens.append(token)
                token_logprobs.append(entry.logprob)
                alternatives = entry.top_logprobs[: self.top_logprobs]
                tops.append({top.token: top.logprob for top in alternatives})
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def full_choice(self, index: int, responses: list[pb.GenerateResponse]) -> dict:
        return {
            "index": index,
            "text": "".join(r.text for r in responses),
            "logprobs": self.logprobs(index, responses),
            "finish_reason": finish_reason(responses[-1]) if responses else None,
        }

    def chunk_choices(self, index: int, response: pb.GenerateResponse, first: bool) -> list[dict]:
        return [
            {
                "index": index,
                "text": response.text,
                "logprobs": self.logprobs(index, [response]),
                "finish_reason": finish_reason(response),
            }
        ]
