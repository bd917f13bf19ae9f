"""The served tokenizer as the null worker reads it, without transformers.

The null worker needs three things of the tokenizer: its size, the ids transformers
calls special (the named special tokens of tokenizer_config.json, and its extra ones),
and each id's text alone. Importing transformers for them cost about 2 s of CPU at
every null worker start (the scheduler benchmark starts several, the test suite a
dozen), so a directory whose tokenizer is a plain `tokenizers` file is read here with
the `tokenizers` library, the one transformers itself decodes with.

Only what is understood is read: a tokenizer.json beside a tokenizer_config.json
whose class is transformers' plain fast tokenizer, without a cleanup of spaces or
added tokens of its own. Anything else makes `read_tokenizer_files` return None and
the caller asks transformers' AutoTokenizer, as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# transformers' named special tokens (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES).
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
EXTRA_SPECIAL_TOKENS = ("extra_special_tokens", "additional_special_tokens")
# The classes whose tokenizer is tokenizer.json as it is: a model-specific class may
# rebuild its normalizer or decoder at load, which only transformers knows how to do.
PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


@dataclass(frozen=True)
class TokenizerFiles:
    """The members of a transformers tokenizer that sampler.ordinary_token_ids and
    the null worker read, with the same meaning."""

    backend: Tokenizer
    all_special_ids: tuple[int, ...]
    eos_token_id: int | None

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def batch_decode(self, sequences: list[list[int]]) -> list[str]:
        return self.backend.decode_batch(sequences, skip_special_tokens=False)


def read_tokenizer_files(directory: Path) -> TokenizerFiles | None:
    """The directory's tokenizer, or None when it is not one this reader fully
    understands (see the module's docstring). Raises ValueError (or OSError) for
    files it should read but cannot."""
    tokenizer_file = directory / "tokenizer.json"
    config_file = directory / "tokenizer_config.json"
    if not (directory.is_dir() and tokenizer_file.is_file() and config_file.is_file()):
        return None
    config = json.loads(config_file.read_text())
    if not isinstance(config, dict) or config.get("tokenizer_class") not in PLAIN_CLASSES:
        return None
    if config.get("clean_up_tokenization_spaces") or config.get("added_tokens_decoder"):
        return None
    special = _special_tokens(config)
    if special is None:
        return None
    backend = Tokenizer.from_file(str(tokenizer_file))
    ids = [backend.token_to_id(token) for token in special]
    if None in ids:  # transformers would map it to the unknown token, or add it
        return None
    eos = _token_text(config.get("eos_token"))
    return TokenizerFiles(
        backend=backend,
        all_special_ids=tuple(ids),
        eos_token_id=None if eos is None else backend.token_to_id(eos),
    )


def _special_tokens(config: dict[str, Any]) -> list[str] | None:
    """The special tokens' texts, each once, in transformers' order; None for a form of
    them this reader does not know."""
    texts: list[str] = []
    for name in NAMED_SPECIAL_TOKENS:
        value = config.get(name)
        if value is not None and (text := _token_text(value)) is None:
            return None
        texts += [text] if value is not None else []
    for name in EXTRA_SPECIAL_TOKENS:
        extra = config.get(name) or []
        values: Iterable[Any] = extra.values() if isinstance(extra, dict) else extra
        if not isinstance(extra, list | dict):
            return None
        for value in values:
            if (text := _token_text(value)) is None:
                return None
            texts.append(text)
    return list(dict.fromkeys(texts))


def _token_text(value: Any) -> str | None:
    # A special token is a string, or an AddedToken written as a dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
