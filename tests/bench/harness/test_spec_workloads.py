"""The speculation benchmark's workloads: real standard-library text, chosen the same way
every time, turned into chats whose edit replies repeat the prompt."""

from __future__ import annotations

import ast
import re

import pytest

from bench.harness import source_texts, spec_workloads


def test_functions_are_real_parsable_code_chosen_by_the_seed():
    first = source_texts.stdlib_functions(20, seed=0)
    assert first == source_texts.stdlib_functions(20, seed=0)
    assert first != source_texts.stdlib_functions(20, seed=1)
    assert len({(f.module, f.name, f.code) for f in first}) == 20
    for function in first:
        ast.parse(function.code)  # a whole definition, dedented as in its file
        low, high = source_texts.FUNCTION_LINES
        assert low <= function.code.count("\n") + 1 <= high
        assert re.search(rf"\b{function.variable}\b", function.code)
        path = source_texts._source_path(function.module)
        assert function.code.splitlines()[0].strip() in path.read_text()


def test_a_smaller_sample_is_the_start_of_a_larger_one():
    # Runs at 1 and at 64 streams send the same first prompts.
    assert source_texts.stdlib_functions(64, 0)[:8] == source_texts.stdlib_functions(8, 0)
    assert source_texts.docstrings(64, 0)[:8] == source_texts.docstrings(8, 0)


def test_docstrings_are_prose_from_the_library_within_the_length_bounds():
    docs = source_texts.docstrings(30, seed=0)
    assert docs == source_texts.docstrings(30, seed=0)
    for doc in docs:
        low, high = source_texts.DOCSTRING_CHARS
        assert low <= len(doc.text) <= high
        module = doc.owner.split(".")[0]
        first_line = doc.text.splitlines()[0].strip()
        assert first_line in source_texts._source_path(module).read_text()


@pytest.mark.parametrize(
    ("word", "typo"), [("key", "kye"), ("lastline", "lsatline"), ("seen", "seenn")]
)
def test_misspell_swaps_two_letters_or_doubles_the_last(word, typo):
    assert spec_workloads.misspell(word) == typo


def test_the_edit_prompt_holds_the_code_with_one_typo_and_the_answer_is_the_code():
    function = source_texts.SourceFunction(
        "m", "f", "def f(key):\n    key = key + 1\n    return key", "key"
    )
    messages, answer = spec_workloads.edit_messages(function)
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "def f(kye):\n    key = key + 1\n    return key" in user
    assert "`kye` should be `key`" in user
    assert answer == "```python\ndef f(key):\n    key = key + 1\n    return key\n```"


def _found_by_lookup(context: list[int], reply: list[int], n: int = 3) -> float:
    """The share of reply tokens an n-gram proposer could draft: those whose n - 1
    preceding tokens, with them, occurred earlier in prompt + reply."""
    hits = 0
    for i in range(n - 1, len(reply)):
        text = context + reply[:i]
        gram = reply[i - n + 1 : i + 1]
        hits += any(text[j : j + n] == gram for j in range(len(text) - n + 1))
    return hits / max(1, len(reply) - n + 1)


def test_edit_requests_are_chats_whose_answer_is_mostly_in_the_prompt(model_dir, tokenizer):
    requests = spec_workloads.make_requests("edit", 6, 0, model_dir, max_output_tokens=1000)
    functions = source_texts.stdlib_functions(6, 0)
    assert requests == spec_workloads.make_requests("edit", 6, 0, model_dir, 1000)
    for request, function in zip(requests, functions, strict=True):
        text = tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        assert text.startswith("<|im_start|>system\n" + spec_workloads.EDIT_SYSTEM)
        assert text.endswith("<|im_start|>assistant\n")
        _, answer = spec_workloads.edit_messages(function)
        answer_ids = tokenizer.encode(answer, add_special_tokens=False)
        assert request.max_tokens == len(answer_ids) + spec_workloads.EDIT_SLACK_TOKENS
        # The workload's point: prompt lookup finds nearly all of the right reply.
        assert _found_by_lookup(request.prompt_token_ids, answer_ids) > 0.9


def test_max_output_tokens_caps_every_workload(model_dir):
    for workload in ("edit", "summarize"):
        requests = spec_workloads.make_requests(workload, 4, 0, model_dir, max_output_tokens=50)
        assert {r.max_tokens for r in requests} == {50}


def test_summarize_requests_ask_for_a_summary_of_a_docstring(model_dir, tokenizer):
    requests = spec_workloads.make_requests("summarize", 3, 0, model_dir, None)
    for request, doc in zip(requests, source_texts.docstrings(3, 0), strict=True):
        text = tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        assert f"<|im_start|>user\nSummarize:\n\n{doc.text}<|im_end|>" in text
        assert request.max_tokens == spec_workloads.SUMMARY_TOKENS


def test_chat_requests_send_sharegpt_prompts_through_the_template(model_dir, tokenizer):
    prompt = "Write a limerick about a cat who learns to code in Python, please."
    reply = "There once was a cat in a hat, who typed on a keyboard quite flat."
    conversations = [
        {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}
    ]
    encoder = spec_workloads.ChatEncoder(model_dir)
    (request,) = spec_workloads.chat_requests(1, 0, encoder, 8, conversations)
    assert request.prompt_token_ids == encoder.chat([{"role": "user", "content": prompt}])
    assert request.max_tokens == 8  # the reply's length, capped


def test_an_unknown_workload_is_refused(model_dir):
    with pytest.raises(ValueError, match="unknown workload"):
        spec_workloads.make_requests("translate", 1, 0, model_dir, None)
