"""Incremental detokenization with the real SmolLM2 tokenizer (byte-level BPE)."""

from __future__ import annotations

import pytest

from scheduler_svc.output.detokenizer import REPLACEMENT_CHARACTER, IncrementalDetokenizer

from .harness import EOS, encode

MULTI_BYTE_TEXTS = [
    " 🤗",
    " hello 🚀🎉 world",
    " 日本語のテキスト",
    " Ça va? naïve café — “quotes” 𝕏",
    " 👨‍👩‍👧 family",
    " Привет мир",
]


def _stream(tokenizer, prompt_ids, output_ids) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detokenizer.add_token(token_id) for token_id in output_ids]


def test_emoji_split_over_three_tokens_is_emitted_whole_on_the_last(tokenizer):
    ids = encode(" 🤗")
    assert len(ids) == 3
    # Each piece alone is a broken character: that is what this test is about.
    assert all(REPLACEMENT_CHARACTER in tokenizer.decode([token_id]) for token_id in ids)
    assert _stream(tokenizer, encode("Hi"), ids) == ["", "", " 🤗"]


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
def test_deltas_concatenate_to_the_full_decode_and_never_hold_a_broken_character(tokenizer, text):
    ids = encode(text)
    deltas = _stream(tokenizer, encode("Say something:"), ids)
    assert not any(REPLACEMENT_CHARACTER in delta for delta in deltas)
    assert "".join(deltas) == tokenizer.decode(ids) == text


def test_first_output_token_keeps_its_leading_space(tokenizer):
    assert _stream(tokenizer, encode("Hello"), encode(" world!")) == [" world", "!"]


def test_special_tokens_are_skipped(tokenizer):
    deltas = _stream(tokenizer, encode("Hello"), [*encode(" world"), EOS, *encode(" again")])
    assert deltas == [" world", "", " again"]


def test_prompt_ending_in_special_tokens(tokenizer):
    chat_prompt = tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert EOS in chat_prompt
    assert "".join(_stream(tokenizer, chat_prompt, encode("Hello there"))) == "Hello there"


def test_a_character_left_incomplete_is_never_emitted(tokenizer):
    # The generation ends (say at max_tokens) in the middle of an emoji.
    ids = encode(" ok 🤗")[:-1]
    assert "".join(_stream(tokenizer, encode("Hi"), ids)) == " ok"


def test_prompt_ending_inside_a_character(tokenizer):
    # A token-id prompt may stop mid-emoji: its tail is never repeated in the output,
    # and the character it leaves broken is not emitted either.
    prompt = encode("Look: 🤗")[:-1]
    assert REPLACEMENT_CHARACTER in tokenizer.decode(prompt)
    assert "".join(_stream(tokenizer, prompt, encode(" ok"))) == " ok"


def test_single_token_prompt(tokenizer):
    assert _stream(tokenizer, [EOS], encode(" a b")) == [" a", " b"]


class _RecordingDecoder:
    """The real tokenizer, noting the longest id list it was asked to decode."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.special_token_ids = tokenizer.special_token_ids
        self.longest = 0

    def decode(self, token_ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(token_ids))
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def test_a_long_run_of_skipped_tokens_does_not_grow_the_window(tokenizer):
    decoder = _RecordingDecoder(tokenizer)
    deltas = _stream(decoder, encode("Hello"), [EOS] * 500 + encode(" again"))
    assert "".join(deltas) == " again"
    assert decoder.longest <= 8


def test_special_tokens_are_kept_when_not_skipped(tokenizer):
    detokenizer = IncrementalDetokenizer(tokenizer, encode("Hi"), skip_special_tokens=False)
    assert detokenizer.add_token(EOS) == "<|im_end|>"
