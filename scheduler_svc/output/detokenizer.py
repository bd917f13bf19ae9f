"""Incremental detokenization: output text one token at a time, never a broken character.

Decoding a lone token is wrong in two ways: a character whose UTF-8 bytes span
several tokens (emoji, much of CJK) decodes to U+FFFD pieces, and decoders that
strip or add a leading space need the token's left context. So, as vLLM does,
each new token is decoded inside a short window of the ids before it and only
the difference to that window's text without it is emitted; while the window's
text ends in U+FFFD the character is incomplete and nothing is emitted. The
offsets advance only when text is emitted, so the held bytes are decoded again
together with the tokens that complete them.

The window starts on the last few prompt tokens so that the first output
token's leading space decodes as it would in the middle of the text.
"""

# Why not tokenizers.decoders.DecodeStream (tokenizers 0.23.3), which runs this
# same window in Rust: `cbserve bench detokenize-cost` measured it at 0.9 us a
# token against 2.3-2.6 here: about 0.1 ms saved on a 64-sequence decode step,
# which takes 326 ms on the development CPU (bench/micro/measure_dtype.py). And it
# does not keep two behaviours:
# - A prompt that ends inside a character (token-id prompts may): its window
#   text ends in U+FFFD, so DecodeStream keeps no prefix and its first output
#   repeats the prompt's tail and the broken character ("Look: \ufffd ok" where
#   this class emits " ok"; test_prompt_ending_inside_a_character pins it).
# - Skipped special tokens: DecodeStream keeps them in its window (the text does
#   not grow, so the window is never cut), so each step of a run of EOS under
#   ignore_eos decodes the whole run: 8000 in a row took 1.4 s, 0.001 s here.
#   They would still have to be dropped before it, and the test that pins that
#   (test_a_long_run_of_skipped_tokens_does_not_grow_the_window) watches the
#   decode calls, which DecodeStream makes in Rust on a real tokenizers.Tokenizer
#   only: that test could no longer fail.

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHARACTER = "\ufffd"
# Prompt tokens in the first window: enough left context for any decoder's
# spacing rules, few enough to keep every decode cheap.
PROMPT_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    special_token_ids: frozenset[int]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Skipped ids never reach the decoder (it filters them before decoding), so
        # leaving them out of the window changes no text. It keeps a run of them
        # (EOS after EOS under ignore_eos) from growing the window without bound.
        self._skipped_ids = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        # Only the ids from the window's start on are kept: older ones never matter again.
        self._window_ids = self._without_skipped(prompt_token_ids)[-PROMPT_CONTEXT_TOKENS:]
        # _window_ids[:_read_offset] is already emitted (or is prompt): the context
        # whose text each new decode is compared to.
        self._read_offset = len(self._window_ids)

    def add_token(self, token_id: int) -> str:
        """Returns the text this token completes; "" while a character is incomplete."""
        if token_id in self._skipped_ids:
            return ""
        self._window_ids.append(token_id)
        context_text = self._decode(self._window_ids[: self._read_offset])
        full_text = self._decode(self._window_ids)
        if len(full_text) <= len(context_text) or full_text.endswith(REPLACEMENT_CHARACTER):
            # Nothing new yet, or bytes still waiting for the rest of their character.
            return ""
        new_text = full_text[len(context_text) :]
        # The next window starts where this one's new part began.
        del self._window_ids[: self._read_offset]
        self._read_offset = len(self._window_ids)
        return new_text

    def _without_skipped(self, token_ids: Sequence[int]) -> list[int]:
        return [token_id for token_id in token_ids if token_id not in self._skipped_ids]

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
