"""Prompts of very different lengths for the end-to-end tests."""

from __future__ import annotations

from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer

_PASSAGE = (
    "The history of the river begins in the mountains, where snow melts each spring and feeds a "
    "hundred small streams. They join in the valley below, turning mills and watering orchards, "
    "until the water reaches the old stone bridge that the town built four centuries ago. "
    "Merchants once crossed it with wagons of wool and salt; today it carries bicycles, school "
    "children and the occasional tractor. "
)

_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child in two sentences.",
    "List three uses of a paperclip.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and German.",
]


def mixed_prompts(tokenizer: Tokenizer, count: int = 16) -> list[list[int]]:
    """`count` prompts of distinct lengths, from a few tokens to a few hundred,
    plain and chat-formatted."""
    words = (_PASSAGE * 4).split()
    prompts: list[list[int]] = []
    for index in range(count):
        question = _QUESTIONS[index % len(_QUESTIONS)]
        # 17 more words each time: every prompt has its own length.
        context = " ".join(words[: 17 * index])
        if index % 3 == 0:
            turn = ChatTurn("user", f"{context}\n{question}".strip())
            prompts.append(tokenizer.encode_chat([turn]))
        else:
            prompts.append(tokenizer.encode(f"{context}\nQuestion {index}: {question}\nAnswer:"))
    return prompts
