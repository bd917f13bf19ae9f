"""The speculation benchmark's workloads: one where n-gram drafts are found, one where
few are, and chat as the control (issue 32, item 6).

- `edit`: a function of Python's standard library with one typo put in (a local name
  with two letters swapped at its first use), and the instruction to fix it and return
  the function. The right answer is the prompt's code again, so prompt lookup finds
  most of the reply in the prompt, as in vLLM's InstructCoder and Blazedit sets.
  Greedy, SmolLM2-135M-Instruct copies most of the function back (and rarely fixes
  the typo, which the benchmark does not need); the wording was chosen for that: the
  code before the instruction and a system turn asking for code only copy best.
- `summarize`: a docstring of the standard library (prose) after "Summarize:": the
  reply reuses a few phrases of the prompt.
- `chat`: ShareGPT's first human turns, sampled as the serving benchmark samples them
  (bench.harness.sharegpt): replies repeat little of the prompt.

Every prompt is a chat rendered with the model's own template by the scheduler's
tokenizer, and sent as token ids, so the lengths counted here are what is served.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.harness import sharegpt, source_texts
from bench.harness.workload import BenchRequest, _request_seeds

WORKLOADS = ("edit", "summarize", "chat")
EDIT_SYSTEM = (
    "You are a careful code editor. You reply with the complete edited code and nothing else."
)
# The reply is the function in a code block, perhaps with a sentence after it.
EDIT_SLACK_TOKENS = 32
SUMMARY_TOKENS = 128


def misspell(word: str) -> str:
    """A typo a person makes: the second and third letters swapped (`key` -> `kye`);
    a word whose swap changes nothing gets its last letter doubled."""
    swapped = word[0] + word[2] + word[1] + word[3:]
    return swapped if swapped != word else word + word[-1]


def code_block(code: str) -> str:
    return f"```python\n{code}\n```"


def edit_messages(function: source_texts.SourceFunction) -> tuple[list[dict], str]:
    """The chat that asks to fix the typo, and the reply that fixes it (the code block
    of the function as it is in its file)."""
    typo = misspell(function.variable)
    broken = re.sub(rf"\b{re.escape(function.variable)}\b", typo, function.code, count=1)
    user = (
        f"{code_block(broken)}\n\nFix the typo in the function above "
        f"(`{typo}` should be `{function.variable}`). Return the corrected function only."
    )
    messages = [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": user}]
    return messages, code_block(function.code)


def summarize_messages(doc: source_texts.Docstring) -> list[dict]:
    return [{"role": "user", "content": f"Summarize:\n\n{doc.text}"}]


class ChatEncoder:
    """Chats to token ids through the model's chat template (the scheduler's tokenizer:
    no torch), and replies to the token count a model would generate for them."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from scheduler_svc.api.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(tokenizer_dir)

    def chat(self, messages: list[dict]) -> list[int]:
        from scheduler_svc.api.tokenizer import ChatTurn

        return self.tokenizer.encode_chat([ChatTurn(m["role"], m["content"]) for m in messages])

    def reply_len(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def _cap(tokens: int, max_output_tokens: int | None) -> int:
    return tokens if max_output_tokens is None else min(tokens, max_output_tokens)


def edit_requests(
    num_prompts: int, seed: int, encoder: ChatEncoder, max_output_tokens: int | None
) -> list[BenchRequest]:
    seeds = _request_seeds(seed, num_prompts)
    requests = []
    for index, function in enumerate(source_texts.stdlib_functions(num_prompts, seed)):
        messages, answer = edit_messages(function)
        room = encoder.reply_len(answer) + EDIT_SLACK_TOKENS
        requests.append(
            BenchRequest(index, encoder.chat(messages), _cap(room, max_output_tokens), seeds[index])
        )
    return requests


def summarize_requests(
    num_prompts: int, seed: int, encoder: ChatEncoder, max_output_tokens: int | None
) -> list[BenchRequest]:
    seeds = _request_seeds(seed, num_prompts)
    docs = source_texts.docstrings(num_prompts, seed)
    return [
        BenchRequest(
            index,
            encoder.chat(summarize_messages(doc)),
            _cap(SUMMARY_TOKENS, max_output_tokens),
            seeds[index],
        )
        for index, doc in enumerate(docs)
    ]


def chat_requests(
    num_prompts: int,
    seed: int,
    encoder: ChatEncoder,
    max_output_tokens: int | None,
    conversations: list[dict] | None = None,
) -> list[BenchRequest]:
    """ShareGPT pairs as the serving benchmark samples them, the prompt sent as a chat."""

    def encode(text: str, is_prompt: bool) -> list[int]:
        if is_prompt:
            return encoder.chat([{"role": "user", "content": text}])
        return encoder.tokenizer.encode(text, add_special_tokens=False)

    if conversations is None:
        conversations = sharegpt.load_conversations()
    pairs = sharegpt.sample_pairs(conversations, encode, num_prompts, seed, max_output_tokens)
    seeds = _request_seeds(seed, num_prompts)
    return [
        BenchRequest(index, pair.prompt_token_ids, pair.max_tokens, seeds[index])
        for index, pair in enumerate(pairs)
    ]


def make_requests(
    workload: str,
    num_prompts: int,
    seed: int,
    tokenizer_dir: Path,
    max_output_tokens: int | None,
) -> list[BenchRequest]:
    """The same list for the same arguments on the same Python (source texts vary by
    version: source_texts.python_version())."""
    builders = {"edit": edit_requests, "summarize": summarize_requests, "chat": chat_requests}
    if workload not in builders:
        raise ValueError(f"unknown workload {workload!r}; choose from {WORKLOADS}")
    encoder = ChatEncoder(tokenizer_dir)
    return builders[workload](num_prompts, seed, encoder, max_output_tokens)
