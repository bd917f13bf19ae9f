"""/v1/completions responses: `text_completion`, streamed or not.

`echo` puts the prompt before each choice's text; with `logprobs` the prompt's tokens
come first in `choices[].logprobs` too, scored by the model (the request asks for
prompt logprobs), the first token's logprob and alternatives null, as OpenAI's legacy
API and vLLM give them (lm-evaluation-harness's loglikelihood requests ask this with
`max_tokens: 1`). `max_tokens: 0` with `echo` scores the prompt only: the scheduler
samples one token, which the response drops. vLLM's `prompt_logprobs: k` adds
`choices[].prompt_logprobs` in vLLM's shape: null, then per prompt token
{token id: {logprob, rank, decoded_token}} for the token and its k most likely
alternatives (rank is given for the alternatives, by their order; the prompt token
has one where it is among them).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.shaping import Shaper, finish_reason, json_logprob, usage


def _logprob(entry: pb.TokenLogprob) -> float | None:
    return None if math.isnan(entry.logprob) else json_logprob(entry.logprob)


class CompletionShaper(Shaper):
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(
        self,
        *args,
        echo: bool = False,
        prompt_only: bool = False,
        prompt_logprobs: int | None = None,
        decode: Callable[[list[int]], str] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.echo = echo
        # max_tokens 0: the one token sampled is not the client's.
        self.prompt_only = prompt_only
        self.prompt_logprobs = prompt_logprobs
        self._decode = decode
        # Where each choice's next token starts in its text (text_offset).
        self._offsets: dict[int, int] = {}

    def _token(self, entry: pb.TokenLogprob) -> str:
        for top in entry.top_logprobs:
            if top.token_id == entry.token_id:
                return top.token
        return self.token_text(entry.token_id)

    def _prompt_text(self, index: int) -> str:
        request = self.choices[index].request
        if request.WhichOneof("input") == "prompt":
            return request.prompt
        return self._decode(list(request.prompt_token_ids.ids)) if self._decode else ""

    def logprobs(
        self, index: int, responses: list[pb.GenerateResponse], first: bool
    ) -> dict | None:
        if self.top_logprobs is None:
            return None
        entries: list[pb.TokenLogprob] = []
        if self.echo and first and responses:
            entries.extend(responses[0].prompt_logprobs)
        if not self.prompt_only:
            entries.extend(entry for response in responses for entry in response.logprobs)
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for entry in entries:
            token = self._token(entry)
            offset = self._offsets.get(index, 0)
            offsets.append(offset)
            self._offsets[index] = offset + len(token)
            tokens.append(token)
            logprob = _logprob(entry)
            token_logprobs.append(logprob)
            alternatives = entry.top_logprobs[: self.top_logprobs]
            tops.append(
                None
                if logprob is None
                else {t.token: json_logprob(t.logprob) for t in alternatives}
            )
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _vllm_prompt_logprobs(self, response: pb.GenerateResponse) -> list[dict | None]:
        """vLLM's choices[].prompt_logprobs: per prompt token, null for the first."""
        shaped: list[dict | None] = []
        for entry in response.prompt_logprobs:
            logprob = _logprob(entry)
            if logprob is None:
                shaped.append(None)
                continue
            alternatives = entry.top_logprobs[: self.prompt_logprobs]
            position = {
                str(top.token_id): {
                    "logprob": top.logprob,
                    "rank": rank,
                    "decoded_token": top.token,
                }
                for rank, top in enumerate(alternatives, start=1)
            }
            if str(entry.token_id) not in position:
                position = {
                    str(entry.token_id): {"logprob": logprob, "decoded_token": self._token(entry)},
                    **position,
                }
            shaped.append(position)
        return shaped

    def _choice(self, index: int, responses: list[pb.GenerateResponse], first: bool) -> dict:
        text = "" if self.prompt_only else "".join(r.text for r in responses)
        if self.echo and first:
            text = self._prompt_text(index) + text
        choice = {
            "index": index,
            "text": text,
            "logprobs": self.logprobs(index, responses, first),
            "finish_reason": finish_reason(responses[-1]) if responses else None,
        }
        if self.prompt_logprobs is not None and first:
            choice["prompt_logprobs"] = (
                self._vllm_prompt_logprobs(responses[0]) if responses else None
            )
        return choice

    def full_choice(self, index: int, responses: list[pb.GenerateResponse]) -> dict:
        return self._choice(index, responses, first=True)

    def chunk_choices(self, index: int, response: pb.GenerateResponse, first: bool) -> list[dict]:
        return [self._choice(index, [response], first)]

    def usage(self, finals: dict[int, pb.GenerateResponse]) -> dict:
        counted = usage(self.choices, finals)
        if self.prompt_only:
            counted["completion_tokens"] = 0
            counted["total_tokens"] = counted["prompt_tokens"]
        return counted
