"""The accuracy gate of every compute path against float32, in this process:

    cbserve bench accuracy [--paths float32,int8,q4_1,q4_1+kv16] [--texts 16] [--threads 2]
    (also `python -m bench accuracy`, `make bench-accuracy`)

A path may name its KV pool's dtype after a `+` (bench/micro/kv_suffix.py): `q4_1+kv16` is
q4_1 with --kv-cache-dtype float16; without one, the pool is in the compute dtype.

- perplexity over held-out ShareGPT text (bench/accuracy/data.py), each path beside
  float32's; the gate is at most GATE_PPL_RATIO x float32's;
- greedy chat replies to 16 short questions: a reply counts as equal when its first
  REPLY_TOKENS tokens are float32's; the gate is at least GATE_REPLIES of 16.
A path passing both may be taken by `--dtype auto` (worker_svc/compute/selection.py).

Beside it, a second table scores the same texts, whole and joined, as llama.cpp's
`llama-perplexity` does (chunks of --ppl-ctx tokens, the second half of each scored,
on llama.cpp's token ids: bench/accuracy/chunks.py), for every path asked and for
llama-perplexity itself on the shipped Q4_1 GGUF. That row is left out, with the reason
printed, when `make bench-peers` has not built the binary.
Prints markdown tables (for bench/RESULTS.md) with the CPU named; `--json FILE`
writes the figures too. Exits 1 when a path asked for fails the gate.

    cbserve bench accuracy --model FILE.gguf [--reference DIR_OR_FILE] [--paths q4_1]

scores a GGUF file as it is served (by default on the path `--dtype auto` takes for it)
beside float32 on its reference model and llama.cpp on the same file: llama-perplexity's
perplexity on the same chunks, llama-server's greedy replies. The file is judged by
issue 31's targets instead of the gate (bench/accuracy/file_gate.py: within 1% of
llama-perplexity, replies at least as often equal as llama-server's); the reference is
found as bench/accuracy/reference.py says. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.accuracy.chunks import chunked_table
from bench.accuracy.file_gate import file_table, file_verdict, plan

GATE_PPL_RATIO = 1.01
REPLY_TOKENS = 12
GATE_REPLIES = 12


def _default_paths() -> list[str]:
    from worker_svc.compute.cpu_features import cpu_flags
    from worker_svc.compute.paths import PATHS

    return [n for n, p in PATHS.items() if p.missing_on_cpu(cpu_flags()) is None]


def evaluate(args) -> dict:
    import torch

    from bench.accuracy.chunks import (
        ChunkScoring,
        Estimate,
        document_ids,
        gguf_bos_id,
        llamacpp_replies,
        llamacpp_row,
        per_chunk,
    )
    from bench.accuracy.data import QUESTIONS, heldout_document, heldout_texts
    from bench.accuracy.eval import chunk_nlls, greedy_replies, perplexity
    from bench.micro.kv_suffix import split_kv_suffix
    from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer
    from worker_svc.kv_pool import kv_cache_dtype
    from worker_svc.model_loader import load_model

    torch.set_num_threads(args.threads)
    runs = args.plan
    model = runs.runs[-1][1]  # the model the paths run: the file in file mode
    tokenizer = Tokenizer(model)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, False)

    texts = heldout_texts(encode, args.texts, args.max_text_tokens)
    prompts = [tokenizer.encode_chat([ChatTurn("user", q)]) for q in QUESTIONS]
    gguf = runs.gguf
    document = heldout_document(encode, args.texts)
    scoring = ChunkScoring(args.ppl_ctx, gguf_bos_id(gguf))
    bos = [] if scoring.bos_id is None else [scoring.bos_id]
    doc_ids = document_ids(bos + encode(document), document, gguf, args.threads)
    chunks = scoring.chunks(doc_ids.ids)
    results: dict[str, dict] = {}
    for name, run_model, path_name in runs.runs:
        started = time.perf_counter()
        path, kv_name = split_kv_suffix(path_name)
        loaded = load_model(run_model, path, torch.device("cpu"))
        kv = kv_cache_dtype(kv_name, loaded.dtype, loaded.compute_path)
        ppl = perplexity(loaded, texts, kv)
        nlls = chunk_nlls(loaded, chunks, scoring.first_scored, kv)
        chunked = Estimate.from_nlls(nlls)
        replies = greedy_replies(loaded, prompts, REPLY_TOKENS, kv)
        results[name] = {
            "perplexity": ppl,
            "chunked": {**vars(chunked), "per_chunk": per_chunk(nlls, len(chunks))},
            "replies": replies,
            "seconds": time.perf_counter() - started,
            "weights": getattr(loaded.model, "qblock_source", ""),
        }
        print(
            f"# {name}: perplexity {ppl:.4f}, chunked {chunked.perplexity:.4f} "
            f"({results[name]['seconds']:.0f} s)",
            flush=True,
        )
        del loaded
    reference = results["float32"]
    for row in results.values():
        row["ratio"] = row["perplexity"] / reference["perplexity"]
        row["equal_replies"] = sum(
            a == b for a, b in zip(row["replies"], reference["replies"], strict=True)
        )
        row["passes"] = row["ratio"] <= GATE_PPL_RATIO and row["equal_replies"] >= GATE_REPLIES
        row["first_reply"] = tokenizer.decode(row["replies"][0])
    theirs = llamacpp_replies(gguf, prompts, REPLY_TOKENS, args.threads)
    if isinstance(theirs, str):
        print(f"# llama.cpp replies: left out: {theirs}", flush=True)
        llamacpp = {"skipped": theirs}
    else:
        llamacpp = {
            "replies": theirs,
            "equal_replies": sum(a == b for a, b in zip(theirs, reference["replies"], strict=True)),
            "first_reply": tokenizer.decode(theirs[0]),
        }
    report = {
        "model": model,
        "reference": runs.reference,
        "llama.cpp label": runs.llamacpp_label,
        "texts": len(texts),
        "tokens": sum(map(len, texts)),
        "paths": results,
        "llama.cpp replies": llamacpp,
        "chunked": {
            "n_ctx": scoring.n_ctx,
            "chunks": len(chunks),
            "document_tokens": len(doc_ids.ids),
            "token_ids": doc_ids.source,
            "gguf": str(gguf) if gguf else None,
            "llama.cpp": llamacpp_row(gguf, document, scoring, len(chunks), args.threads),
        },
    }
    if runs.file_mode:
        report["file"] = file_verdict(report)
    return report


def table(report: dict, threads: int) -> str:
    from worker_svc.compute.cpu_features import cpu_name

    lines = [
        f"{cpu_name()}, {threads} threads; {report['texts']} ShareGPT texts, "
        f"{report['tokens']} tokens; {len(report['paths']['float32']['replies'])} questions",
        "",
        f"| path | perplexity | vs float32 | replies = float32's first {REPLY_TOKENS} tokens "
        "| gate | reply to the first question |",
        "|---|---:|---:|---:|---|---|",
    ]
    file_mode = "file" in report
    if file_mode:
        lines[:0] = [f"float32: {report['reference']}; the other rows: {report['model']}", ""]
    for name, row in report["paths"].items():
        reply = row["first_reply"].replace("\n", " ").replace("|", "/")
        # A file is judged against llama.cpp on the same file (file_gate.py), below.
        gate = "file targets below" if file_mode else ("pass" if row["passes"] else "FAIL")
        lines.append(
            f"| {name} | {row['perplexity']:.4f} | {row['ratio']:.4f}x "
            f"| {row['equal_replies']}/{len(row['replies'])} "
            f"| {gate} | {reply} |"
        )
    theirs = report.get("llama.cpp replies", {})
    if "replies" in theirs:
        # Perplexity: llama-perplexity's scoring only (the chunked table).
        reply = theirs["first_reply"].replace("\n", " ").replace("|", "/")
        lines.append(
            f"| llama.cpp {report.get('llama.cpp label', 'Q4_1')} (llama-server, greedy) "
            "| see below | | "
            f"{theirs['equal_replies']}/{len(theirs['replies'])} | | {reply} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m bench.accuracy.gate") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument(
        "--model",
        default=None,
        help="default: the converted SmolLM2; a FILE.gguf is scored beside llama.cpp on it",
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="DIR_OR_FILE",
        help="a GGUF --model's float32 model (default: the default model's, when the file "
        "is the shipped GGUF requantized)",
    )
    parser.add_argument(
        "--paths",
        default=None,
        help="default: every path this CPU runs; for a GGUF, the one `--dtype auto` takes",
    )
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--max-text-tokens", type=int, default=384)
    parser.add_argument(
        "--ppl-ctx", type=int, default=512, help="llama-perplexity's chunk size (its -c)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    from common.defaults import default_model_path, packaged_gguf_path

    try:
        args.plan = plan(
            args.model,
            args.reference,
            args.paths.split(",") if args.paths else None,
            packaged_gguf_path(),
            default_model_path(),
            _default_paths,
        )
    except ValueError as error:
        parser.error(str(error))
    report = evaluate(args)
    print(table(report, args.threads))
    print()
    print(chunked_table(report))
    if args.plan.file_mode:
        print()
        print(file_table(report, REPLY_TOKENS))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.plan.file_mode:
        return 0 if all(row["passes"] is not False for row in report["file"].values()) else 1
    asked = [name for name, _, _ in args.plan.runs if name != "float32"]
    return 0 if all(report["paths"][p]["passes"] for p in asked) else 1


if __name__ == "__main__":
    sys.exit(main())
