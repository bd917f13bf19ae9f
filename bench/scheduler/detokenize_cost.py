"""Per-token cost of incremental detokenization: cbserve's IncrementalDetokenizer
against tokenizers' DecodeStream, on the default model's tokenizer.

    .venv/bin/python -m bench.scheduler.detokenize_cost [--repeats 5] [--text-file README.md]

Both get the same prompt context (the last few prompt ids) and never see skipped
special tokens, so only the decoding differs; both outputs are checked against a
plain decode of all ids. Then the two cases where they differ: a run of skipped
EOS tokens (ignore_eos) given to each as it comes, and a prompt that ends inside a
character. scheduler_svc/output/detokenizer.py says why it keeps its own code.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from common.defaults import REPO_ROOT, converted_model_dir
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.output.detokenizer import PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer

PROMPT = "Write something long:"
MIXED = " 日本語のテキストを書きます。🚀🎉 Привет мир 👨‍👩‍👧 café — “quotes” 𝕏" * 60


def stream_with_decode_stream(hf: HFTokenizer, prompt: list[int], ids: list[int]) -> str:
    stream = DecodeStream(prompt[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens=True)
    return "".join(stream.step(hf, token_id) or "" for token_id in ids)


def stream_with_ours(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> str:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    return "".join(detokenizer.add_token(token_id) for token_id in ids)


def best_seconds(run, repeats: int, expected: str) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        text = run()
        best = min(best, time.perf_counter() - started)
        assert text == expected, "the deltas do not add up to the full decode"
    return best


def differences(tokenizer: Tokenizer, hf: HFTokenizer, eos_run: int) -> None:
    eos = tokenizer.eos_token_ids[0]
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    stream = DecodeStream(prompt[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens=True)
    started = time.perf_counter()
    for _ in range(eos_run):
        stream.step(hf, eos)
    theirs = time.perf_counter() - started
    started = time.perf_counter()
    stream_with_ours(tokenizer, prompt, [eos] * eos_run)
    ours = time.perf_counter() - started
    print(
        f"{eos_run} EOS in a row: IncrementalDetokenizer {ours:.3f} s, DecodeStream {theirs:.3f} s"
    )
    cut = tokenizer.encode("Look: 🤗", add_special_tokens=False)[:-1]  # ends mid-emoji
    reply = tokenizer.encode(" ok", add_special_tokens=False)
    print(
        f"prompt ending mid-character, reply ' ok': IncrementalDetokenizer "
        f"{stream_with_ours(tokenizer, cut, reply)!r}, "
        f"DecodeStream {stream_with_decode_stream(hf, cut, reply)!r}"
    )


def main(
    argv: list[str] | None = None, prog: str = "python -m bench.scheduler.detokenize_cost"
) -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--text-file", type=Path, default=REPO_ROOT / "README.md")
    parser.add_argument("--eos-run", type=int, default=8000)
    args = parser.parse_args(argv)
    model_dir = converted_model_dir()
    tokenizer = Tokenizer(model_dir)
    hf = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    texts = {args.text_file.name: args.text_file.read_text(), "CJK + emoji": MIXED}
    for name, text in texts.items():
        ids = tokenizer.encode(text, add_special_tokens=False)
        expected = tokenizer.decode(ids)
        runs = {
            "IncrementalDetokenizer": functools.partial(stream_with_ours, tokenizer, prompt, ids),
            "DecodeStream": functools.partial(stream_with_decode_stream, hf, prompt, ids),
        }
        for label, run in runs.items():
            seconds = best_seconds(run, args.repeats, expected)
            print(
                f"{name:12s} {len(ids):6d} tokens  {label:22s} "
                f"{seconds / len(ids) * 1e6:6.2f} us/token (best of {args.repeats})",
                flush=True,
            )
    differences(tokenizer, hf, args.eos_run)


if __name__ == "__main__":
    main()
