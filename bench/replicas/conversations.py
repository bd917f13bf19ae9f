"""Multi-turn chat conversations over the OpenAI API: each turn sends the whole
conversation so far (its system prompt, every earlier user turn and reply), as chat
clients do, so that turn k+1's prompt starts with turn k's prompt and reply.

Each conversation has a system prompt of its own (random words, seeded), so that what
one replica caches for it helps no other conversation: cached prompt tokens measure
whether the router sends a conversation's next turn where its earlier turns ran.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

# Plain English words: each tokenizes to a token or two, with no surprises.
_WORDS = [
    "river",
    "stone",
    "garden",
    "window",
    "paper",
    "silver",
    "morning",
    "travel",
    "market",
    "engine",
    "quiet",
    "orange",
    "simple",
    "letter",
    "bridge",
    "winter",
    "forest",
    "music",
    "number",
    "yellow",
    "summer",
    "castle",
    "planet",
    "doctor",
    "pencil",
    "circle",
    "animal",
    "basket",
    "button",
    "candle",
    "dinner",
    "famous",
    "hollow",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "marble",
    "narrow",
    "office",
    "pocket",
    "rabbit",
    "saddle",
    "ticket",
    "valley",
    "wagon",
]


@dataclass(frozen=True)
class TurnResult:
    conversation: int
    turn: int
    ok: bool
    status: int  # HTTP status; 0 when no answer came (connection error, timeout)
    error: str
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def system_prompt(seed: int, conversation: int, words: int) -> str:
    rng = random.Random(f"{seed}/{conversation}/system")
    # The conversation's own words come first, so its very first KV block is its own.
    return f"{_words(rng, words)}. You are assistant number {conversation}."


async def _one_turn(session, url: str, model: str, messages: list[dict], max_tokens: int,
                    timeout_s: float) -> tuple[int, dict | None, str]:  # fmt: skip
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0}  # fmt: skip
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(timeout_s)) as r:
            text = await r.text()
            if r.status != 200:
                return r.status, None, text[:200]
            return r.status, await r.json(content_type=None), ""
    except asyncio.TimeoutError:
        return 0, None, f"no answer within {timeout_s:g}s (hung)"
    except aiohttp.ClientError as error:
        return 0, None, f"{type(error).__name__}: {error}"


async def _conversation(session, url, model, index, config, on_turn) -> list[TurnResult]:
    seed, turns, timeout_s = config["seed"], config["turns"], config["timeout_s"]
    rng = random.Random(f"{seed}/{index}/user")
    messages = [{"role": "system", "content": system_prompt(seed, index, config["system_words"])}]
    results = []
    for turn in range(turns):
        messages.append({"role": "user", "content": _words(rng, config["user_words"]) + "?"})
        started = time.monotonic()
        status, reply, error = await _one_turn(
            session, url, model, messages, config["max_tokens"], timeout_s
        )
        latency = time.monotonic() - started
        if reply is None:
            results.append(TurnResult(index, turn, False, status, error, latency))
            on_turn(results[-1])
            break  # the conversation cannot go on without the reply
        usage = reply.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        content = reply["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": content})
        results.append(TurnResult(index, turn, True, status, "", latency,
                                  usage.get("prompt_tokens", 0), cached))  # fmt: skip
        on_turn(results[-1])
    return results


async def run_conversations(
    base_url: str,
    model: str,
    *,
    conversations: int,
    turns: int,
    concurrency: int,
    system_words: int,
    user_words: int,
    max_tokens: int,
    timeout_s: float,
    seed: int,
    on_turn: Callable[[TurnResult], None] = lambda result: None,
) -> list[TurnResult]:
    """Every conversation, `concurrency` at a time; the results of every turn sent."""
    config = {"seed": seed, "turns": turns, "timeout_s": timeout_s, "max_tokens": max_tokens,
              "system_words": system_words, "user_words": user_words}  # fmt: skip
    url = base_url.rstrip("/") + "/v1/chat/completions"
    gate = asyncio.Semaphore(concurrency)
    # One connection per conversation in flight; a reset one is not reused.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def gated(index: int) -> list[TurnResult]:
            async with gate:
                return await _conversation(session, url, model, index, config, on_turn)

        done = await asyncio.gather(*(gated(index) for index in range(conversations)))
    return [result for results in done for result in results]
