"""One benchmark request through an OpenAI-compatible /v1/completions stream: the
request body, the POST, and the server-sent events folded into the same RequestTiming
that cbserve's gRPC stream fills. Used by the llama.cpp baseline (llama-server) and by
`--backend openai` (any OpenAI-compatible server, cbserve's HTTP front included).

What llama-server accepts (tools/server in llama.cpp): `prompt` as a list of token
ids is used as is (no BOS added, no tokenizing: the exact ids cbserve gets);
`max_tokens` (its `n_predict`); `ignore_eos` bans the end-of-generation tokens, so a
request runs to exactly max_tokens as cbserve's do; `timings_per_token` adds a
`timings` object to every chunk whose `predicted_n` counts the tokens generated so
far. That count, not the number of chunks, is what is timed: a token that ends in
the middle of a UTF-8 character is held back and sent with the next one, so one
chunk can carry two tokens (and cbserve's ITL is per message too).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from bench.harness.metrics import RequestTiming
from bench.harness.workload import BenchRequest

DONE = "[DONE]"
# A few tokens outside the workload, so that the first timed request does not pay
# for the server's first decode (allocations, thread start-up).
WARM_UP = BenchRequest(index=-1, prompt_token_ids=[28, 29, 30, 31], max_tokens=4, seed=0)


def completion_body(request: BenchRequest, temperature: float, ignore_eos: bool) -> dict:
    return {
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens,
        "temperature": temperature,
        "seed": request.seed,
        "ignore_eos": ignore_eos,
        "stream": True,
        "timings_per_token": True,
    }


def openai_completion_body(
    request: BenchRequest, temperature: float, ignore_eos: bool, model: str | None
) -> dict:
    """The body for a server that speaks the OpenAI API and vLLM's extra fields, but
    not llama-server's: the token count comes from `usage` at the end of the stream
    (stream_options.include_usage), and `ignore_eos` is sent only when on (a server
    that does not know it would otherwise refuse a field that asks for nothing)."""
    body = {
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens,
        "temperature": temperature,
        "seed": request.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # An adapter is named by the `model` field, as vLLM's bench sends --lora-modules.
    model = request.lora_name or model
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def stream_completion(
    session, endpoint: str, body: dict, prompt_tokens: int, headers: dict | None = None
) -> RequestTiming:
    """POSTs one streaming completion to endpoint (an aiohttp session) and times it."""
    import aiohttp

    timing = RequestTiming(prompt_tokens=prompt_tokens, sent_at=time.perf_counter())
    tally = StreamTally(timing)
    try:
        async with session.post(endpoint, json=body, headers=headers) as response:
            if response.status != 200:
                timing.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return timing
            async for line in response.content:  # one event-stream line at a time
                data = sse_data(line.decode("utf-8", errors="replace").rstrip("\r\n"))
                if data is not None:
                    tally.add(data, time.perf_counter())
    except aiohttp.ClientError as error:
        timing.error = f"{type(error).__name__}: {error}"
        return timing
    return tally.finish()


def sse_data(line: str) -> str | None:
    """The payload of one `data:` line of an event stream; None for anything else
    (blank separators, comments, other fields)."""
    if not line.startswith("data:"):
        return None
    return line[len("data:") :].strip()


@dataclass
class StreamTally:
    """Folds a completion stream's chunks into a RequestTiming as they arrive."""

    timing: RequestTiming
    _counted: int = 0
    done: bool = False

    def add(self, payload: str, at: float | None = None) -> None:
        """One `data:` payload, received at `at` (perf_counter seconds)."""
        if payload == DONE:
            self.done = True
            return
        at = time.perf_counter() if at is None else at
        chunk = json.loads(payload)
        if "error" in chunk:
            error = chunk["error"]
            self.timing.error = (
                error.get("message", str(error)) if isinstance(error, dict) else error
            )
            return
        choices = chunk.get("choices") or [{}]
        generated = self._generated(chunk, choices[0])
        if generated > self._counted:
            self.timing.chunks.append((at, generated - self._counted))
            self._counted = generated
        reason = choices[0].get("finish_reason")
        if reason:
            self.timing.finish_reason = reason.upper()  # "length" -> "LENGTH", as cbserve's

    def _generated(self, chunk: dict, choice: dict) -> int:
        """Tokens generated so far, by the best count the chunk carries."""
        usage = chunk.get("usage") or {}
        if "completion_tokens" in usage:  # the last chunk
            return int(usage["completion_tokens"])
        timings = chunk.get("timings") or {}
        if "predicted_n" in timings:
            return int(timings["predicted_n"])
        # A server without per-token timings: one token per chunk that carries text.
        return self._counted + (1 if choice.get("text") else 0)

    def finish(self) -> RequestTiming:
        if not self.done and not self.timing.error:
            self.timing.error = "the stream ended before [DONE]"
        return self.timing
