"""The benchmark's requests: ShareGPT pairs or random token ids, the same for every system.

Every system in one run (cbserve, its `--batching static` baseline, transformers'
generate) is given this one list, so that their numbers compare like for like.
Prompts are sent as `prompt_token_ids`, so the lengths counted here are exactly the
lengths the server and the baselines process.

`--dataset random` follows vLLM's random dataset in spirit: prompt and output lengths
drawn uniformly from the given ranges, prompt tokens drawn uniformly from the
vocabulary (special tokens left out), so that no two prompts share a prefix.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import sharegpt

DATASETS = ("sharegpt", "random")
# The old bench.harness.workload's lengths: short prompts, outputs up to the 256 cap.
RANDOM_INPUT_LEN = (16, 128)
RANDOM_OUTPUT_LEN = (16, 256)


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_token_ids: list[int]
    max_tokens: int
    # Per-request sampling seed: a run at temperature > 0 is repeatable too.
    seed: int
    # The LoRA adapter the request names (gRPC lora_name, HTTP model); "": the base.
    # Set by --lora-modules (bench/harness/lora_assignment.py).
    lora_name: str = ""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def parse_range(text: str) -> tuple[int, int]:
    """`128` or `16:128` (inclusive); used by --random-input-len/--random-output-len."""
    low, _, high = text.partition(":")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"expected N or LOW:HIGH, got {text!r}") from None
    if bounds[0] < 1 or bounds[0] > bounds[1]:
        raise ValueError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return bounds


def _request_seeds(seed: int, count: int) -> list[int]:
    # A stream of its own, so that the seeds do not move when sampling changes.
    rng = random.Random(f"request-seeds-{seed}")
    return [rng.randrange(2**31) for _ in range(count)]


def random_requests(
    num_prompts: int,
    seed: int,
    vocab_ids: list[int],
    input_len: tuple[int, int] = RANDOM_INPUT_LEN,
    output_len: tuple[int, int] = RANDOM_OUTPUT_LEN,
) -> list[BenchRequest]:
    rng = random.Random(seed)
    seeds = _request_seeds(seed, num_prompts)
    requests = []
    for index in range(num_prompts):
        length = rng.randint(*input_len)
        requests.append(
            BenchRequest(
                index=index,
                prompt_token_ids=[rng.choice(vocab_ids) for _ in range(length)],
                max_tokens=rng.randint(*output_len),
                seed=seeds[index],
            )
        )
    return requests


def sharegpt_requests(
    num_prompts: int,
    seed: int,
    tokenizer,
    max_output_tokens: int | None,
    conversations: list[dict] | None = None,
) -> list[BenchRequest]:
    if conversations is None:
        conversations = sharegpt.load_conversations()
    pairs = sharegpt.sample_pairs(
        conversations,
        lambda text, special: tokenizer.encode(text, add_special_tokens=special),
        num_prompts,
        seed,
        max_output_tokens,
    )
    seeds = _request_seeds(seed, num_prompts)
    return [
        BenchRequest(index, pair.prompt_token_ids, pair.max_tokens, seeds[index])
        for index, pair in enumerate(pairs)
    ]


def make_workload(
    dataset: str,
    num_prompts: int,
    seed: int,
    tokenizer_dir: Path,
    *,
    max_output_tokens: int | None = None,
    input_len: tuple[int, int] = RANDOM_INPUT_LEN,
    output_len: tuple[int, int] = RANDOM_OUTPUT_LEN,
) -> list[BenchRequest]:
    """The same list for the same arguments, on any machine."""
    # The scheduler's own tokenizer class: the benchmark counts tokens as the server
    # does, and never imports torch for it.
    from scheduler_svc.api.tokenizer import Tokenizer

    tokenizer = Tokenizer(tokenizer_dir)
    if dataset == "sharegpt":
        return sharegpt_requests(num_prompts, seed, tokenizer, max_output_tokens)
    if dataset == "random":
        special = tokenizer.special_token_ids
        vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
        return random_requests(num_prompts, seed, vocab, input_len, output_len)
    raise ValueError(f"unknown dataset {dataset!r}; choose from {DATASETS}")


def describe(requests: list[BenchRequest], dataset: str, seed: int, **settings) -> dict:
    """What a result file records about its workload, so runs can be compared."""
    prompt_lens = [r.prompt_len for r in requests]
    output_lens = [r.max_tokens for r in requests]
    return {
        "dataset": dataset,
        "num_prompts": len(requests),
        "seed": seed,
        **settings,
        "prompt_len_min_max": [min(prompt_lens), max(prompt_lens)] if requests else [],
        "output_len_min_max": [min(output_lens), max(output_lens)] if requests else [],
        "total_prompt_tokens": sum(prompt_lens),
        "total_output_tokens": sum(output_lens),
    }


def as_dicts(requests: list[BenchRequest]) -> list[dict]:
    return [asdict(r) for r in requests]
